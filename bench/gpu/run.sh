#!/usr/bin/env bash
# bench/gpu/run.sh - the prepared run for a machine with one GPU (README.md beside it): from the
# repository root, with what bench/gpu/pack.sh gathered (build/gpu-pack), writes everything under
# $OUT (default ./gpu-out) and fits in BUDGET_S seconds (default 450).
#
#   OUT=/some/dir bash bench/gpu/run.sh
#
# Steps, each bounded with `timeout` and logged to $OUT/<step>.log, in order of value (a step
# that would start with under 20 s of the budget left is skipped):
#   env          nvidia-smi -L, versions, the store's CUDA lookup (env.txt)
#   limits       memcpy (torch, numpy) and pinned host<->GPU (engine_kv --limits-only) on the
#                KV bytes of LIMIT_TOKENS (default 16384 tokens: 2 GiB)
#   store        granary-node --standalone on loopback, a segment of SEG_MIB (default 16 GiB,
#                less when /dev/shm is smaller); stopped on every exit
#   kv-<N>       engine_kv.py --device cuda (host, staged, direct) for N in RUN_TOKENS
#                (default "4096 16384") prompt tokens, 64-token pages
#   model        engine_kv.py --model-check at EXTRA_TOKENS (4096) tokens, if transformers imports
#   python-bench bench/python_bench.py, short
#   kv-4096-opp  --object-per-page (multi-buffer calls); kv-4096-p16: 16-token pages
# summary.txt (and stdout) collect each step's result table; the JSON files have every figure.
#
# Environment: OUT, BUDGET_S, RUN_TOKENS, EXTRA_TOKENS, LIMIT_TOKENS, SEG_MIB, PREFAULT (true),
# PYTHON (python3),
# GRANARY_BIN_DIR / GRANARY_LIB_DIR / GRANARY_PY_DIR (the folder holding granary/), by default
# build/gpu-pack/{bin,lib,python}, else build/bin, build/gpu-libs, build/python-cp312.
set -u
cd "$(dirname "$0")/../.." || exit 1

OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUDGET_S=${BUDGET_S:-450}
RUN_TOKENS=${RUN_TOKENS:-4096 16384}
EXTRA_TOKENS=${EXTRA_TOKENS:-4096}  # model check, --object-per-page, 16-token pages
LIMIT_TOKENS=${LIMIT_TOKENS:-16384}
SEG_MIB=${SEG_MIB:-16384}
PREFAULT=${PREFAULT:-true}
PY=${PYTHON:-python3}
PACK=build/gpu-pack
pick() { if [[ -e $1 ]]; then echo "$1"; else echo "$2"; fi; }
abs() { if [[ $1 == /* ]]; then echo "$1"; else echo "$(pwd)/$1"; fi; }
BIN=$(abs "${GRANARY_BIN_DIR:-$(dirname "$(pick $PACK/bin/granary-node build/bin/granary-node)")}")
LIBS=$(abs "${GRANARY_LIB_DIR:-$(pick $PACK/lib build/gpu-libs)}")
# The folder holding the granary package.
PYDIR=$(abs "${GRANARY_PY_DIR:-$(dirname "$(pick $PACK/python/granary \
  "$(pick build/python-cp312/granary build/py312/granary)")")}")
export GRANARY_BIN_DIR=$BIN
export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$PYDIR${PYTHONPATH:+:$PYTHONPATH}

START=$(date +%s)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
FAILED=0
NODE_PID=
STEP_PID=

log() { echo "[$(($(date +%s) - START))s] $*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - ($(date +%s) - START))); }

stop_store() {
  if [[ -n $NODE_PID ]] && kill -0 "$NODE_PID" 2>/dev/null; then
    kill -TERM "$NODE_PID"
    for _ in $(seq 100); do kill -0 "$NODE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$NODE_PID" 2>/dev/null
    wait "$NODE_PID" 2>/dev/null
    log "store stopped"
  fi
  NODE_PID=
}
on_signal() {
  [[ -n $STEP_PID ]] && kill -TERM "$STEP_PID" 2>/dev/null
  log "interrupted"
  exit 143
}
trap stop_store EXIT
trap on_signal TERM INT

# step NAME LIMIT_S TABLE_LINES CMD...: runs CMD under timeout (never past the budget), its
# output in $OUT/NAME.log, the last TABLE_LINES lines of it copied into the summary.
step() {
  local name=$1 limit=$2 lines=$3 rc
  shift 3
  local budget
  budget=$(left)
  if ((budget < 20)); then
    log "SKIP $name: the budget is spent"
    return 1
  fi
  ((limit > budget)) && limit=$budget
  log "RUN  $name (at most ${limit}s): $*"
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1 &
  STEP_PID=$!
  wait "$STEP_PID"
  rc=$?
  STEP_PID=
  case $rc in
    0) log "OK   $name" ;;
    124 | 137) log "FAIL $name: timed out after ${limit}s"; FAILED=$((FAILED + 1)) ;;
    *) log "FAIL $name: exit $rc"; FAILED=$((FAILED + 1)) ;;
  esac
  tail -n "$lines" "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
  return "$rc"
}

log "run.sh: bin $BIN, libs $LIBS, python $PYDIR ($PY), out $OUT, budget ${BUDGET_S}s"

# ---- env
{
  echo "== nvidia-smi -L"; timeout 20 nvidia-smi -L 2>&1
  echo "== nvidia-smi"; timeout 20 nvidia-smi 2>&1
  echo "== machine"; uname -a; nproc; free -g; df -h /dev/shm "$OUT"
  echo "== ldd (not found?)"
  ldd "$BIN/granary-node" "$BIN/granary-master" "$PYDIR"/granary/_granary*.so 2>&1 |
    grep -iE "not found|cannot|no such" || echo "all resolved"
  echo "== python"
  timeout 90 "$PY" - <<'EOF' 2>&1
import sys
print("python", sys.version.split()[0])
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        torch.cuda.init()
        print("gpu", torch.cuda.get_device_name(0))
except Exception as e:
    print("torch: ", repr(e))
try:
    import transformers
    print("transformers", transformers.__version__)
except Exception as e:
    print("transformers: not available:", repr(e))
try:
    from granary import _granary
    print("granary", _granary.__file__)
    print("granary cuda_status", _granary.cuda_status())
except Exception as e:
    print("granary: ", repr(e))
EOF
} >"$OUT/env.txt" 2>&1
log "env:"
grep -E "^(GPU |gpu |python |torch|transformers|granary|all resolved|.*not found|.*cannot)" "$OUT/env.txt" |
  sed 's/^/    /' | tee -a "$SUMMARY"

EKV=(bench/engine_kv.py --device cuda)

# ---- limits (before the store: nothing else on the machine)
step limits 90 2 "$PY" "${EKV[@]}" --limits-only --prompt-tokens "$LIMIT_TOKENS" --repeats 5 \
  --json "$OUT/limits.json"

# ---- the store
shm_mib=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print int($4 / 1024)}')
seg=$SEG_MIB
if [[ -n $shm_mib ]] && ((shm_mib - 1024 < seg)); then
  seg=$((shm_mib - 1024))
  log "/dev/shm has ${shm_mib} MiB free: the segment is ${seg} MiB"
fi
if ((seg < 3072)); then
  log "FAIL store: /dev/shm (${shm_mib:-?} MiB free) is too small for the store's segment"
  exit 1
fi
ports=$("$PY" -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
read -r MPORT HPORT <<<"$ports"
MASTER=127.0.0.1:$MPORT
log "RUN  store: granary-node --standalone, segment ${seg} MiB, master $MASTER"
"$BIN/granary-node" --standalone --master-port "$MPORT" --http-port "$HPORT" \
  --segment-size "${seg}MiB" --prefault="$PREFAULT" --log-level warn >"$OUT/store.log" 2>&1 &
NODE_PID=$!
ready=
for _ in $(seq 1200); do  # 120 s: prefaulting 16 GiB takes a few
  if grep -q "granary-node ready" "$OUT/store.log"; then ready=1; break; fi
  kill -0 "$NODE_PID" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $ready ]]; then
  log "FAIL store: not ready; store.log:"
  tail -n 20 "$OUT/store.log" | sed 's/^/    /' | tee -a "$SUMMARY"
  exit 1
fi
log "OK   store: $(grep "granary-node ready" "$OUT/store.log")"
STORE=(--master "$MASTER" --segment-mib 0)

# ---- the engine-shaped runs
for n in $RUN_TOKENS; do
  limit=150
  ((n > 4096)) && limit=200
  step "kv-$n" "$limit" 12 "$PY" "${EKV[@]}" "${STORE[@]}" --prompt-tokens "$n" \
    --json "$OUT/kv-$n.json"
done

if "$PY" -c "import transformers" >/dev/null 2>&1; then
  step model 240 4 "$PY" "${EKV[@]}" "${STORE[@]}" --prompt-tokens "$EXTRA_TOKENS" --paths none \
    --model-check --repeats 2 --json "$OUT/model.json"
else
  log "SKIP model: transformers does not import"
fi

step python-bench 90 20 "$PY" bench/python_bench.py --master "$MASTER" --seconds 0.25 \
  --sizes 64KiB,1MiB,4MiB --json "$OUT/python-bench.json"

step "kv-$EXTRA_TOKENS-opp" 90 12 "$PY" "${EKV[@]}" "${STORE[@]}" --prompt-tokens "$EXTRA_TOKENS" \
  --object-per-page --json "$OUT/kv-$EXTRA_TOKENS-opp.json"
step "kv-$EXTRA_TOKENS-p16" 90 12 "$PY" "${EKV[@]}" "${STORE[@]}" --prompt-tokens "$EXTRA_TOKENS" \
  --page-tokens 16 --json "$OUT/kv-$EXTRA_TOKENS-p16.json"

stop_store
log "done: $FAILED step(s) failed; logs and JSON in $OUT"
((FAILED == 0))
