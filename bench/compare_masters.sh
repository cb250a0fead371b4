#!/usr/bin/env bash
# Metadata throughput of two granary-master binaries in one run, alternating A B A B... so that
# machine noise falls on both alike: suite 3's case (batches of 128 keys x 4 KiB, 128 metadata-only
# segments) through the same granary-bench.
#   bench/compare_masters.sh OLD_MASTER NEW_MASTER [ROUNDS] [SECONDS]
# Prints each case's median keys/s per binary and the ratio new/old.
# Environment: OLD_BENCH / NEW_BENCH (default $BIN/granary-bench) compare client changes too;
# THREADS (default 1,4) and OPS (default all) pick the cases; STATE=1 also runs each side's
# in-process state machine (`granary-bench state`, STATE_THREADS threads, default 1) every round,
# the ratio's base; STATE_OPS (default put,get,exist) its cases.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$1; NEW=$2; ROUNDS=${3:-3}; SECONDS_PER_CASE=${4:-3}
BIN=${BIN:-build/bin}
OLD_BENCH=${OLD_BENCH:-$BIN/granary-bench}; NEW_BENCH=${NEW_BENCH:-$BIN/granary-bench}
THREADS=${THREADS:-1,4}; OPS=${OPS:-tcp,ping,put,get,exist}
source bench/lib.sh
WORK=$(mktemp -d /tmp/granary-compare-XXXXXX)
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT

echo "== $(machine_summary); load average $(cut -d' ' -f1-3 /proc/loadavg) =="
for round in $(seq 1 "$ROUNDS"); do
  for which in old new; do
    master=$OLD; bench=$OLD_BENCH
    [ "$which" = new ] && master=$NEW && bench=$NEW_BENCH
    port=$(free_port); http=$(free_port)
    "$master" --host 127.0.0.1 --port "$port" --http-port "$http" --log-level warn \
      > "$WORK/$which-$round.log" 2>&1 &
    PID=$!
    wait_for_health "$http"
    timeout 300 "$bench" master --master "127.0.0.1:$port" --segments 128 --batch 128 \
      --value-size 4096 --threads "$THREADS" --ops "$OPS" --seconds "$SECONDS_PER_CASE" \
      --json "$WORK/$which-$round.json" > /dev/null
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
    if [ "${STATE:-0}" = 1 ]; then
      "$bench" state --segments 128 --batch 128 --threads "${STATE_THREADS:-1}" --ops "${STATE_OPS:-put,get,exist}" \
        --seconds "$SECONDS_PER_CASE" \
        --json "$WORK/$which-state-$round.json" > /dev/null
    fi
  done
done
python3 - "$WORK" "$ROUNDS" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def load(which):
    cases = {}
    for r in range(1, rounds + 1):
        for c in json.load(open(f"{work}/{which}-{r}.json")):
            cases.setdefault((c["op"], c["threads"]), []).append(c)
    return cases
old, new = load("old"), load("new")
print(f"{'case':<10} {'threads':>7} {'old keys/s':>12} {'new keys/s':>12} {'new/old':>8} {'old p50 us':>10} {'new p50 us':>10}")
for key in sorted(old):
    def med(cs, f): return statistics.median(c[f] for c in cs)
    o, n = old[key], new[key]
    rate = "keys_per_s" if key[0] not in ("ping", "tcp") else "batches_per_s"
    ro, rn = med(o, rate), med(n, rate)
    errors = sum(c["errors"] for c in o + n)
    print(f"{key[0]:<10} {key[1]:>7} {ro:>12.0f} {rn:>12.0f} {rn / ro:>8.2f} {med(o, 'p50_us'):>10.0f} {med(n, 'p50_us'):>10.0f}"
          + (f"  ({errors} errors)" if errors else ""))
print("(ping, tcp: round trips/s)")
import os
if os.environ.get("STATE") == "1":
    def state(which):
        cases = {}
        for r in range(1, rounds + 1):
            for c in json.load(open(f"{work}/{which}-state-{r}.json")):
                cases.setdefault((c["op"], c["threads"]), []).append(c["keys_per_s"])
        return {k: statistics.median(v) for k, v in cases.items()}
    so, sn = state("old"), state("new")
    print("state machine in process (keys/s); the master over RPC at as many threads as a share"
          " of its own side's:")
    print(f"{'case':<10} {'threads':>7} {'old keys/s':>12} {'new keys/s':>12} {'new/old':>8}")
    for (op, t) in sorted(so):
        share = lambda side, s: (f"{statistics.median(c['keys_per_s'] for c in side[(op, t)]) / s:.0%}"
                                 if (op, t) in side else "-")
        print(f"{op:<10} {t:>7} {so[(op, t)]:>12.0f} {sn[(op, t)]:>12.0f} {sn[(op, t)] / so[(op, t)]:>8.2f}"
              f"   rpc share old {share(old, so[(op, t)])} new {share(new, sn[(op, t)])}")
PY
