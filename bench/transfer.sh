#!/usr/bin/env bash
# Object transfer benchmark: starts granary-master and one granary-node (4 GiB segment, pages
# prefaulted) on free loopback ports, then runs `granary-bench transfer` from another process:
# put and get of 64 KiB, 1 MiB, 4 MiB and 16 MiB objects through the same-host path (shared
# memory) and through TCP, one object per call and eight per call, next to memcpy and loopback-TCP
# bandwidth measured in the same run. Raw JSON goes to bench/results/.
# Usage: bench/transfer.sh [--seconds N]   (build first: scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_CASE=2
[ "${1:-}" = "--seconds" ] && SECONDS_PER_CASE=$2

source bench/lib.sh
PORT=$(free_port); HTTP_PORT=$(free_port)
STAMP=$(date -u +%Y-%m-%dT%H%M%SZ)
OUT=bench/results/transfer-$STAMP
mkdir -p bench/results
build/bin/granary-master --host 127.0.0.1 --port "$PORT" --http-port "$HTTP_PORT" --log-level warn &
MASTER_PID=$!
build/bin/granary-node --master "127.0.0.1:$PORT" --segment-size 4GiB --prefault \
  --name "bench-$$" --log-level warn > /dev/null &
NODE_PID=$!
trap 'kill $NODE_PID 2>/dev/null || true; wait $NODE_PID 2>/dev/null || true; kill $MASTER_PID 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_for_segment "$PORT"

echo "== machine: $(machine_summary) =="
for batch in 1 8; do
  echo "== transfer, $batch object(s) per call, ${SECONDS_PER_CASE}s per case =="
  build/bin/granary-bench transfer --master "127.0.0.1:$PORT" --seconds "$SECONDS_PER_CASE" \
    --batch "$batch" --json "$OUT-batch$batch.json"
done
echo "== raw results: $OUT-batch1.json $OUT-batch8.json =="
