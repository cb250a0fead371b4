#!/usr/bin/env bash
# One 4 MiB answer as the yardstick of one-object-per-call TCP gets (issue 23): three runs of
# bench/tcp.sh (fresh master, node and memcached each; limits first, the 4 MiB answer among
# them), 4 MiB objects, one client. Output: run-N.txt here.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=bench/results/tcp-answer-2026-12-01
for i in 1 2 3; do
  bash bench/tcp.sh 3 4MiB > "$OUT/run-$i.txt" 2>&1
done
grep -h -E "stream|answer|round trip|4MiB +get|^granary-tcp +[0-9]|^memcached +[0-9]" "$OUT"/run-*.txt
