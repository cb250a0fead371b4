#!/usr/bin/env bash
# tests/cli/cli_test.sh BIN_DIR - the `granary` command-line tool end to end.
#
# Starts a granary-master and a granary-node on free 127.0.0.1 ports, then runs every command of
# `granary` and checks its output and exit code (0 done, 1 not found, 2 bad usage, 3 other
# failure). Every wait is bounded and every command runs under `timeout`; the trap kills what this
# script started. Prints one line per check and exits non-zero if any check failed.
set -u

BIN_DIR=${1:?usage: cli_test.sh BIN_DIR}
BIN_DIR=$(cd "$BIN_DIR" && pwd)
GRANARY="$BIN_DIR/granary"
for b in granary granary-master granary-node; do
  [[ -x "$BIN_DIR/$b" ]] || { echo "FATAL: $BIN_DIR/$b not built"; exit 1; }
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/granary-cli-test-XXXXXX")
MASTER_PID=""
NODE_PID=""
NAME="cli-test-$$"
cleanup() {
  [[ -n "$NODE_PID" ]] && kill -9 "$NODE_PID" 2>/dev/null
  [[ -n "$MASTER_PID" ]] && kill -9 "$MASTER_PID" 2>/dev/null
  [[ -n "$NODE_PID" ]] && wait "$NODE_PID" 2>/dev/null
  [[ -n "$MASTER_PID" ]] && wait "$MASTER_PID" 2>/dev/null
  rm -f "/dev/shm/granary-$NAME"
  if [[ -n "${GRANARY_IT_KEEP_TMP:-}" ]]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

FAILURES=0
CHECKS=0
pass() { CHECKS=$((CHECKS + 1)); echo "ok   - $1"; }
fail() { CHECKS=$((CHECKS + 1)); FAILURES=$((FAILURES + 1)); echo "FAIL - $1"; }

# A free port below the kernel's ephemeral range (no outgoing connection can take it before the
# master binds it), at random; the kernel's pick if that range is too small.
free_port() {
  python3 - <<'PY'
import random, socket
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
for attempt in range(1000):
    port = random.randrange(10000, low) if low - 10000 >= 2000 and attempt < 900 else 0
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(s.getsockname()[1])
        break
PY
}
MASTER_PORT=$(free_port)
HTTP_PORT=$(free_port)
while [[ "$HTTP_PORT" == "$MASTER_PORT" ]]; do HTTP_PORT=$(free_port); done
MASTER="127.0.0.1:$MASTER_PORT"

# wait_for SECONDS COMMAND...: polls every 0.1 s until COMMAND succeeds.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  while ((SECONDS < deadline)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  "$@" >/dev/null 2>&1
}

# g ARGS...: runs granary against the test master with a bounded time; sets OUT, ERR, RC.
g() {
  timeout 30 "$GRANARY" --master "$MASTER" --timeout-ms 3000 "$@" >"$WORK/out" 2>"$WORK/err"
  RC=$?
  OUT=$(cat "$WORK/out")
  ERR=$(cat "$WORK/err")
}
# expect_rc WANT DESCRIPTION
expect_rc() {
  if [[ "$RC" == "$1" ]]; then pass "$2 (exit $RC)"; else fail "$2: exit $RC, want $1; stderr: $ERR"; fi
}
# expect_contains HAYSTACK NEEDLE DESCRIPTION
expect_contains() {
  if [[ "$1" == *"$2"* ]]; then pass "$3"; else fail "$3: '$2' not in: $1"; fi
}
one_line_stderr() {
  local lines
  lines=$(printf '%s' "$ERR" | grep -c '')
  if [[ "$lines" == 1 ]]; then pass "$1: one line on stderr"; else fail "$1: $lines lines on stderr: $ERR"; fi
}

# ---- the store ----
mkdir -p "$WORK/disk"
"$BIN_DIR/granary-master" --host 127.0.0.1 --port "$MASTER_PORT" --http-port "$HTTP_PORT" \
  --log-level warn >"$WORK/master.log" 2>&1 &
MASTER_PID=$!
if ! wait_for 10 "$GRANARY" --master "$MASTER" --timeout-ms 1000 health; then
  echo "FATAL: the master did not answer within 10 s"; cat "$WORK/master.log"; exit 1
fi
"$BIN_DIR/granary-node" --master "$MASTER" --segment-size 64MB --name "$NAME" --host 127.0.0.1 \
  --port 0 --heartbeat-interval 200ms --disk-dir "$WORK/disk" --disk-size 64MiB \
  --offload-interval 100ms --log-level warn >"$WORK/node.log" 2>&1 &
