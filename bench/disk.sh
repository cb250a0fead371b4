#!/usr/bin/env bash
# The SSD tier's benchmarks, beside this machine's limits measured in the same run:
#   1. limits: memcpy, loopback TCP, O_DIRECT sequential write/read, 64 KiB random reads at QD32;
#   2. the disk store in process (granary-bench disk): write and batched-read GB/s per backend,
#      I/O engine and size;
#   3. offload and disk hits end to end (granary-bench diskhit) per backend and I/O engine: a
#      master with --persistence eager and a node with a disk tier; objects are put (shared
#      memory) and offloaded (GB/s until the newest has its disk copy), the master
#      is restarted (memory is lost, the node registers its disk again), then batched gets of 32
#      are all served from disk through the node's data plane, every byte verified: once with
#      --transport tcp (DISK_READ over loopback, as a remote client) and once with --transport
#      shm (DISK_STAGE: the node's shared-memory staging region, as a same-host client);
#   4. the conversation trace with DRAM for 1M tokens and a disk tier for 20M (64 KiB blocks),
#      backends bucket and offset, disk eviction lru and fifo, replayed flat out; and the lru
#      settings again at 20x the trace's pace (not with --quick);
#   5. recovery: a store of 100k objects (16 KiB) reopened after a crash and after a clean close
#      per backend (granary-bench diskrecover), then a node started on it: open and registration.
# Everything binds 127.0.0.1 on free ports and is stopped at exit. Raw JSON and the commands:
# bench/results/disk-<stamp>/.
# Usage: [GRANARY_BIN=build/bin] [GRANARY_BENCH_DISK_DIR=DIR] bench/disk.sh [--quick]
#   --quick: 64 MiB per size, 1 s per case, backends bucket only, the first 3000 trace requests.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${GRANARY_BIN:-build/bin}
DIR=${GRANARY_BENCH_DISK_DIR:-$PWD/build}
TRACE=${GRANARY_TRACE:-../shared/workloads/conversation_trace.jsonl}
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
if [ "$QUICK" = 1 ]; then
  BYTES=64MiB; BYTES_N=$((64 << 20)); SECONDS_PER=1; BACKENDS="bucket"; TRACE_LIMIT=3000
  RECOVER_OBJECTS=10000; RECOVER_BACKENDS=bucket
else
  BYTES=256MiB; BYTES_N=$((256 << 20)); SECONDS_PER=2; BACKENDS="bucket file-per-key offset"
  TRACE_LIMIT=0
  # The last backend's store is the one a node then opens: the default, bucket. file-per-key is
  # left out: deleting its 100k files afterwards takes minutes on this VM's disk.
  RECOVER_OBJECTS=100000; RECOVER_BACKENDS=offset,bucket
fi
SIZES=64KiB,256KiB,1MiB,4MiB
for b in granary-master granary-node granary-bench granary; do
  [ -x "$BIN/$b" ] || { echo "missing $BIN/$b (build first, or set GRANARY_BIN)" >&2; exit 1; }
