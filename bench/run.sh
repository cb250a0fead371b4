#!/usr/bin/env bash
# All benchmark suites in one command. Starts everything it needs on 127.0.0.1 (free ports): a
# granary-master and granary-node, redis-server (no persistence), memcached, and fresh masters for
# the metadata and scale suites; runs the suites with bounded durations; stops everything (also on
# failure or Ctrl-C); writes bench/results/<UTC stamp>.json (all suites, the machine, the commands)
# and PNG plots next to it, then prints the markdown tables of docs/benchmarks.md.
#
#   bench/run.sh [--quick] [--suites 1,2,3]   # --quick: shorter cases, smaller counts, under 5
#                                             # minutes; --suites: only these (default: all)
#   GRANARY_BIN=build-bench/bin bench/run.sh --quick     # binaries from another build dir
#
# Suites: 1 limits (memcpy, loopback TCP, O_DIRECT disk), 2 kv (objects: Granary shm and TCP,
# Redis, memcached; 2b the Python client), 3 master (metadata batches) + state, 4 trace (when `granary-bench trace`
# exists), 5 scale (master RSS per object, batch exist, OffloadStart and ReplicaCopyStart at 1M and 10M objects), 6 the SSD tier
# (bench/disk.sh: disk limits, the disk store, offload and disk hits end to end, the trace with a disk tier, recovery;
# its own results directory bench/results/disk-<stamp>/), 7 HA (an etcd, then metadata batches against a
# master alone, an HA leader with an asynchronous standby and one with a synchronous standby; failover
# time over kill -9s of the leader, with an empty and with a full cache).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${GRANARY_BIN:-build/bin}
QUICK=0
SUITES=1,2,3,4,5,6,7
while [ $# -gt 0 ]; do
  arg=$1; shift
  case "$arg" in
    --quick) QUICK=1 ;;
    --suites) SUITES=${1:?--suites needs a list such as 1,2,3}; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done
# True when suite $1 was asked for (suite 2 includes 2b).
want() { [[ ",$SUITES," == *",$1,"* ]]; }
source bench/lib.sh
for tool in "$BIN/granary-bench" "$BIN/granary-master" "$BIN/granary-node" "$BIN/granary"; do
  [ -x "$tool" ] || { echo "missing $tool: build first (scripts/build.sh)" >&2; exit 1; }
done

if [ "$QUICK" = 1 ]; then
  LIMIT_SECONDS=0.5; DISK_BYTES=$((256 << 20))
  KV_SECONDS=0.5; KV_BUDGET=$((256 << 20)); SEGMENT=2GiB; MEMCACHED_MB=2048
  MASTER_SECONDS=1; MASTER_THREADS=1,2,4; STATE_SECONDS=0.5
  SCALE_OBJECTS=200000,1000000; SCALE_SECONDS=1
  TRACE_TIMEOUT=60; TRACE_LIMIT=2000; PY_SECONDS=0.3
  HA_KILLS=3
else
  LIMIT_SECONDS=1; DISK_BYTES=$((1 << 30))
  KV_SECONDS=2; KV_BUDGET=$((1 << 30)); SEGMENT=4GiB; MEMCACHED_MB=4096
  MASTER_SECONDS=3; MASTER_THREADS=1,2,3,4; STATE_SECONDS=2
  SCALE_OBJECTS=1000000,10000000; SCALE_SECONDS=3
  TRACE_TIMEOUT=300; TRACE_LIMIT=0; PY_SECONDS=1
  HA_KILLS=10
fi

TRACE_BYTES_PER_TOKEN=${TRACE_BYTES_PER_TOKEN:-128}
STAMP=$(date -u +%Y-%m-%dT%H%M%SZ)
mkdir -p bench/results
WORK=$(mktemp -d /tmp/granary-bench-run.XXXXXX)
SHM_NAME="granary-bench-run-$$"
PIDS=()

