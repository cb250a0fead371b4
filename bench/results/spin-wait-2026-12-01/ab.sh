#!/bin/bash
# The spin-wait A/B of 2026-12-01 (docs/benchmarks.md, "Waiting awake for same-host answers").
# Run from the repository root after a build: bash bench/results/spin-wait-2026-12-01/ab.sh
set -u
OUT=bench/results/spin-wait-2026-12-01
BIN=build/bin
fp(){ python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
gcc -O2 -o /tmp/pingpong $OUT/pingpong.c -lpthread
$BIN/granary-bench limits --seconds 0.3 --json $OUT/limits.json > $OUT/limits.txt 2>&1
for r in 1 2 3; do  # loopback ping-pong, 64 B and 64 KiB answers, sleeping vs spinning client
  for tcp in 0 1; do for spin in 0 50; do /tmp/pingpong $tcp $spin 64; done; done
  /tmp/pingpong 1 0 65536; /tmp/pingpong 1 50 65536
done > $OUT/pingpong.txt
kv() {  # kv bench against a fresh master, node and memcached; $1: spin, $2: tag, rest: kv args
  local spin=$1 tag=$2; shift 2
  local P=$(fp) H=$(fp) M=$(fp)
  $BIN/granary-master --host 127.0.0.1 --port $P --http-port $H --log-level warn >/dev/null 2>&1 & local MP=$!
  sleep 0.5
  $BIN/granary-node --master 127.0.0.1:$P --segment-size 2GiB --prefault --name ab$$ --log-level warn >/dev/null 2>&1 & local NP=$!
  memcached -l 127.0.0.1 -p $M -U 0 -I 32m -m 2048 -t 2 -u root & local CP=$!
  sleep 4
  GRANARY_SPIN_WAIT_US=$spin $BIN/granary-bench kv --limits-json $OUT/limits.json --master 127.0.0.1:$P \
    --memcached 127.0.0.1:$M --targets granary-tcp,memcached --clients 1 --json $OUT/kv-$tag.json "$@" \
    > $OUT/kv-$tag.txt 2>&1
  kill $NP $MP $CP; wait $NP $MP $CP 2>/dev/null
}
py() {  # python_bench against a fresh standalone node; $1: spin, $2: tag
  local P=$(fp)
  $BIN/granary-node --standalone --master-port $P --segment-size 4GiB --prefault --name py$$ --log-level warn >/dev/null 2>&1 & local NP=$!
  sleep 10
  GRANARY_SPIN_WAIT_US=$1 PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py --master 127.0.0.1:$P \
    --sizes 64KiB,4MiB --seconds 2 --json $OUT/py-$2.json > $OUT/py-$2.txt 2>&1
  kill $NP; wait $NP 2>/dev/null
}
for r in 1 2 3; do
  for spin in 0 50; do
    kv $spin spin$spin-r$r --sizes 64KiB,4MiB --seconds 2
    kv $spin nocache-spin$spin-r$r --sizes 64KiB --seconds 2 --location-cache-ms 0
  done
done
for r in 1 2; do for spin in 0 50; do py $spin spin$spin-r$r; done; done
echo done
