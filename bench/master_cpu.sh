#!/usr/bin/env bash
# CPU cost of the master's hot calls per batch, on each side, for two builds in alternating
# rounds: on a shared 2-core machine, throughput swings with the neighbours' load, CPU time per
# batch much less. Each round: one master, one client thread, --ops OP for SECONDS; the master's
# CPU from /proc/PID/stat, the client's from getrusage (the bench's own setup is included in both).
#   bench/master_cpu.sh OLD_BIN_DIR NEW_BIN_DIR [ROUNDS] [SECONDS] [OPS]
# Prints per op the median microseconds of CPU per batch of 128 (master, client), keys/s and p50.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$1; NEW=$2; ROUNDS=${3:-3}; SECONDS_PER_CASE=${4:-3}; OPS=${5:-put,get,exist}
source bench/lib.sh
WORK=$(mktemp -d /tmp/granary-cpu-XXXXXX)
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
echo "== $(machine_summary); load average $(cut -d' ' -f1-3 /proc/loadavg) =="
for round in $(seq 1 "$ROUNDS"); do
  for op in ${OPS//,/ }; do
    for which in old new; do
      dir=$OLD; [ "$which" = new ] && dir=$NEW
      port=$(free_port); http=$(free_port)
      "$dir/granary-master" --host 127.0.0.1 --port "$port" --http-port "$http" --log-level warn \
        > "$WORK/$which.log" 2>&1 &
      PID=$!
      wait_for_health "$http"
      before=$(ticks "$PID")
      /usr/bin/time -f "%U %S" -o "$WORK/$which-$op-$round.time" \
        "$dir/granary-bench" master --master "127.0.0.1:$port" --segments 128 --batch 128 \
        --value-size 4096 --threads 1 --ops "$op" --path fast --seconds "$SECONDS_PER_CASE" \
        --json "$WORK/$which-$op-$round.json" > /dev/null
      after=$(ticks "$PID")
      echo $((after - before)) > "$WORK/$which-$op-$round.master"
      kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
    done
  done
done
python3 - "$WORK" "$ROUNDS" "$OPS" "$(getconf CLK_TCK)" "$SECONDS_PER_CASE" <<'PY'
import json, statistics, sys
work, rounds, ops = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
hz, seconds = int(sys.argv[4]), float(sys.argv[5])
med = statistics.median
print(f"{'op':<6} {'build':<5} {'master us/batch':>15} {'client us/batch':>15} {'keys/s':>10} {'p50 us':>7}")
for op in ops:
    for which in ("old", "new"):
        m, c, k, p = [], [], [], []
        for r in range(1, rounds + 1):
            case = json.load(open(f"{work}/{which}-{op}-{r}.json"))[0]
            batches = case["batches_per_s"] * seconds
            ticks = int(open(f"{work}/{which}-{op}-{r}.master").read())
            user, sys_ = map(float, open(f"{work}/{which}-{op}-{r}.time").read().split()[-2:])
            m.append(ticks / hz * 1e6 / batches)
            c.append((user + sys_) * 1e6 / batches)
            k.append(case["keys_per_s"])
            p.append(case["p50_us"])
        print(f"{op:<6} {which:<5} {med(m):>15.1f} {med(c):>15.1f} {med(k):>10.0f} {med(p):>7.0f}")
PY