# Stops every process this script started: TERM, up to 5 s, then KILL; drops the node's shm.
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 50); do
    local alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -f "/dev/shm/granary-$SHM_NAME"  # the node's segment, if it was killed
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Stops one started process (TERM, then KILL after 5 s) and forgets it.
stop() {
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  forget "$1"
}

forget() {
  local keep=()
  for pid in "${PIDS[@]}"; do [ "$pid" != "$1" ] && keep+=("$pid"); done
  PIDS=("${keep[@]}")
}

# Records a command for the JSON and runs it in the foreground, bounded by $1 seconds. A failing
# suite is noted (and makes the run exit non-zero at the end) but does not stop the others.
FAILED=()
run_bounded() {
  local limit=$1; shift
  echo "$*" >> "$WORK/commands.txt"
  echo "\$ $*"
  local rc=0
  # In the background and waited for: a signal to this script runs its trap at once (bash defers
  # traps while a foreground child runs); cleanup then stops the child through its timeout.
  timeout -k 5 "$limit" "$@" &
  local child=$!
  PIDS+=("$child")
  wait "$child" || rc=$?
  forget "$child"
  if [ "$rc" != 0 ]; then
    echo "!! exit $rc: $*" | tee -a "$WORK/failures.txt"
    FAILED+=("$2")
  fi
  return 0
}

# Starts a master on free ports, with any extra flags given; sets MASTER_PID, MASTER_PORT.
start_master() {
  MASTER_PORT=$(free_port); local http; http=$(free_port)
  echo "$BIN/granary-master --host 127.0.0.1 --port $MASTER_PORT --http-port $http --log-level warn $*" \
    >> "$WORK/commands.txt"
  "$BIN/granary-master" --host 127.0.0.1 --port "$MASTER_PORT" --http-port "$http" \
    --log-level warn "$@" > "$WORK/master-$MASTER_PORT.log" 2>&1 &
  MASTER_PID=$!; PIDS+=("$MASTER_PID")
  wait_for_health "$http"
}

echo "== machine: $(machine_summary); load average $(cut -d' ' -f1-3 /proc/loadavg) =="
date -u +%Y-%m-%dT%H:%M:%SZ > "$WORK/started"
cut -d' ' -f1-3 /proc/loadavg > "$WORK/load_before"
[ "$QUICK" = 1 ] && echo "== --quick: shorter cases and smaller counts than the full run =="

echo "== suite 1: limits of this machine =="
# Always: the other suites read their limits from it.
run_bounded 120 "$BIN/granary-bench" limits --seconds "$LIMIT_SECONDS" --disk-bytes "$DISK_BYTES" \
  --disk-dir "${GRANARY_BENCH_DISK_DIR:-$PWD/build}" --tcp-streams 1,2,4 --json "$WORK/limits.json"

if want 2; then
echo "== suite 2: objects: Granary (shm, tcp), Redis, memcached =="
start_master
STORE_PID=$MASTER_PID; STORE_PORT=$MASTER_PORT
echo "$BIN/granary-node --master 127.0.0.1:$STORE_PORT --segment-size $SEGMENT --prefault --name $SHM_NAME" \
  >> "$WORK/commands.txt"
"$BIN/granary-node" --master "127.0.0.1:$STORE_PORT" --segment-size "$SEGMENT" --prefault \
  --name "$SHM_NAME" --log-level warn > "$WORK/node.log" 2>&1 &
NODE_PID=$!; PIDS+=("$NODE_PID")
REDIS_PORT=$(free_port)
REDIS_CMD=(redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no
           --proto-max-bulk-len 64mb --protected-mode no --daemonize no --logfile "")