done
source bench/lib.sh
STAMP=$(date -u +%Y-%m-%dT%H%M%SZ)
OUT=bench/results/disk-$STAMP
mkdir -p "$OUT"
WORK=$(mktemp -d "$DIR/granary-bench-disk.XXXXXX")
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
run() {
  echo "$*" >> "$OUT/commands.txt"
  echo "\$ $*"
  "$@"
}
stop() {
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
# start_master PORT HTTP_PORT FLAGS...: sets MASTER_PID
start_master() {
  local port=$1 http=$2; shift 2
  echo "$BIN/granary-master --host 127.0.0.1 --port $port --http-port $http $*" >> "$OUT/commands.txt"
  "$BIN/granary-master" --host 127.0.0.1 --port "$port" --http-port "$http" --log-level warn "$@" \
    >> "$WORK/master-$port.log" 2>&1 &
  MASTER_PID=$!; PIDS+=("$MASTER_PID")
  wait_for_health "$http"
}
# start_node PORT SEGMENT_BYTES DISK_DIR DISK_BYTES FLAGS...: sets NODE_PID
start_node() {
  local port=$1 segment=$2 disk=$3 disk_size=$4; shift 4
  mkdir -p "$disk"
  echo "$BIN/granary-node --master 127.0.0.1:$port --segment-size $segment --disk-dir $disk --disk-size $disk_size $*" \
    >> "$OUT/commands.txt"
  "$BIN/granary-node" --master "127.0.0.1:$port" --segment-size "$segment" --disk-dir "$disk" \
    --disk-size "$disk_size" --log-level "${NODE_LOG_LEVEL:-warn}" "$@" > "$WORK/node-$port.log" 2>&1 &
  NODE_PID=$!; PIDS+=("$NODE_PID")
  wait_for_segment "$port"
}

echo "== machine: $(machine_summary); load average $(cut -d' ' -f1-3 /proc/loadavg); disk dir $DIR =="
echo "== 1. limits =="
run "$BIN/granary-bench" limits --seconds "$SECONDS_PER" --disk-dir "$WORK" --disk-bytes "$BYTES_N" \
  --tcp-streams 1 --json "$OUT/limits.json"

echo "== 2. the disk store in process =="
run "$BIN/granary-bench" disk --dir "$WORK" --bytes "$BYTES" --seconds "$SECONDS_PER" \
  --sizes "$SIZES" --json "$OUT/store.json"

echo "== 3. disk hits end to end: batches of 32, after a master restart =="
# Memory holds every object (no eviction during the put phase); the disk budget too.
SEGMENT=$((BYTES_N * 5 + (64 << 20)))
DISK_SIZE=$((BYTES_N * 6 + (256 << 20)))
for backend in $BACKENDS; do
  for io in uring posix; do
    port=$(free_port); http=$(free_port)
    start_master "$port" "$http" --persistence eager
    start_node "$port" "$SEGMENT" "$WORK/hit-$backend-$io" "$DISK_SIZE" --disk-backend "$backend" \
      --disk-io "$io" --offload-interval 100ms
    echo "-- $backend, $io: puts, then offload (eager) --"
    run "$BIN/granary-bench" diskhit --master "127.0.0.1:$port" --phase put --sizes "$SIZES" \
      --bytes "$BYTES" --label "$backend $io" --json "$OUT/offload-$backend-$io.json"
    stop "$MASTER_PID"
    # Promotion off: this measures loads from disk, which promotion would turn into memory hits.
    start_master "$port" "$http" --persistence eager --promote-after 0
    for transport in tcp shm; do
      echo "-- $backend, $io, $transport --"
      run "$BIN/granary-bench" diskhit --master "127.0.0.1:$port" --phase get --sizes "$SIZES" \
        --bytes "$BYTES" --seconds "$SECONDS_PER" --transport "$transport" \
        --label "$backend $io $transport" --json "$OUT/hit-$backend-$io-$transport.json"
    done
    stop "$NODE_PID"; stop "$MASTER_PID"
    rm -rf "$WORK/hit-$backend-$io"
  done
done

echo "== 4. trace: DRAM 1M tokens + disk 20M tokens (64 KiB blocks) =="
if [ -r "$TRACE" ]; then
  # bucket evicts whole buckets (1/1024 of the disk: about 38 blocks), offset one record at a time.
  # Flat out (speed 0: offload bandwidth bounds what reaches the disk), then the lru settings
  # again at 20x the trace's own pace (offload keeps up, as in service).
  for setting in bucket:lru:0 bucket:fifo:0 offset:lru:0 offset:fifo:0 bucket:lru:20 offset:lru:20; do
    IFS=: read -r backend eviction speed <<<"$setting"
    [ "$QUICK" = 1 ] && [ "$speed" != 0 ] && continue
    port=$(free_port); http=$(free_port)
    start_master "$port" "$http"
    start_node "$port" $((1000000 * 128)) "$WORK/trace-$backend-$eviction" $((20000000 * 128)) \
      --disk-backend "$backend" --disk-eviction "$eviction" --offload-interval 100ms
    args=(--master "127.0.0.1:$port" --bytes-per-token 128 --trace "$TRACE" --speed "$speed"
          --label "DRAM 1M + disk 20M tokens, $backend, disk $eviction, speed $speed"
          --json "$OUT/trace-$backend-$eviction-speed$speed.json")
    [ "$TRACE_LIMIT" != 0 ] && args+=(--limit "$TRACE_LIMIT")
    run "$BIN/granary-bench" trace "${args[@]}"
    stop "$NODE_PID"; stop "$MASTER_PID"
    rm -rf "$WORK/trace-$backend-$eviction"
  done
else
  echo "skipped: no trace at $TRACE"
fi
echo "== 5. recovery: the store reopened with $RECOVER_OBJECTS objects, then registered with a master =="
run "$BIN/granary-bench" diskrecover --dir "$WORK" --objects "$RECOVER_OBJECTS" --size 16KiB \
  --backends "$RECOVER_BACKENDS" --keep "$WORK/recover" --json "$OUT/recovery.json"
# A node started on the last backend's store: its log says how long the open and the
# registration of every object took.
port=$(free_port); http=$(free_port)
start_master "$port" "$http"
NODE_LOG_LEVEL=info start_node "$port" $((256 << 20)) "$WORK/recover" $((RECOVER_OBJECTS * 32768 + (1 << 30))) \
  --disk-backend "${RECOVER_BACKENDS##*,}"
for _ in $(seq 1 600); do grep -q "registered with the master" "$WORK/node-$port.log" && break; sleep 0.1; done
grep -E "objects recovered in|registered with the master" "$WORK/node-$port.log" \
  | sed 's/^.*\] //' | tee "$OUT/recovery-node.txt"
stop "$NODE_PID"; stop "$MASTER_PID"
rm -rf "$WORK/recover"
echo "== results: $OUT =="
