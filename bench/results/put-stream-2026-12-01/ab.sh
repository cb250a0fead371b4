#!/bin/bash
cd /work/main
P=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
build/bin/granary-node --standalone --master-port $P --segment-size 4GiB --prefault --name ab$$ --log-level warn > /tmp/tcpb/ab.log 2>&1 &
NP=$!
sleep 10
for r in $(seq 1 ${ROUNDS:-3}); do
  for v in "$@"; do
    env $v PYTHONPATH=build/python /usr/bin/python3 /tmp/tcpb/putloop.py 127.0.0.1:$P "$v" ${SECS:-2}
  done
done
kill $NP; wait