NODE_PID=$!
if ! wait_for 10 grep -q "granary-node ready" "$WORK/node.log"; then
  echo "FATAL: the node did not get ready within 10 s"; cat "$WORK/node.log"; exit 1
fi

# ---- put from a file and from stdin ----
head -c 300000 /dev/urandom >"$WORK/blob"
g put cli/file "$WORK/blob"
expect_rc 0 "put from a file"
printf 'hello from stdin\n' >"$WORK/stdin-value"
timeout 30 "$GRANARY" --master "$MASTER" put cli/stdin <"$WORK/stdin-value" 2>"$WORK/err"
RC=$?; ERR=$(cat "$WORK/err")
expect_rc 0 "put from stdin (no file argument)"
printf 'dash value' | timeout 30 "$GRANARY" --master "$MASTER" put cli/dash - 2>"$WORK/err"
RC=$?; ERR=$(cat "$WORK/err")
expect_rc 0 "put from stdin (-)"
g put cli/replicated "$WORK/blob" --replicas 2
expect_rc 0 "put --replicas 2 with one node (best effort)"
g put cli/file "$WORK/stdin-value"
expect_rc 0 "put of an existing key"
g put cli/missing-file "$WORK/does-not-exist"
expect_rc 3 "put of an unreadable file"

# ---- get to stdout and with -o ----
timeout 30 "$GRANARY" --master "$MASTER" get cli/file >"$WORK/got-stdout" 2>"$WORK/err"
RC=$?; ERR=$(cat "$WORK/err")
expect_rc 0 "get to stdout"
if cmp -s "$WORK/blob" "$WORK/got-stdout"; then pass "get to stdout: same bytes (and put kept the first value)"; else fail "get to stdout: bytes differ"; fi
g get cli/file -o "$WORK/got-file"
expect_rc 0 "get -o FILE"
if cmp -s "$WORK/blob" "$WORK/got-file"; then pass "get -o: same bytes"; else fail "get -o: bytes differ"; fi
[[ -z "$OUT" ]] && pass "get -o prints nothing on stdout" || fail "get -o printed: $OUT"
g get cli/stdin
expect_rc 0 "get of the stdin object"
if cmp -s "$WORK/stdin-value" "$WORK/out"; then pass "stdin object: same bytes"; else fail "stdin object: bytes differ"; fi
g get cli/dash
[[ "$OUT" == "dash value" ]] && pass "put - stored stdin" || fail "put - stored '$OUT'"
g put cli/upserted "$WORK/stdin-value"
printf 'new value' >"$WORK/new-value"
g put cli/upserted "$WORK/new-value" --upsert
expect_rc 0 "put --upsert"
g get cli/upserted
[[ "$OUT" == "new value" ]] && pass "--upsert replaced the value" || fail "--upsert left '$OUT'"

# ---- a missing key ----
g get cli/never-stored
expect_rc 1 "get of a missing key"
one_line_stderr "get of a missing key"
expect_contains "$ERR" "cli/never-stored" "the message names the key"
[[ -z "$OUT" ]] && pass "nothing on stdout for a missing key" || fail "stdout for a missing key: $OUT"
g get cli/never-stored -o "$WORK/should-not-exist"
expect_rc 1 "get -o of a missing key"
[[ ! -e "$WORK/should-not-exist" ]] && pass "get -o of a missing key creates no file" || fail "get -o of a missing key created the file"

# ---- put --persistence (the master's default is lazy: below its watermark nothing goes to disk) ----
printf 'to disk soon' >"$WORK/small"
g put cli/eager "$WORK/small" --persistence eager
expect_rc 0 "put --persistence eager"
g put cli/lazy "$WORK/small" --persistence lazy
expect_rc 0 "put --persistence lazy"
on_disk() { "$GRANARY" --master "$MASTER" --timeout-ms 3000 stat "$1" | grep -q "disk_replicas: 1"; }
if wait_for 15 on_disk cli/eager; then pass "an eager put gets a disk replica"; else
  fail "an eager put gets no disk replica within 15 s"; fi
sleep 0.5  # several offload rounds after the eager one's
g stat cli/lazy
expect_contains "$OUT" "disk_replicas: 0" "a lazy put stays in memory while memory is not under pressure"
g put cli/bad "$WORK/small" --persistence sometimes
expect_rc 2 "put --persistence with an unknown policy"

# ---- stat ----
g stat cli/file
expect_rc 0 "stat"
expect_contains "$OUT" "size: 300000" "stat shows the size"
expect_contains "$OUT" "replicas: 1" "stat shows the replica count"
expect_contains "$OUT" "segment $NAME" "stat shows the replica's segment"
expect_contains "$OUT" "state: COMPLETE" "stat shows the state"
g stat cli/never-stored
expect_rc 1 "stat of a missing key"

