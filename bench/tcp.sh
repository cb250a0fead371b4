#!/usr/bin/env bash
# The TCP object cases of suite 2 alone, with their limits, in one run: loopback TCP limits (1 and
# 4 streams), then `granary-bench kv` for granary-tcp and memcached (4 MiB and 16 MiB, one
# client) against a fresh master, node and memcached started as bench/run.sh starts them.
# Use it to compare before/after a change under the same conditions (same machine, same load).
#
#   bench/tcp.sh [SECONDS] [SIZES]           # defaults: 2 and 4MiB,16MiB
#   GRANARY_BIN=build/bin bench/tcp.sh       # binaries from another build dir
#   PERF_GET=out.txt bench/tcp.sh 4 16MiB    # also perf-records the bench process (kv only)
#   PERF_NODE=out.txt bench/tcp.sh 4 4MiB    # perf-records the node during kv (put and get)
#   TARGETS=granary-tcp bench/tcp.sh          # kv targets (default granary-tcp,memcached)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${GRANARY_BIN:-build/bin}
SECONDS_PER_CASE=${1:-2}
SIZES=${2:-4MiB,16MiB}
source bench/lib.sh
WORK=$(mktemp -d /tmp/granary-bench-tcp.XXXXXX)
SHM_NAME="granary-bench-tcp-$$"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -f "/dev/shm/granary-$SHM_NAME"
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== $(machine_summary); load average $(cut -d' ' -f1-3 /proc/loadavg) =="
timeout 120 "$BIN/granary-bench" limits --seconds 1 --disk-bytes $((64 << 20)) \
  --disk-dir "$WORK" --tcp-streams 1,4 --json "$WORK/limits.json" | grep -i -E "tcp|loopback"
MASTER_PORT=$(free_port); HTTP_PORT=$(free_port)
"$BIN/granary-master" --host 127.0.0.1 --port "$MASTER_PORT" --http-port "$HTTP_PORT" \
  --log-level warn > "$WORK/master.log" 2>&1 &
PIDS+=($!)
wait_for_health "$HTTP_PORT"
"$BIN/granary-node" --master "127.0.0.1:$MASTER_PORT" --segment-size 4GiB --prefault \
  --name "$SHM_NAME" --log-level warn > "$WORK/node.log" 2>&1 &
NODE_PID=$!
PIDS+=($NODE_PID)
MEMCACHED_PORT=$(free_port)
memcached -l 127.0.0.1 -p "$MEMCACHED_PORT" -U 0 -I 32m -m 4096 -t 2 -u root \
  > "$WORK/memcached.log" 2>&1 &
PIDS+=($!)
wait_for_segment "$MASTER_PORT"
wait_for_port "$MEMCACHED_PORT"
wait_for_populated "$NODE_PID" $((4 << 30))
KV=("$BIN/granary-bench" kv --master "127.0.0.1:$MASTER_PORT" --memcached "127.0.0.1:$MEMCACHED_PORT"
    --targets "${TARGETS:-granary-tcp,memcached}" --sizes "$SIZES" --clients 1 --seconds "$SECONDS_PER_CASE"
    --budget $((1 << 30)) --limits-json "$WORK/limits.json")
if [ -n "${PERF_GET:-}" ]; then
  timeout 600 perf record -g -o "$WORK/perf.data" -- "${KV[@]}"
  perf report -i "$WORK/perf.data" --no-children --percent-limit 1.5 --stdio 2>/dev/null \
    | grep -v "^$" | head -150 > "$PERF_GET"
elif [ -n "${PERF_NODE:-}" ]; then
  perf record -g -p "$NODE_PID" -o "$WORK/node.perf" > /dev/null 2>&1 &
  PERF_PID=$!
  sleep 0.5
  timeout 600 "${KV[@]}"
  kill -INT "$PERF_PID"; wait "$PERF_PID" || true
  perf report -i "$WORK/node.perf" --no-children --percent-limit 1.5 --stdio 2>/dev/null \
    | grep -v "^$" | head -150 > "$PERF_NODE"
else
  timeout 600 "${KV[@]}"
fi
