#!/usr/bin/env bash
# What the cluster's secret, tenants and TLS cost (docs/security.md): the same cases against a
# store without a secret, one started with --auth-token-file, one with a tenants file whose
# tenant's token the client presents, and one with the secret and mutual TLS on the control plane
# (a CA made here with openssl), alternated (open, secret, tenant, tls, open, ...) so that a drift
# of the machine hits each. Cases: object puts and gets of 64 KiB (Granary shm and TCP, one
# client: `granary-bench kv`; a tenant maps no segment, so its "shm" case moves bytes over TCP)
# and metadata batches of 128 keys (`granary-bench master`, one thread, fast port and gRPC; not
# for the tenant, whose token may not mount the benchmark's segments). The machine's limits
# (memcpy, loopback TCP) are measured first in the same run. Prints a markdown table; the raw
# JSON stays in bench/results/security-<stamp>/.
#
#   bench/security.sh [--seconds S] [--rounds N]      # defaults: 2 s a case, 2 rounds a mode
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${GRANARY_BIN:-build/bin}
SECONDS_PER_CASE=2
ROUNDS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_PER_CASE=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
source bench/lib.sh
STAMP=$(date -u +%Y-%m-%dT%H%M%SZ)
OUT=bench/results/security-$STAMP
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/granary-bench-security.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
SECRET="$WORK/secret"
( umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SECRET"
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$WORK/tenant-token"
  printf 'bench %s 64GiB\n' "$(cat "$WORK/tenant-token")" > "$WORK/tenants" )

# A CA and one certificate for 127.0.0.1 (master, node and bench present it), for the tls mode.
( cd "$WORK" && umask 077 && printf 'subjectAltName=IP:127.0.0.1\n' > san.cnf &&
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem \
    -days 1 -subj /CN=bench-ca &&
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout peer.key -out peer.csr \
    -subj /CN=bench-peer &&
  openssl x509 -req -in peer.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out peer.pem -days 1 \
    -extfile san.cnf ) > "$WORK/pki.log" 2>&1
TLS_FLAGS=(--tls-cert "$WORK/peer.pem" --tls-key "$WORK/peer.key" --tls-ca "$WORK/ca.pem")

"$BIN/granary-bench" limits --seconds 1 --disk-bytes $((64 << 20)) --json "$OUT/limits.json" > "$OUT/limits.txt"

# run_mode MODE ROUND: a fresh master and node; the object and metadata cases against them.
run_mode() {
  local mode=$1 round=$2 flags=() master_flags=() env_file=""
  if [ "$mode" != open ]; then flags=(--auth-token-file "$SECRET"); env_file=$SECRET; fi
  master_flags=("${flags[@]}")
  if [ "$mode" = tenant ]; then
    master_flags+=(--tenants-file "$WORK/tenants")
    env_file=$WORK/tenant-token
  fi
  unset GRANARY_TLS_CA GRANARY_TLS_CERT GRANARY_TLS_KEY
  if [ "$mode" = tls ]; then
    master_flags+=("${TLS_FLAGS[@]}")
    flags+=("${TLS_FLAGS[@]}")
    export GRANARY_TLS_CA=$WORK/ca.pem GRANARY_TLS_CERT=$WORK/peer.pem GRANARY_TLS_KEY=$WORK/peer.key
  fi
  local port http name=granary-bench-sec-$$-$mode-$round
  port=$(free_port); http=$(free_port)
  "$BIN/granary-master" --port "$port" --http-port "$http" --log-level warn "${master_flags[@]}" \
    > "$WORK/master-$mode-$round.log" 2>&1 &
  local master=$!; PIDS+=("$master")
  wait_for_health "$http"
  "$BIN/granary-node" --master "127.0.0.1:$port" --segment-size 1GiB --prefault --name "$name" \
    --log-level warn "${flags[@]}" > "$WORK/node-$mode-$round.log" 2>&1 &
  local node=$!; PIDS+=("$node")
  GRANARY_AUTH_TOKEN_FILE=$SECRET wait_for_segment "$port"
  wait_for_populated "$node" $((1 << 30))
  GRANARY_AUTH_TOKEN_FILE=$env_file "$BIN/granary-bench" kv --master "127.0.0.1:$port" \
    --targets granary-shm,granary-tcp --sizes 64KiB --clients 1 --seconds "$SECONDS_PER_CASE" \
    --budget $((512 << 20)) --json "$OUT/kv-$mode-$round.json" > "$OUT/kv-$mode-$round.txt"
  kill -TERM "$node"; wait "$node" 2>/dev/null || true
  for path in fast grpc; do
    [ "$mode" = tenant ] && break
    GRANARY_AUTH_TOKEN_FILE=$env_file "$BIN/granary-bench" master --master "127.0.0.1:$port" \
      --segments 128 --batch 128 --value-size 4096 --threads 1 --path "$path" \
      --seconds "$SECONDS_PER_CASE" --json "$OUT/master-$path-$mode-$round.json" \
      > "$OUT/master-$path-$mode-$round.txt"
  done
  kill -TERM "$master"; wait "$master" 2>/dev/null || true
}

for round in $(seq 1 "$ROUNDS"); do
  for mode in open secret tenant tls; do
    echo "== round $round, $mode =="
    run_mode "$mode" "$round"
  done
done
echo "machine: $(machine_summary)" | tee "$OUT/machine.txt"
python3 bench/security_table.py "$OUT"