# ---- ls ----
g ls
expect_rc 0 "ls"
for k in cli/file cli/stdin cli/dash cli/replicated cli/upserted; do
  expect_contains "$OUT" "$k" "ls lists $k"
done
g ls '^cli/d'
expect_rc 0 "ls REGEX"
expect_contains "$OUT" "cli/dash" "ls REGEX lists the match"
[[ "$OUT" != *"cli/file"* ]] && pass "ls REGEX leaves out the rest" || fail "ls REGEX listed cli/file: $OUT"
[[ "$(printf '%s\n' "$OUT" | grep -c .)" == 1 ]] && pass "ls REGEX: exactly one line" || fail "ls REGEX: $OUT"
g ls 'nothing-matches-this$'
expect_rc 0 "ls with no match"
[[ -z "$OUT" ]] && pass "ls with no match prints nothing" || fail "ls with no match printed: $OUT"
g ls '(unclosed'
[[ "$RC" == 2 || "$RC" == 3 ]] && pass "ls with an invalid regex fails (exit $RC)" || fail "ls with an invalid regex: exit $RC"

# ---- rm ----
g rm cli/dash
expect_rc 0 "rm"
g get cli/dash
expect_rc 1 "get after rm"
g rm cli/dash
expect_rc 1 "rm of a missing key"
one_line_stderr "rm of a missing key"

# ---- nodes and health ----
g nodes
expect_rc 0 "nodes"
expect_contains "$OUT" "$NAME" "nodes shows the segment"
expect_contains "$OUT" "SEGMENT" "nodes prints a header"
g health
expect_rc 0 "health"
expect_contains "$OUT" "OK" "health says OK"
expect_contains "$OUT" "1 segment" "health counts the segment"

GRANARY_MASTER="$MASTER" timeout 30 "$GRANARY" health >"$WORK/out" 2>"$WORK/err"
RC=$?; ERR=$(cat "$WORK/err")
expect_rc 0 "health with the master from \$GRANARY_MASTER"

# ---- top (docs/operations.md): frames within 80 columns, the node's row, the hit rate ----
# No --http: top reads /metrics at the HTTP port the master reports (not the default 9003).
g top -b -n 2 -d 0.5
expect_rc 0 "top -b -n 2 -d 0.5"
LONG=$(printf '%s\n' "$OUT" | awk 'length($0) > 80')
[[ -z "$LONG" ]] && pass "top: every line within 80 columns" || fail "top: lines past 80 columns: $LONG"
FRAMES=$(printf '%s\n' "$OUT" | grep -c '^granary top - master 127.0.0.1')
[[ "$FRAMES" == 2 ]] && pass "top -n 2 prints two frames" || fail "top -n 2 printed $FRAMES frames: $OUT"
ROW=$(printf '%s\n' "$OUT" | grep "^$NAME " | tail -1)
[[ "$ROW" =~ [0-9.]+%\ +[0-9]+\ +ok$ ]] && pass "top shows the node's row: $ROW" \
  || fail "no row of $NAME with usage and state ok: $OUT"
GETS=$(printf '%s\n' "$OUT" | grep '^gets ' | tail -1)
[[ "$GETS" =~ since\ start\ ([0-9.]+)% ]] && [[ "${BASH_REMATCH[1]}" =~ [1-9] ]] \
  && pass "top: the gets above give a hit rate: $GETS" || fail "top: no hit rate in: $OUT"
[[ "$OUT" != *"no counters"* ]] && pass "top read the master's /metrics at the port it reports" || fail "top: $OUT"
# Rates: one get and one put while top samples every second; once both are done, two more
# frames cover them, then top is stopped (SIGTERM ends it like 'q'). A CLI call takes seconds
# under ThreadSanitizer, so nothing here bets on how long one takes.
timeout 120 "$GRANARY" --master "$MASTER" --timeout-ms 3000 top -b -n 100 -d 1 \
  --http "127.0.0.1:$HTTP_PORT" >"$WORK/top" 2>&1 &
TOP_PID=$!
wait_for 20 grep -q '^SEGMENT' "$WORK/top"
g get cli/file
g put cli/top-put "$WORK/stdin-value"
frames_at_least() { (( $(grep -c '^SEGMENT' "$WORK/top") >= $1 )); }
FRAMES=$(grep -c '^SEGMENT' "$WORK/top")
wait_for 30 frames_at_least $((FRAMES + 2))
kill -TERM "$TOP_PID" 2>/dev/null
wait "$TOP_PID"
RC=$?; ERR=$(cat "$WORK/top")
expect_rc 0 "top -b -d 1, stopped by SIGTERM"
grep -Eq '^gets [0-9.]*[1-9][0-9.]*/s +hit 100\.0% \(memory 100\.0%' "$WORK/top" \
  && pass "top: a frame with a get rate, all memory hits" || fail "top: get rate: $ERR"
