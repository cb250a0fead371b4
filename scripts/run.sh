#!/usr/bin/env bash
# Installs dependencies, builds, and starts a Granary store on its embedded default
# (`granary-node --standalone`: a master and one storage node in one process), then shows it
# working with the `granary` CLI. Runs in the foreground until Ctrl-C; `--check` stops after the
# demonstration (CI uses it).
set -euo pipefail
cd "$(dirname "$0")/.."

CHECK_ONLY=0
[ "${1:-}" = "--check" ] && CHECK_ONLY=1
PORT=${GRANARY_PORT:-50051}
HTTP_PORT=${GRANARY_HTTP_PORT:-9003}
SEGMENT_SIZE=${GRANARY_SEGMENT_SIZE:-0}   # 0: fit the machine

bash scripts/install-deps.sh
bash scripts/build.sh

echo "== starting granary-node --standalone (master on 127.0.0.1:$PORT, HTTP $HTTP_PORT) =="
build/bin/granary-node --standalone --master-port "$PORT" --http-port "$HTTP_PORT" \
  --segment-size "$SEGMENT_SIZE" &
NODE_PID=$!
trap 'kill $NODE_PID 2>/dev/null || true; wait $NODE_PID 2>/dev/null || true' EXIT INT TERM

G="build/bin/granary --master 127.0.0.1:$PORT"
for _ in $(seq 1 100); do
  $G health >/dev/null 2>&1 && [ -n "$($G nodes 2>/dev/null | sed -n 2p)" ] && break
  kill -0 $NODE_PID 2>/dev/null || { echo "granary-node exited; see its log above" >&2; exit 1; }
  sleep 0.1
done

echo "== granary health ==";             $G health
echo "== granary nodes ==";              $G nodes
echo "== granary put greeting - ==";     echo "hello from Granary" | $G put greeting -
echo "== granary get greeting ==";       $G get greeting
DEMO=$(mktemp); trap 'rm -f "$DEMO" "$DEMO.out"; kill $NODE_PID 2>/dev/null || true; wait $NODE_PID 2>/dev/null || true' EXIT INT TERM
head -c $((8 << 20)) /dev/urandom > "$DEMO"
echo "== granary put blob (8 MiB) and get it back =="
$G put blob "$DEMO" && $G get blob -o "$DEMO.out" && cmp "$DEMO" "$DEMO.out" && echo "8 MiB round trip: identical"
echo "== granary stat blob ==";          $G stat blob
echo "== granary ls ==";                 $G ls
echo "== granary get missing (a miss exits 1) =="
if $G get missing; then echo "unexpected hit" >&2; exit 1; else echo "exit code $?"; fi
echo "== HTTP /status =="; curl -fsS "http://127.0.0.1:$HTTP_PORT/status"
echo
echo "== Python: granary.Store and the Mooncake-compatible layer (PYTHONPATH=build/python) =="
PYTHONPATH=build/python /usr/bin/python3 - "127.0.0.1:$PORT" <<'PY'
import sys
import numpy as np
import granary
from granary.compat.mooncake import MooncakeDistributedStore

with granary.Store(sys.argv[1]) as store:
    print("get greeting ->", store.get("greeting"))
    kv = np.arange(1 << 20, dtype=np.float32)
    store.put("py/kv", kv)
    out = np.empty_like(kv)
    print("numpy get_into ->", store.get_into("py/kv", out), "bytes, equal:", np.array_equal(kv, out))
    print("get missing ->", store.get("missing"))
mc = MooncakeDistributedStore()
assert mc.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", sys.argv[1]) == 0
print("mooncake is_exist(py/kv) ->", mc.is_exist("py/kv"), "; get_size ->", mc.get_size("py/kv"),
      "; health_check ->", mc.health_check())
mc.close()
PY

if [ "$CHECK_ONLY" = 1 ]; then
  echo "== run.sh --check: OK =="
  exit 0
fi
echo "== the store is running (master 127.0.0.1:$PORT); try: $G put k - ; Ctrl-C stops it =="
wait $NODE_PID