echo "${REDIS_CMD[*]}" >> "$WORK/commands.txt"
"${REDIS_CMD[@]}" > "$WORK/redis.log" 2>&1 &
REDIS_PID=$!; PIDS+=("$REDIS_PID")
# -m: 4x the bytes a case writes, because memcached keeps slab pages assigned to the size class
# that first used them; with less, 1 MiB items were evicted while 64 KiB pages sat empty.
MEMCACHED_PORT=$(free_port)
MEMCACHED_CMD=(memcached -l 127.0.0.1 -p "$MEMCACHED_PORT" -U 0 -I 32m -m "$MEMCACHED_MB" -t 2 -u root)
echo "${MEMCACHED_CMD[*]}" >> "$WORK/commands.txt"
"${MEMCACHED_CMD[@]}" > "$WORK/memcached.log" 2>&1 &
MEMCACHED_PID=$!; PIDS+=("$MEMCACHED_PID")
wait_for_segment "$STORE_PORT"
wait_for_port "$REDIS_PORT"
wait_for_port "$MEMCACHED_PORT"
wait_for_populated "$NODE_PID" $(( ${SEGMENT%GiB} << 30 ))
run_bounded 900 "$BIN/granary-bench" kv --master "127.0.0.1:$STORE_PORT" \
  --redis "127.0.0.1:$REDIS_PORT" --memcached "127.0.0.1:$MEMCACHED_PORT" \
  --sizes 64KiB,1MiB,4MiB,16MiB --clients 1,4 --seconds "$KV_SECONDS" --budget "$KV_BUDGET" \
  --limits-json "$WORK/limits.json" --json "$WORK/kv.json"
stop "$REDIS_PID"

echo "== suite 2b: the Python client (granary.Store and the Mooncake layer) on the same store =="
# memcached from the same Python process is the yardstick of the 64 KiB get (issue 23).
PY_DIR="$(dirname "$BIN")/python"
if [ -f "$PY_DIR/granary/__init__.py" ]; then
  # Each put case writes at most a quarter of the segment: a quick run's 2 GiB segment held the
  # put and the mixed-size case of 1 GiB each and evicted keys the get case then asked for.
  PY_BUDGET=$(( ${SEGMENT%GiB} << 28 ))
  echo "PYTHONPATH=$PY_DIR /usr/bin/python3 bench/python_bench.py --master 127.0.0.1:$STORE_PORT --seconds $PY_SECONDS --budget $PY_BUDGET --memcached 127.0.0.1:$MEMCACHED_PORT" \
    >> "$WORK/commands.txt"
  run_bounded 300 env PYTHONPATH="$PY_DIR" /usr/bin/python3 bench/python_bench.py \
    --master "127.0.0.1:$STORE_PORT" --seconds "$PY_SECONDS" --budget "$PY_BUDGET" \
    --memcached "127.0.0.1:$MEMCACHED_PORT" --json "$WORK/python.json"
else
  echo "skipped: no Python package in $PY_DIR" | tee "$WORK/python-skipped"
fi
stop "$MEMCACHED_PID"

stop "$NODE_PID"; stop "$STORE_PID"
fi

