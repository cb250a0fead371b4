#!/usr/bin/env bash
# Installs dependencies, builds, and starts a Granary store on its embedded default, then shows it
# working. Runs in the foreground until Ctrl-C; `scripts/run.sh --check` stops after the demo.
set -euo pipefail
cd "$(dirname "$0")/.."

CHECK_ONLY=0
[ "${1:-}" = "--check" ] && CHECK_ONLY=1
PORT=${GRANARY_PORT:-50051}
HTTP_PORT=${GRANARY_HTTP_PORT:-9003}

bash scripts/install-deps.sh
bash scripts/build.sh

echo "== starting granary-master on 127.0.0.1:$PORT (HTTP $HTTP_PORT) =="
build/bin/granary-master --host 127.0.0.1 --port "$PORT" --http-port "$HTTP_PORT" &
MASTER_PID=$!
trap 'kill $MASTER_PID 2>/dev/null || true; wait $MASTER_PID 2>/dev/null || true' EXIT INT TERM

for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$HTTP_PORT/health" >/dev/null 2>&1 && break
  kill -0 $MASTER_PID 2>/dev/null || { echo "granary-master exited; see the log above" >&2; exit 1; }
  sleep 0.1
done

echo "== /health =="; curl -fsS "http://127.0.0.1:$HTTP_PORT/health"
echo "== a short workload: 4 segments, puts, reads, existence checks =="
build/bin/granary-bench master --master "127.0.0.1:$PORT" --segments 4 --seconds 1 --threads 1
echo "== /status =="; curl -fsS "http://127.0.0.1:$HTTP_PORT/status"
echo "== /metrics (excerpt) =="
curl -fsS "http://127.0.0.1:$HTTP_PORT/metrics" | grep -E '^granary_master_(objects|segments|capacity_bytes|used_bytes) ' || true

if [ "$CHECK_ONLY" = 1 ]; then
  echo "== run.sh --check: OK =="
  exit 0
fi
echo "== granary-master is running; Ctrl-C stops it =="
wait $MASTER_PID