grep -Eq '^puts [^ ]+ +read [1-9][0-9.]* ([KMG]i)?B/s' "$WORK/top" \
  && pass "top: a frame with read throughput" || fail "top: read throughput: $ERR"
grep -Eq '^puts [0-9.]*[1-9][0-9.]*/s +read [^ ]+( ([KMG]i)?B/s)? +write [1-9]' "$WORK/top" \
  && pass "top: a frame with a put rate and write throughput" || fail "top: puts line: $ERR"
g top -d 0
expect_rc 2 "top -d 0"

# ---- bad usage: exit 2 ----
g
expect_rc 2 "no subcommand"
g frobnicate
expect_rc 2 "unknown subcommand"
g get
expect_rc 2 "get without a key"
g put
expect_rc 2 "put without a key"
g get cli/file --no-such-flag
expect_rc 2 "unknown flag"
g put cli/x "$WORK/blob" --replicas notanumber
expect_rc 2 "non-numeric --replicas"
timeout 30 "$GRANARY" --help >"$WORK/out" 2>&1
RC=$?
expect_rc 0 "--help"

# ---- a master that requires the cluster's secret (docs/security.md) ----
SECURE_PORT=$(free_port)
SECURE_HTTP=$(free_port)
SECRET_FILE="$WORK/secret"
( umask 077; echo "cli-test-secret-0123456789abcdef" >"$SECRET_FILE"
  echo "cli-test-admin-0123456789abcdef0" >"$WORK/admin"
  echo "cli-test-acme-0123456789abcdef00" >"$WORK/acme"
  printf 'acme %s 64MiB\nglobex cli-test-globex-0123456789abcdef\n' "$(cat "$WORK/acme")" \
    >"$WORK/tenants" )
"$BIN_DIR/granary-master" --host 127.0.0.1 --port "$SECURE_PORT" --http-port "$SECURE_HTTP" \
  --auth-token-file "$SECRET_FILE" --admin-token-file "$WORK/admin" \
  --tenants-file "$WORK/tenants" --log-level warn >"$WORK/secure-master.log" 2>&1 &
SECURE_PID=$!
sg() {  # granary against the secure master; the caller adds the secret's flags
  timeout 30 "$GRANARY" --master "127.0.0.1:$SECURE_PORT" --timeout-ms 3000 "$@" \
    >"$WORK/out" 2>"$WORK/err"
  RC=$?
  OUT=$(cat "$WORK/out")
  ERR=$(cat "$WORK/err")
}
if wait_for 10 env GRANARY_AUTH_TOKEN_FILE="$SECRET_FILE" "$GRANARY" \
    --master "127.0.0.1:$SECURE_PORT" --timeout-ms 1000 health; then
  sg health
  expect_rc 3 "health without the secret"
  expect_contains "$ERR" "UNAUTHENTICATED" "health without the secret says UNAUTHENTICATED"
  one_line_stderr "health without the secret"
  sg --auth-token-file "$SECRET_FILE" health
  expect_rc 0 "health with --auth-token-file"
  GRANARY_AUTH_TOKEN_FILE="$SECRET_FILE" sg ls
  expect_rc 0 "ls with GRANARY_AUTH_TOKEN_FILE"
  cp "$SECRET_FILE" "$WORK/loose" && chmod 644 "$WORK/loose"
  sg --auth-token-file "$WORK/loose" health
  expect_rc 3 "a secret file others can read"
  expect_contains "$ERR" "chmod 600" "a secret file others can read: says chmod 600"
  if [[ "$ERR" == *cli-test-secret* ]]; then fail "the secret is printed"; else pass "the secret is never printed"; fi
  # Roles and tenants: who each secret names, what each may see and do.
  sg --auth-token-file "$SECRET_FILE" whoami
  expect_rc 0 "whoami with the cluster's secret"
  expect_contains "$OUT" "member" "the cluster's secret names a member (an admin secret is set)"
  sg --auth-token-file "$WORK/acme" whoami
  expect_contains "$OUT" "tenant acme" "a tenant's token names its tenant"
  sg --auth-token-file "$WORK/admin" tenants
  expect_rc 0 "tenants as the admin"
  expect_contains "$OUT" "globex" "the admin sees every tenant"
  expect_contains "$OUT" "64 MiB" "with its quota"
  sg --auth-token-file "$WORK/acme" tenants
  expect_rc 0 "tenants as a tenant"
  if [[ "$OUT" == *globex* ]]; then fail "a tenant sees another tenant"; else pass "a tenant sees only itself"; fi
  sg --auth-token-file "$WORK/acme" rm some/key --force
  expect_rc 3 "a forced rm by a tenant"
  expect_contains "$ERR" "PERMISSION_DENIED" "a forced rm by a tenant says PERMISSION_DENIED"
  one_line_stderr "a forced rm by a tenant"
  sg --auth-token-file "$WORK/acme" drain any-segment
  expect_rc 3 "a drain by a tenant"
  expect_contains "$ERR" "PERMISSION_DENIED" "a drain by a tenant says PERMISSION_DENIED"