if want 4; then
echo "== suite 4: trace replay =="
# One fresh store per capacity (in tokens): a node whose segment holds exactly that many tokens at
# $TRACE_BYTES_PER_TOKEN bytes each (128: 64 KiB blocks of 512 tokens, as Mooncake was replayed).
# Each capacity with s3fifo, prefix (the default) and lru, for comparison in the same run.
# First the offline simulator (docs/eviction.md): the master's policies next to Belady, on the
# conversation trace and on a synthetic one of another shape (bench/synth_trace.py), in seconds.
if "$BIN/granary-bench" trace --help > "$WORK/trace-help.txt" 2>&1; then
  python3 bench/synth_trace.py --out "$WORK/synthetic_trace.jsonl" > /dev/null
  for sim_trace in conversation synthetic; do
    sim_file=../shared/workloads/conversation_trace.jsonl
    [ "$sim_trace" = synthetic ] && sim_file="$WORK/synthetic_trace.jsonl"
    echo "$BIN/granary-bench trace --simulate all --trace $sim_file" >> "$WORK/commands.txt"
    run_bounded 300 "$BIN/granary-bench" trace --simulate all --trace "$sim_file" \
      --label "$sim_trace" --json "$WORK/trace-sim-$sim_trace.json"
    # The same with a disk tier of 20M tokens beside 1M of memory, at x20 the trace's pace.
    sim_disk=(--capacity-tokens 1000000 --disk-tokens 20000000 --speed 20)
    run_bounded 300 "$BIN/granary-bench" trace --simulate all --trace "$sim_file" "${sim_disk[@]}" \
      --label "$sim_trace, disk" --json "$WORK/trace-sim-${sim_trace}_disk.json"
  done
  for policy in s3fifo prefix lru; do
  for tokens in 1000000 3000000; do
    start_master --eviction-policy "$policy"
    echo "$BIN/granary-node --master 127.0.0.1:$MASTER_PORT --segment-size $((tokens * TRACE_BYTES_PER_TOKEN)) --name $SHM_NAME" \
      >> "$WORK/commands.txt"
    "$BIN/granary-node" --master "127.0.0.1:$MASTER_PORT" --segment-size "$((tokens * TRACE_BYTES_PER_TOKEN))" \
      --name "$SHM_NAME" --log-level warn > "$WORK/node-trace-$tokens.log" 2>&1 &
    TRACE_NODE_PID=$!; PIDS+=("$TRACE_NODE_PID")
    wait_for_segment "$MASTER_PORT"
    TRACE_ARGS=(--master "127.0.0.1:$MASTER_PORT" --bytes-per-token "$TRACE_BYTES_PER_TOKEN"
                --label "$policy, capacity $tokens tokens" --json "$WORK/trace-$policy-$tokens.json")
    [ "$TRACE_LIMIT" != 0 ] && TRACE_ARGS+=(--limit "$TRACE_LIMIT")
    run_bounded "$TRACE_TIMEOUT" "$BIN/granary-bench" trace "${TRACE_ARGS[@]}"
    stop "$TRACE_NODE_PID"; stop "$MASTER_PID"
  done
  done
else
  echo "skipped: this granary-bench has no 'trace' subcommand yet" | tee "$WORK/trace-skipped"
fi
fi

if want 3; then
echo "== suite 3: metadata: batches of 128 keys x 4 KiB against a fresh master =="
start_master
run_bounded 300 "$BIN/granary-bench" master --master "127.0.0.1:$MASTER_PORT" --segments 128 \
  --batch 128 --value-size 4096 --threads "$MASTER_THREADS" --seconds "$MASTER_SECONDS" \
  --json "$WORK/master.json"
stop "$MASTER_PID"
run_bounded 120 "$BIN/granary-bench" state --segments 128 --batch 128 --threads 1,2 \
  --seconds "$STATE_SECONDS" --json "$WORK/state.json"
fi

if want 5; then
echo "== suite 5: master scale: RSS per object, batch exist, offload and re-replication planners at $SCALE_OBJECTS objects =="
start_master
run_bounded 1500 "$BIN/granary-bench" scale --master "127.0.0.1:$MASTER_PORT" \
  --master-pid "$MASTER_PID" --objects "$SCALE_OBJECTS" --value-size 1024 --threads 1,4 \
  --seconds "$SCALE_SECONDS" --json "$WORK/scale.json"
stop "$MASTER_PID"
fi

if want 6; then
echo "== suite 6: the SSD tier (bench/disk.sh) =="
DISK_ARGS=()
[ "$QUICK" = 1 ] && DISK_ARGS+=(--quick)
run_bounded 2700 env GRANARY_BIN="$BIN" bash bench/disk.sh "${DISK_ARGS[@]}"
fi

if want 7; then
echo "== suite 7: HA: one synchronous standby's cost on metadata batches; failover time =="
# etcd with a 500 ms election timeout: it grants 1 s leases (docs/ha.md, "Deploying").
ETCD_PORT=$(free_port); ETCD_PEER=$(free_port)
ETCD_CMD=(etcd --name bench --data-dir "$WORK/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_PORT"
          --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$ETCD_PEER"
          --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER"
          --initial-cluster "bench=http://127.0.0.1:$ETCD_PEER" --heartbeat-interval 50 --election-timeout 500)
