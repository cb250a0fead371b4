#!/usr/bin/env bash
# The master's metadata throughput at 1 to N client threads, for several masters in one run,
# alternating (A B C A B C...) so that machine noise falls on all alike; the machine's limits
# first. Issue 23's scaling goal: put keys/s at 16 client threads against 1, on 16 cores.
#   bench/master_scaling.sh NAME=BIN_DIR[,MASTER_FLAGS] ...
#   e.g. bench/master_scaling.sh old=/tmp/old/bin new=build/bin "fifo=build/bin,--apply-combine-waiting 4096"
# BIN_DIR holds granary-master and granary-bench (each variant's own bench drives it and, with
# STATE=1, runs its own state machine in process at STATE_THREADS threads, puts only, at its
# defaults: MASTER_FLAGS do not reach it). Suite 3's case: batches of 128 keys x 4 KiB,
# 128 metadata-only segments, the fast port.
# Environment: THREADS (1,2,4,8,16), ROUNDS (2), SECONDS_PER_CASE (2), OPS (put,get), STATE (0),
# STATE_THREADS (1,4,16), LIMITS (1: run `granary-bench limits` first, short).
# Prints per case the median keys/s and p50 per variant; raw JSON stays in a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,14p "$0"; exit 2; }
THREADS=${THREADS:-1,2,4,8,16}; ROUNDS=${ROUNDS:-2}; SECS=${SECONDS_PER_CASE:-2}
OPS=${OPS:-put,get}; STATE_THREADS=${STATE_THREADS:-1,4,16}
source bench/lib.sh
WORK=$(mktemp -d /tmp/granary-scaling-XXXXXX)
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT

names=()
for spec in "$@"; do names+=("${spec%%=*}"); done
echo "== $(machine_summary); load average $(cut -d' ' -f1-3 /proc/loadavg) =="
first_dir=${1#*=}; first_dir=${first_dir%%,*}
if [ "${LIMITS:-1}" = 1 ]; then
  timeout 60 "$first_dir/granary-bench" limits --seconds 0.2 --disk-dir "${TMPDIR:-/tmp}" \
    --disk-bytes $((256 << 20)) --json "$WORK/limits.json" || true
fi
for round in $(seq 1 "$ROUNDS"); do
  for spec in "$@"; do
    name=${spec%%=*}; rest=${spec#*=}; dir=${rest%%,*}; flags=""
    [ "$rest" != "$dir" ] && flags=${rest#*,}
    port=$(free_port); http=$(free_port)
    # shellcheck disable=SC2086 # flags are words
    "$dir/granary-master" --host 127.0.0.1 --port "$port" --http-port "$http" --log-level warn \
      $flags > "$WORK/$name-$round.log" 2>&1 &
    PID=$!
    wait_for_health "$http"
    timeout 300 "$dir/granary-bench" master --master "127.0.0.1:$port" --segments 128 \
      --batch 128 --value-size 4096 --threads "$THREADS" --ops "$OPS" --seconds "$SECS" \
      --json "$WORK/master-$name-$round.json" > /dev/null
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
    if [ "${STATE:-0}" = 1 ]; then
      timeout 120 "$dir/granary-bench" state --segments 128 --batch 128 --threads "$STATE_THREADS" \
        --ops put --seconds "$SECS" --json "$WORK/state-$name-$round.json" > /dev/null
    fi
  done
done
python3 - "$WORK" "$ROUNDS" "${names[@]}" <<'PY'
import json, os, statistics, sys
work, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(kind, name):
    cases = {}
    for r in range(1, rounds + 1):
        path = f"{work}/{kind}-{name}-{r}.json"
        if os.path.exists(path):
            for c in json.load(open(path)):
                cases.setdefault((c["op"], c["threads"]), []).append(c)
    return cases
for kind in ("master", "state"):
    data = {n: load(kind, n) for n in names}
    keys = sorted({k for n in names for k in data[n]})
    if not keys:
        continue
    print(f"== {kind}: keys/s, median of {rounds}" + (", then p50 us per batch" if kind == "master" else "") + " ==")
    print(f"{'op':<6}{'threads':>8}" + "".join(f"{n:>12}" for n in names)
          + ("".join(f"{n + ' p50':>12}" for n in names) if kind == "master" else ""))
    for k in keys:
        row = f"{k[0]:<6}{k[1]:>8}"
        for field in ["keys_per_s"] + (["p50_us"] if kind == "master" else []):
            for n in names:
                cs = data[n].get(k, [])
                row += f"{statistics.median(c[field] for c in cs):>12.0f}" if cs else f"{'-':>12}"
        print(row)
print(f"(raw: {work})")
PY
