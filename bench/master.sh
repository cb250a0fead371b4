#!/usr/bin/env bash
# Control-plane benchmark: starts granary-master on free loopback ports, measures this machine's
# limits and the master's batch throughput (128 segments; put, get, exist; 1, 2, 4 client
# threads), prints both tables and keeps the raw JSON in bench/results/.
# Usage: bench/master.sh [--seconds N]   (build first: scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_CASE=3
[ "${1:-}" = "--seconds" ] && SECONDS_PER_CASE=$2

source bench/lib.sh
PORT=$(free_port); HTTP_PORT=$(free_port)
STAMP=$(date -u +%Y-%m-%dT%H%M%SZ)
OUT=bench/results/master-$STAMP
build/bin/granary-master --host 127.0.0.1 --port "$PORT" --http-port "$HTTP_PORT" --log-level warn &
MASTER_PID=$!
trap 'kill $MASTER_PID 2>/dev/null || true; wait $MASTER_PID 2>/dev/null || true' EXIT
wait_for_health "$HTTP_PORT"

echo "== machine: $(machine_summary) =="
echo "== limits =="
build/bin/granary-bench limits --json "$OUT-limits.json" --disk-dir "${GRANARY_BENCH_DISK_DIR:-$PWD/build}"
echo "== master: 128 segments, batches of 128 keys x 4 KiB, ${SECONDS_PER_CASE}s per case =="
build/bin/granary-bench master --master "127.0.0.1:$PORT" --segments 128 --batch 128 \
  --value-size 4096 --threads 1,2,4 --seconds "$SECONDS_PER_CASE" --json "$OUT-master.json"
echo "== the state machine alone, in process (no RPC): same batches =="
build/bin/granary-bench state --segments 128 --batch 128 --threads 1,2 --seconds "$SECONDS_PER_CASE" \
  --json "$OUT-state.json"
echo "== raw results: $OUT-limits.json $OUT-master.json $OUT-state.json =="