echo "${ETCD_CMD[*]}" >> "$WORK/commands.txt"
"${ETCD_CMD[@]}" > "$WORK/etcd.log" 2>&1 &
ETCD_PID=$!; PIDS+=("$ETCD_PID")
wait_for_port "$ETCD_PORT"
HA_FLAGS=(--leader-lease 1s --lease-margin 300ms --standby-timeout 500ms)
# The same batches as suite 3, against: a master alone, then an HA leader (the first master of a
# fresh cluster) with one standby, asynchronous and synchronous. The bench talks to the leader's
# own address; the standby is waited for until it is caught up (and synchronous where it must be).
start_master
run_bounded 300 "$BIN/granary-bench" master --master "127.0.0.1:$MASTER_PORT" --segments 128 \
  --batch 128 --value-size 4096 --threads "$MASTER_THREADS" --seconds "$MASTER_SECONDS" \
  --ops put,get,exist --json "$WORK/ha-master-alone.json"
stop "$MASTER_PID"
for sync in 0 1; do
  CLUSTER="bench-$sync-$$"
  start_master --etcd "127.0.0.1:$ETCD_PORT" --cluster-id "$CLUSTER" --sync-standbys "$sync" "${HA_FLAGS[@]}"
  FIRST_PID=$MASTER_PID; FIRST_PORT=$MASTER_PORT
  start_master --etcd "127.0.0.1:$ETCD_PORT" --cluster-id "$CLUSTER" --sync-standbys "$sync" "${HA_FLAGS[@]}"
  SECOND_PID=$MASTER_PID; SECOND_PORT=$MASTER_PORT
  LEADER_PORT=$(wait_for_ha_leader "$FIRST_PORT" "$SECOND_PORT")
  wait_for_ha_standby "$LEADER_PORT" "$sync"
  run_bounded 300 "$BIN/granary-bench" master --master "127.0.0.1:$LEADER_PORT" --segments 128 \
    --batch 128 --value-size 4096 --threads "$MASTER_THREADS" --seconds "$MASTER_SECONDS" \
    --ops put,get,exist --json "$WORK/ha-master-sync$sync.json"
  stop "$SECOND_PID"; stop "$FIRST_PID"
done
for cache in empty full; do
  FULL=(); [ "$cache" = full ] && FULL=(--full)
  run_bounded 900 "$BIN/granary-bench" failover --bin "$BIN" --etcd "127.0.0.1:$ETCD_PORT" \
    --cluster-id "bench-failover-$cache-$$" --masters 3 --kills "$HA_KILLS" "${FULL[@]}" \
    --json "$WORK/ha-failover-$cache.json"
done
stop "$ETCD_PID"
fi

# The suite files merge.py would otherwise call missing.
NOT_RUN=()
want 2 || NOT_RUN+=(kv python)
want 3 || NOT_RUN+=(master state)
want 5 || NOT_RUN+=(scale)
want 7 || NOT_RUN+=(ha)
want 4 || echo "not asked for (bench/run.sh --suites)" > "$WORK/trace-skipped"
echo "${NOT_RUN[*]}" > "$WORK/suites-not-run"
OUT="bench/results/$STAMP.json"
python3 bench/merge.py --work "$WORK" --quick "$QUICK" --machine "$(machine_summary)" \
  --bin "$BIN" --out "$OUT"
python3 bench/report.py "$OUT" --plots "bench/results/$STAMP"
echo "== results: $OUT, plots bench/results/$STAMP-*.png =="
if [ "${#FAILED[@]}" != 0 ]; then
  echo "!! failed suites: ${FAILED[*]} (see above; their figures may be missing)" >&2
  exit 1
fi