else
  fail "the master with a secret did not answer within 10 s: $(tail -3 "$WORK/secure-master.log")"
fi
kill -9 "$SECURE_PID" 2>/dev/null; wait "$SECURE_PID" 2>/dev/null

# ---- replica counts and drains (docs/operations.md) ----
g replicate cli/file 1
expect_rc 0 "replicate to 1"
g replicate cli/file 2 --wait 1
expect_rc 3 "replicate --wait past what one node can hold"
expect_contains "$ERR" "1 of 2 replicas" "replicate --wait says how far it got"
g stat cli/file
expect_contains "$OUT" "wanted_replicas: 2" "stat shows the wanted replica count"
expect_contains "$OUT" "replicas: 1" "stat still shows the replicas there are"
g replicate cli/never-stored 2
expect_rc 1 "replicate of a missing key"
g replicate cli/file 0
expect_rc 2 "replicate to 0"
g drain cli-no-such-segment
expect_rc 3 "drain of an unknown segment"
one_line_stderr "drain of an unknown segment"
g undrain cli-no-such-segment
expect_rc 3 "undrain of a segment not draining"
g drain "$NAME"
expect_rc 0 "drain"
# The only segment: nowhere to copy cli/file to, so the drain waits and says so.
g nodes
expect_contains "$OUT" "draining $NAME" "nodes shows the drain"
g top -b -n 1 --http "127.0.0.1:$HTTP_PORT"
ROW=$(printf '%s\n' "$OUT" | grep "^$NAME " | tail -1)
[[ "$ROW" =~ draining\ [0-9]+$ ]] && pass "top shows the drain: $ROW" || fail "top: no draining row: $OUT"
expect_contains "$OUT" "(1 draining," "top counts the draining segment"
g drain "$NAME"
expect_rc 3 "drain twice"
g undrain "$NAME"
expect_rc 0 "undrain"
g drain "$NAME" --drop
expect_rc 0 "drain --drop"
g nodes
if printf '%s\n' "$OUT" | grep -q "^$NAME "; then fail "a dropped segment is still listed: $OUT"; else pass "drain --drop unmounts at once"; fi
expect_contains "$OUT" "drained $NAME: unmounted" "nodes lists the drained segment's name"
g undrain "$NAME"
expect_rc 0 "undrain of a drained segment"
g nodes
if [[ "$OUT" == *"drained $NAME"* ]]; then fail "nodes lists an undrained name: $OUT"; else pass "undrain: nodes lists the name no more"; fi

# ---- master down: exit 3 ----
kill -TERM "$MASTER_PID"
if timeout 10 tail --pid="$MASTER_PID" -f /dev/null; then
  wait "$MASTER_PID" 2>/dev/null
  RC=$?; ERR="(master log) $(tail -3 "$WORK/master.log")"
  expect_rc 0 "granary-master exits 0 on SIGTERM"
  MASTER_PID=""
else
  fail "granary-master still running 10 s after SIGTERM"
fi
g health
expect_rc 3 "health with the master stopped"
one_line_stderr "health with the master stopped"
g get cli/file
expect_rc 3 "get with the master stopped (an error, not a miss)"
g put cli/late "$WORK/blob"
expect_rc 3 "put with the master stopped"
g ls
expect_rc 3 "ls with the master stopped"
g top -b -n 2 -d 0.2
expect_rc 3 "top -n 2 with the master stopped"
ERRORS=$(printf '%s\n' "$OUT" | grep -c '^error: ')
[[ "$ERRORS" == 2 ]] && pass "top keeps asking and shows the error in each frame" \
  || fail "top with the master stopped: $ERRORS error lines in: $OUT"

echo "$CHECKS checks, $FAILURES failed"
((FAILURES == 0))
