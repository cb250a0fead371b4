#!/usr/bin/env bash
# Trace replay: for each master setting and each capacity (1M and 3M tokens) starts a fresh
# granary-master and one granary-node on free loopback ports, the node's segment holding exactly
# capacity/512 blocks of 512 tokens x 128 B (64 KiB; the offset allocator's 64 B alignment wastes
# nothing at that size), replays ../shared/workloads/conversation_trace.jsonl with
# `granary-bench trace` (batch exist, get + verify of the hit prefix, put of the rest) and stops
# both. The store's own eviction decides every hit. Raw JSON: bench/results/trace-<stamp>.json.
# Usage: [GRANARY_BIN=build/bin] bench/trace.sh [--quick] [--settings "NAME=MASTER ARGS;..."]
#   --quick      the first 3000 requests only
#   --settings   master settings to compare; default: lru and s3fifo, each with the default
#                watermark (0.90) and ratio (0.05)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${GRANARY_BIN:-build/bin}
TRACE=${GRANARY_TRACE:-../shared/workloads/conversation_trace.jsonl}
BYTES_PER_TOKEN=128
CAPACITIES="1000000 3000000"
LIMIT=0
SETTINGS="lru=--eviction-policy lru;s3fifo=--eviction-policy s3fifo"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) LIMIT=3000; shift ;;
    --settings) SETTINGS=$2; shift 2 ;;
    --capacities) CAPACITIES=$2; shift 2 ;;
    *) echo "usage: bench/trace.sh [--quick] [--settings 'NAME=ARGS;...'] [--capacities 'T1 T2']" >&2
       exit 2 ;;
  esac
done
for b in granary-master granary-node granary-bench granary; do
  [ -x "$BIN/$b" ] || { echo "missing $BIN/$b (build first, or set GRANARY_BIN)" >&2; exit 1; }
done
[ -r "$TRACE" ] || { echo "no trace at $TRACE (set GRANARY_TRACE)" >&2; exit 1; }

source bench/lib.sh
STAMP=$(date -u +%Y-%m-%dT%H%M%SZ)
mkdir -p bench/results
OUT=bench/results/trace-$STAMP.json
PARTS=$(mktemp -d)
MASTER_PID=""; NODE_PID=""
stop_store() {
  [ -n "$NODE_PID" ] && { kill "$NODE_PID" 2>/dev/null || true; wait "$NODE_PID" 2>/dev/null || true; }
  [ -n "$MASTER_PID" ] && { kill "$MASTER_PID" 2>/dev/null || true; wait "$MASTER_PID" 2>/dev/null || true; }
  NODE_PID=""; MASTER_PID=""
}
trap 'stop_store; rm -rf "$PARTS"' EXIT

# Waits (at most 20 s) for the node's segment to be mounted.
wait_mounted() {
  for _ in $(seq 1 200); do
    [ -n "$("$BIN/granary" --master "127.0.0.1:$1" nodes 2>/dev/null | sed -n 2p)" ] && return 0
    sleep 0.1
  done
  echo "no segment mounted at 127.0.0.1:$1 after 20 s" >&2
  return 1
}

echo "== machine: $(machine_summary) =="
echo "== trace $TRACE, blocks of 512 tokens x $BYTES_PER_TOKEN B, limit ${LIMIT} (0: all) =="
BLOCK=$((512 * BYTES_PER_TOKEN))
status=0
IFS=';' read -ra SETTING_LIST <<< "$SETTINGS"
for setting in "${SETTING_LIST[@]}"; do
  name=${setting%%=*}
  args=${setting#*=}
  for tokens in $CAPACITIES; do
    blocks=$((tokens / 512))
    PORT=$(free_port); HTTP_PORT=$(free_port)
    # shellcheck disable=SC2086  # args is a list of master flags
    "$BIN/granary-master" --host 127.0.0.1 --port "$PORT" --http-port "$HTTP_PORT" \
      --log-level warn $args &
    MASTER_PID=$!
    "$BIN/granary-node" --master "127.0.0.1:$PORT" --segment-size $((blocks * BLOCK)) \
      --name "trace-$$-$name-$tokens" --log-level warn > /dev/null &
    NODE_PID=$!
    wait_mounted "$PORT"
    echo "== $name ($args): $tokens tokens = $blocks blocks x $BLOCK B =="
    "$BIN/granary-bench" trace --master "127.0.0.1:$PORT" --trace "$TRACE" \
      --bytes-per-token "$BYTES_PER_TOKEN" --limit "$LIMIT" \
      --label "$name: $args" --json "$PARTS/$name-$tokens.json" || status=1
    curl -fsS "http://127.0.0.1:$HTTP_PORT/metrics" 2>/dev/null \
      | grep -E '^granary_master_(evicted_objects_total|eviction_runs_total)' || true
    stop_store
  done
done

python3 - "$PARTS" "$OUT" "$SETTINGS" "$LIMIT" <<'EOF'
import json, os, sys
parts, out, settings, limit = sys.argv[1:5]
runs = [json.load(open(os.path.join(parts, f))) for f in sorted(os.listdir(parts))]
json.dump({"suite": "trace", "settings": settings, "limit": int(limit), "runs": runs},
          open(out, "w"), indent=2)
print(f"{'setting':40} {'tokens':>9} {'hit rate':>9} {'got GB':>7} {'put GB':>7} {'wall s':>7} {'req/s':>6}")
for r in runs:
    print(f"{r['label'][:40]:40} {r['capacity_tokens']:>9} {r['hit_rate']:>9.4f} "
          f"{r['get_bytes']/1e9:>7.2f} {r['put_bytes']/1e9:>7.2f} {r['seconds']:>7.1f} "
          f"{r['requests_per_s']:>6.0f}")
EOF
echo "== raw results: $OUT =="
exit $status
