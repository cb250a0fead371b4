#!/usr/bin/env bash
# tests/hosts/hosts_test.sh BIN_DIR [replicas|netem] - a store of several hosts on one machine.
#
# Each "host" is a process holding network, mount, UTS and IPC namespaces of its own: its own
# hostname, its own 10.77.0.x address on a veth whose other end is on a bridge in a "router"
# namespace, and its own tmpfs on /dev/shm. So a client shares neither a /dev/shm nor a hostname
# with any node, and Granary's same-host test (common/host.h: hostname, boot id, the /dev/shm
# device) must send every byte over TCP. Hosts: master (10.77.0.1), node1-3 (.11-.13, one
# granary-node each), clienta and clientb (.21, .22). Everything runs under the cluster's secret.
#
#   replicas  puts from clienta with 2 replicas, byte-exact gets from clientb (pattern per key,
#             digest of all bytes, and a `granary put`/`get` file compared by sha256); objects
#             spread over the three node hosts; the clients moved every byte over TCP and mapped
#             no shared memory; each node's /metrics counted the bytes; each host's /dev/shm holds
#             only its own segment; a client inside node1's host does use node1's shared memory
#             (so the checks above can tell). Then node2 is killed with -9: every object is read
#             from its other replica at once, node2's segment is dropped, and the copies the
#             surviving nodes make bring every object back to 2 replicas, read exact again.
#   netem     `tc netem delay` on node3's link: the TCP round trip to node3 grows by the delay
#             (and not to node1), and puts and gets through the delayed link stay byte-exact.
#
# Exit 0 passed, 1 failed, 77 skipped: not root, a tool missing, or the machine forbids what
# the hosts need (unshare, veth, bridges, tmpfs mounts; for `netem`, the sch_netem qdisc); the
# reason is printed. Every wait is bounded and every client command runs under `timeout`.
# Namespaces have no names: they go when their processes do. The trap kills what this run
# started; each host's holder kills its processes if this script dies unseen; and a new run
# kills processes left by runs whose script is gone (marked with GRANARY_HOSTS_RUN in their
# environment) and removes their work directories.
# `COND && pass ... || fail ...` is meant: pass only prints (SC2015); the single-quoted scripts
# run in the hosts' shells (SC2016).
# shellcheck disable=SC2015,SC2016
set -u
export PATH="$PATH:/usr/sbin:/sbin"
T0=$SECONDS
say() { printf '[%3ds] %s\n' $((SECONDS - T0)) "$*"; }

BIN_DIR=${1:?usage: hosts_test.sh BIN_DIR [replicas|netem]}
CASE=${2:-replicas}
SKIP=77
skip() { echo "SKIP: $*"; exit "$SKIP"; }
[[ "$CASE" == replicas || "$CASE" == netem ]] || { echo "unknown case $CASE"; exit 2; }
BIN_DIR=$(cd "$BIN_DIR" && pwd)
for b in granary granary-master granary-node granary-test-worker; do
  [[ -x "$BIN_DIR/$b" ]] || { echo "FATAL: $BIN_DIR/$b not built"; exit 1; }
done
[[ $(id -u) == 0 ]] || skip "needs root: network and mount namespaces, veth pairs, tmpfs mounts"
for tool in unshare nsenter ip timeout curl sha256sum; do
  command -v "$tool" >/dev/null || skip "$tool not found"
done
[[ "$CASE" != netem ]] || command -v tc >/dev/null || skip "tc not found (iproute2)"

# ---- runs of this test that died unseen: kill what they left ----
RUN=$$
export GRANARY_HOSTS_RUN=$RUN
# shellcheck disable=SC2013
for env_file in $(grep -lsz '^GRANARY_HOSTS_RUN=' /proc/[0-9]*/environ); do
  p=${env_file#/proc/}; p=${p%/environ}
  owner=$({ tr '\0' '\n' <"$env_file"; } 2>/dev/null | sed -n 's/^GRANARY_HOSTS_RUN=//p')
  [[ -n "$owner" && "$owner" != "$RUN" ]] || continue
  kill -0 "$owner" 2>/dev/null || { echo "killing $p, left by hosts test run $owner"; kill -9 "$p" 2>/dev/null; }
done

for d in "${TMPDIR:-/tmp}"/granary-hosts-[0-9]*-*; do
  owner=${d##*/granary-hosts-}; owner=${owner%%-*}
  [[ -d "$d" && "$owner" != "$RUN" ]] && ! kill -0 "$owner" 2>/dev/null && rm -rf "$d"
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/granary-hosts-$RUN-XXXXXX")
SECRET="$WORK/secret"
(umask 077; echo "hosts-test-$RUN-secret-0123456789abcdef" >"$SECRET")
export GRANARY_AUTH_TOKEN_FILE="$SECRET"
declare -A HOLDER=()  # host name -> pid of the process holding its namespaces
DAEMONS=()            # pids of masters and nodes (their own pids: nsenter execs them)
# pids_in_netns INODE...: the pids of every process in the network namespaces of those inodes.
pids_in_netns() {
  stat -L -c '%i %n' /proc/[0-9]*/ns/net 2>/dev/null |
    awk -v set=" $* " 'index(set, " " $1 " ") {split($2, part, "/"); print part[3]}'
}
cleanup() {
  local p root inodes=()
  exec 2>/dev/null  # not bash's "Killed" line for each process killed here
  for p in "${DAEMONS[@]}"; do kill -9 "$p"; done
  # Whatever else runs in the hosts (the machine's own namespace is never one of them).
  root=$(stat -L -c %i /proc/$$/ns/net)
  for p in "${HOLDER[@]}"; do
    p=$(stat -L -c %i "/proc/$p/ns/net") && [[ "$p" != "$root" ]] && inodes+=("$p")
  done
  ((${#inodes[@]} > 0)) && pids_in_netns "${inodes[@]}" | xargs -r kill -9
  for p in "${HOLDER[@]}"; do kill -9 "$p"; done
  for p in "${DAEMONS[@]}" "${HOLDER[@]}"; do wait "$p" 2>/dev/null; done
  if [[ -n "${GRANARY_IT_KEEP_TMP:-}" ]]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
  say "cleaned up"
}
trap cleanup EXIT

FAILURES=0
CHECKS=0
pass() { CHECKS=$((CHECKS + 1)); echo "ok   - $1"; }
fail() { CHECKS=$((CHECKS + 1)); FAILURES=$((FAILURES + 1)); echo "FAIL - $1"; }
fatal() { echo "FATAL: $*"; exit 1; }

# wait_for SECONDS COMMAND...: polls every 0.2 s until COMMAND succeeds.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  while ((SECONDS < deadline)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  "$@" >/dev/null 2>&1
}

# ---- hosts ----
# start_host NAME: a holder process in new namespaces with hostname hosts-NAME-$RUN, a fresh
# tmpfs on /dev/shm and loopback up. It lives while this script does; then it kills whatever
# still runs in its network namespace and exits, and the namespaces go with the last process.
start_host() {
  local name=$1
  unshare --mount --uts --net --ipc --propagation private sh -c '
    set -e
    hostname "$1"
    mount -t tmpfs -o size=512m,mode=1777 "granary-hosts-$2" /dev/shm
    ip link set lo up
    echo ready >"$3"
    set +e
    while kill -0 "$2" 2>/dev/null; do sleep 1; done
    me=$(stat -L -c %i /proc/$$/ns/net)
    pids=$(stat -L -c "%i %n" /proc/[0-9]*/ns/net 2>/dev/null |
           awk -v me="$me" "\$1 == me {split(\$2, part, \"/\"); print part[3]}")
    for p in $pids; do [ "$p" != $$ ] && kill -9 "$p" 2>/dev/null; done
    exit 0' holder "hosts-$name-$RUN" "$RUN" "$WORK/$name.ready" >"$WORK/$name.holder.log" 2>&1 &
  HOLDER[$name]=$!
  local deadline=$((SECONDS + 10))
  while [[ ! -e "$WORK/$name.ready" ]] && kill -0 "${HOLDER[$name]}" 2>/dev/null &&
        ((SECONDS < deadline)); do
    sleep 0.1
  done
  if [[ ! -e "$WORK/$name.ready" ]]; then
    skip "cannot make a host of namespaces (unshare --mount --uts --net --ipc, tmpfs on" \
      "/dev/shm, loopback up): $(tr '\n' ' ' <"$WORK/$name.holder.log")"
  fi
}
# in_host NAME COMMAND...: runs COMMAND in host NAME's namespaces. nsenter execs COMMAND, so
# `in_host NAME CMD &` would give the pid of a subshell: daemons use `nsenter $(ns_of NAME)`.
ns_of() { echo "-t ${HOLDER[$1]} -m -u -n -i --"; }
in_host() {
  local name=$1; shift
  # shellcheck disable=SC2046
  nsenter $(ns_of "$name") "$@"
}
# try_setup WHAT COMMAND...: a setup step whose failure means the machine forbids it: skip.
try_setup() {
  local what=$1 err; shift
  if ! err=$("$@" 2>&1); then skip "$what: $err"; fi
}

declare -A ADDR=([master]=10.77.0.1 [node1]=10.77.0.11 [node2]=10.77.0.12 [node3]=10.77.0.13
                 [clienta]=10.77.0.21 [clientb]=10.77.0.22)
HOSTS=(master node1 node2 node3 clienta clientb)
say "making hosts ${HOSTS[*]} and a router (run $RUN, work dir $WORK)"
start_host router
if [[ "$CASE" == netem ]]; then
  try_setup "tc netem (the sch_netem qdisc; a kernel without it cannot delay packets)" \
    in_host router tc qdisc add dev lo root netem delay 1ms
  in_host router tc qdisc del dev lo root 2>/dev/null
fi
for h in "${HOSTS[@]}"; do start_host "$h"; done
say "hosts up"
# The router's bridge, and a veth pair per host made inside the router's namespace and moved
# out at once (no name ever in the machine's own namespace), in one `ip -batch`.
links="link add br0 type bridge
link set br0 up"
port=0
for h in "${HOSTS[@]}"; do
  port=$((port + 1))
  links+="
link add eth0 type veth peer name p$port
link set eth0 netns ${HOLDER[$h]}
link set p$port master br0 up"
done
try_setup "a bridge and veth pairs between network namespaces" in_host router ip -batch - <<<"$links"
for h in "${HOSTS[@]}"; do
  try_setup "an address and a link up" in_host "$h" \
    sh -c "ip addr add ${ADDR[$h]}/24 dev eth0 && ip link set eth0 up"
done
say "network up"

# The hosts are distinct in what Granary looks at: hostname and /dev/shm device.
declare -A IDENT=()
for h in "${HOSTS[@]}"; do IDENT[$h]=$(in_host "$h" sh -c 'echo "$(hostname) $(stat -c %d /dev/shm)"'); done
distinct=$(printf '%s\n' "${IDENT[@]}" "$(hostname) $(stat -c %d /dev/shm)" | awk '{print $1}' | sort -u | wc -l)
distinct_shm=$(printf '%s\n' "${IDENT[@]}" "$(hostname) $(stat -c %d /dev/shm)" | awk '{print $2}' | sort -u | wc -l)
if [[ "$distinct" == 7 && "$distinct_shm" == 7 ]]; then
  pass "six hosts and the machine: seven hostnames and seven /dev/shm devices"
else
  fail "hosts not distinct: ${IDENT[*]}"
fi

# ---- the store ----
MASTER="${ADDR[master]}:50051"
HTTP_PORT=9004
DATA_PORT=7070
# shellcheck disable=SC2046
nsenter $(ns_of master) "$BIN_DIR/granary-master" --host "${ADDR[master]}" --port 50051 --http-port 9003 \
  --auth-token-file "$SECRET" --client-ttl 6s --log-level info >"$WORK/master.log" 2>&1 &
DAEMONS+=($!)
# g HOST ARGS...: the granary CLI in HOST against the master; sets OUT, ERR and RC.
g() {
  local h=$1; shift
  in_host "$h" timeout 60 "$BIN_DIR/granary" --master "$MASTER" --timeout-ms 5000 "$@" \
    >"$WORK/out" 2>"$WORK/err"
  RC=$?; OUT=$(cat "$WORK/out"); ERR=$(cat "$WORK/err")
}
master_up() { in_host clienta timeout 5 "$BIN_DIR/granary" --master "$MASTER" --timeout-ms 1000 health; }
wait_for 15 master_up || fatal "the master at $MASTER did not answer clienta within 15 s: $(tail -5 "$WORK/master.log")"
say "master up on host master"

declare -A NODE_PID=()
start_node() {
  local h=$1
  # shellcheck disable=SC2046
  nsenter $(ns_of "$h") "$BIN_DIR/granary-node" --master "$MASTER" --host "${ADDR[$h]}" --port "$DATA_PORT" \
    --http-port "$HTTP_PORT" --segment-size 128MiB --name "hosts-$RUN-$h" \
    --heartbeat-interval 200ms --prefault=false --auth-token-file "$SECRET" --log-level info \
    >"$WORK/$h.log" 2>&1 &
  NODE_PID[$h]=$!
  DAEMONS+=($!)
}
for h in node1 node2 node3; do start_node "$h"; done
for h in node1 node2 node3; do
  wait_for 20 grep -q "granary-node ready" "$WORK/$h.log" ||
    fatal "$h did not get ready within 20 s: $(tail -5 "$WORK/$h.log")"
done
segments_mounted() { g clienta nodes; [[ $(grep -c "hosts-$RUN-node" <<<"$OUT") == "$1" ]]; }
wait_for 10 segments_mounted 3 || fatal "the master does not list 3 segments: $OUT $ERR"
say "three nodes mounted"

# worker HOST ARGS...: granary-test-worker in HOST; output in $WORK/HOST.worker, sets WOUT and RC
# and returns RC.
worker() {
  local h=$1; shift
  in_host "$h" timeout 90 "$BIN_DIR/granary-test-worker" "$@" >"$WORK/$h.worker" 2>&1
  RC=$?; WOUT=$(cat "$WORK/$h.worker")
  return "$RC"
}
field() { sed -n "s/.*[ ]$1=\([^ ]*\).*/\1/p" <<<"$2" | head -1; }  # field NAME TEXT
stats_of() { grep '^stats ' <<<"$1"; }
digest_of() { sed -n 's/^digest //p' <<<"$1"; }

# check_tcp_only WHAT OUTPUT DIRECTION: every byte over TCP, nothing mapped.
check_tcp_only() {
  local what=$1 out=$2 dir=$3 s tcp want
  s=$(stats_of "$out")
  want=$(field bytes "$s")
  tcp=$(field "tcp_$dir" "$s")
  if [[ $(field shm_written "$s") == 0 && $(field shm_read "$s") == 0 &&
        $(field shm_mappings "$s") == 0 && $(field maps_shm "$s") == 0 ]]; then
    pass "$what: no shared memory used or mapped"
  else
    fail "$what: shared memory touched from another host: $s"
  fi
  # A put writes each of its replicas: tcp_written = replicas x bytes.
  local factor=1
  [[ "$dir" == written ]] && factor=${4:-1}
  if [[ -n "$want" && "$want" -gt 0 && "$tcp" == $((want * factor)) ]]; then
    pass "$what: all $tcp bytes over TCP"
  else
    fail "$what: tcp_$dir=$tcp, want $factor x $want: $s"
  fi
}

# node_bytes HOST OP: granary_node_bytes_total{op=OP} of HOST's node, read from clienta.
node_bytes() {
  in_host clienta timeout 10 curl -sf "http://${ADDR[$1]}:$HTTP_PORT/metrics" |
    awk -v want="op=\"$2\"" 'index($1, "granary_node_bytes_total{") == 1 && index($1, want) {n += $2}
                               END {printf "%d", n}'
}

# shm_only_own: node hosts' /dev/shm hold their own segment only; the others' nothing of ours.
check_shm_files() {
  local h files want
  for h in "${HOSTS[@]}"; do
    files=$(in_host "$h" ls -A /dev/shm | tr '\n' ' ')
    case $h in
      node*) want="granary-hosts-$RUN-$h " ;;
      *) want="" ;;
    esac
    if [[ "$files" == "$want" ]]; then
      pass "$1: /dev/shm of $h holds ${want:-nothing}"
    else
      fail "$1: /dev/shm of $h holds '$files', want '$want'"
    fi
  done
  files=$(find /dev/shm -maxdepth 1 -name "*-$RUN-*" | wc -l)
  [[ "$files" == 0 ]] && pass "$1: the machine's own /dev/shm holds no segment of this run" ||
    fail "$1: the machine's own /dev/shm holds $files files of this run"
}

OBJ=(--objects 40 --min-size 32768 --max-size 3145728)

if [[ "$CASE" == replicas ]]; then
  # ---- puts from one client host, gets from another ----
  worker clienta objects put --master "$MASTER" --prefix spread "${OBJ[@]}" --replicas 2
  [[ "$RC" == 0 ]] && pass "clienta put 40 objects with 2 replicas each" || fatal "clienta put: exit $RC: $WOUT"
  PUT_OUT=$WOUT
  placed=$(grep -c "^placement hosts-$RUN-node[123] [1-9]" <<<"$PUT_OUT")
  [[ "$placed" == 3 ]] && pass "replicas on all three node hosts: $(grep '^placement' <<<"$PUT_OUT" | awk '{printf "%s=%s ", $2, $3}')" ||
    fail "replicas not on all three nodes: $(grep '^placement' <<<"$PUT_OUT" | tr '\n' ' ')"
  check_tcp_only "clienta's puts" "$PUT_OUT" written 2
  say "puts done: $(stats_of "$PUT_OUT")"

  worker clientb objects get --master "$MASTER" --prefix spread "${OBJ[@]}"
  [[ "$RC" == 0 ]] && pass "clientb read all 40 objects, every byte as put" || fail "clientb get: exit $RC: $WOUT"
  GET_OUT=$WOUT
  [[ -n "$(digest_of "$PUT_OUT")" && "$(digest_of "$PUT_OUT")" == "$(digest_of "$GET_OUT")" ]] &&
    pass "digest of the bytes got on clientb = digest of the bytes put on clienta ($(digest_of "$GET_OUT"))" ||
    fail "digests differ: put $(digest_of "$PUT_OUT"), got $(digest_of "$GET_OUT")"
  check_tcp_only "clientb's gets" "$GET_OUT" read
  say "gets done: $(stats_of "$GET_OUT")"

  # The CLI, a file and sha256 across the two client hosts.
  head -c 2500000 /dev/urandom >"$WORK/blob"
  g clienta put hosts/cli-blob "$WORK/blob" --replicas 2
  [[ "$RC" == 0 ]] && pass "granary put on clienta" || fail "granary put on clienta: exit $RC: $ERR"
  g clientb get hosts/cli-blob -o "$WORK/blob.got"
  if [[ "$RC" == 0 && "$(sha256sum <"$WORK/blob")" == "$(sha256sum <"$WORK/blob.got")" ]]; then
    pass "granary get on clientb: same sha256 as the file put on clienta"
  else
    fail "granary get on clientb: exit $RC, sha256 $(sha256sum <"$WORK/blob.got" 2>&1) vs $(sha256sum <"$WORK/blob"): $ERR"
  fi

  # The nodes saw those bytes on their data planes (TCP: a shared-memory copy passes no node).
  total_write=0; total_read=0
  for h in node1 node2 node3; do
    w=$(node_bytes "$h" write); r=$(node_bytes "$h" read)
    [[ "${w:-0}" -gt 0 ]] && pass "$h's /metrics (read from clienta): $w bytes written, $r read over TCP" ||
      fail "$h's /metrics shows no TCP writes: '$w'"
    total_write=$((total_write + ${w:-0})); total_read=$((total_read + ${r:-0}))
  done
  put_tcp=$(field tcp_written "$(stats_of "$PUT_OUT")"); get_tcp=$(field tcp_read "$(stats_of "$GET_OUT")")
  ((total_write >= put_tcp && total_read >= get_tcp)) &&
    pass "the nodes' TCP byte counters cover the clients' ($total_write >= $put_tcp written, $total_read >= $get_tcp read)" ||
    fail "node counters $total_write written / $total_read read, clients' $put_tcp / $get_tcp"

  check_shm_files "after the puts and gets"

  # A client on node1's own host does map node1's segment: the same-host path is there to be
  # taken, so the TCP-only results above come from the hosts being apart, not from the path
  # being off.
  worker node1 objects get --master "$MASTER" --prefix spread "${OBJ[@]}"
  s=$(stats_of "$WOUT")
  if [[ "$RC" == 0 && $(field shm_read "$s") -gt 0 && $(field maps_shm "$s") == 1 && $(field tcp_read "$s") -gt 0 ]]; then
    pass "a client on node1's host reads node1's replicas through shared memory, the rest over TCP ($s)"
  else
    fail "a client on node1's host: exit $RC, $s: $WOUT"
  fi

  # ---- kill -9 one node host's node ----
  kill -9 "${NODE_PID[node2]}"
  wait "${NODE_PID[node2]}" 2>/dev/null
  say "node2 killed with -9"
  # The master still names node2's replicas until --client-ttl has passed: clientb finds node2
  # refusing connections and reads those objects from their other replica.
  worker clientb objects get --master "$MASTER" --prefix spread "${OBJ[@]}"
  [[ "$RC" == 0 && "$(digest_of "$WOUT")" == "$(digest_of "$PUT_OUT")" ]] &&
    pass "with node2 dead, clientb reads all 40 objects exact from their other replicas" ||
    fail "clientb get after node2's death: exit $RC: $WOUT"
  if segments_mounted 3; then
    pass "the master still listed node2's segment after that read: its replicas were tried first-hand"
  else
    say "note: the master dropped node2 before that read ended (a slow machine): it may have" \
      "named only the surviving replicas"
  fi
  g clientb get hosts/cli-blob -o "$WORK/blob.got2"
  [[ "$RC" == 0 ]] && cmp -s "$WORK/blob" "$WORK/blob.got2" &&
    pass "granary get on clientb after node2's death: same bytes" || fail "granary get after node2's death: exit $RC: $ERR"
  wait_for 20 segments_mounted 2 && pass "the master dropped node2's segment (--client-ttl 6s)" ||
    fail "node2's segment still listed 20 s after its death: $OUT"
  # Re-replication: node1 and node3 copy, over TCP from each other's hosts, what node2 held.
  back_to_two() { worker clienta objects stat --master "$MASTER" --prefix spread "${OBJ[@]}" --replicas 2; }
  if wait_for 30 back_to_two; then
    pass "every object back to 2 replicas on node1 and node3: $(grep '^placement' "$WORK/clienta.worker" | awk '{printf "%s=%s ", $2, $3}')"
  else
    fail "objects not back to 2 replicas within 30 s: $(cat "$WORK/clienta.worker")"
  fi
  in_host clienta curl -sf "http://${ADDR[node1]}:$HTTP_PORT/metrics" >"$WORK/node1.metrics"
  in_host clienta curl -sf "http://${ADDR[node3]}:$HTTP_PORT/metrics" >"$WORK/node3.metrics"
  copied=$(cat "$WORK/node1.metrics" "$WORK/node3.metrics" | awk '$1 == "granary_node_rereplicated_objects_total" {n += $2} END {printf "%d", n}')
  [[ "$copied" -gt 0 ]] && pass "node1 and node3 made $copied copies" || fail "no copies counted by node1 and node3"
  worker clientb objects get --master "$MASTER" --prefix spread "${OBJ[@]}"
  [[ "$RC" == 0 && "$(digest_of "$WOUT")" == "$(digest_of "$PUT_OUT")" ]] &&
    pass "clientb reads all 40 objects exact from the new replicas" || fail "clientb get after re-replication: exit $RC: $WOUT"
  check_tcp_only "clientb's gets after node2's death" "$WOUT" read
fi

if [[ "$CASE" == netem ]]; then
  DELAY_MS=5
  # rtt_to FROM NODE: median TCP handshake time (ms) from host FROM to NODE's data port.
  rtt_to() {
    worker "$1" rtt --endpoint "${ADDR[$2]}:$DATA_PORT" --count 15
    [[ "$RC" == 0 ]] && sed -n 's/.*median=\([0-9.]*\).*/\1/p' <<<"$WOUT"
  }
  before=$(rtt_to clienta node3)
  try_setup "tc netem on node3's link" in_host node3 tc qdisc add dev eth0 root netem delay "${DELAY_MS}ms"
  say "netem: node3's eth0 delays what it sends by ${DELAY_MS} ms: $(in_host node3 tc qdisc show dev eth0 | head -1)"
  after=$(rtt_to clienta node3)
  other=$(rtt_to clienta node1)
  if awk -v b="${before:-x}" -v a="${after:-x}" -v o="${other:-x}" -v d="$DELAY_MS" \
      'BEGIN {exit !(b + 0 == b && a + 0 == a && o + 0 == o && b < d / 2 && a >= 0.9 * d && o < d / 2)}'; then
    pass "round trip clienta->node3 ${before} ms without netem, ${after} ms with it; clienta->node1 ${other} ms"
  else
    fail "round trips do not show the ${DELAY_MS} ms delay: node3 before '${before}', after '${after}'; node1 '${other}'"
  fi
  # One replica each: about a third of the objects live on node3 alone, so their puts and
  # gets must cross the delayed link.
  worker clienta objects put --master "$MASTER" --prefix delayed "${OBJ[@]}" --replicas 1
  [[ "$RC" == 0 ]] && pass "clienta put 40 objects through the delay" || fatal "clienta put: exit $RC: $WOUT"
  PUT_OUT=$WOUT
  on3=$(sed -n "s/^placement hosts-$RUN-node3 //p" <<<"$PUT_OUT")
  [[ "${on3:-0}" -gt 0 ]] && pass "node3 (delayed) holds $on3 of them" ||
    fail "no object on the delayed node3: $(grep '^placement' <<<"$PUT_OUT" | tr '\n' ' ')"
  check_tcp_only "clienta's puts" "$PUT_OUT" written 1
  worker clientb objects get --master "$MASTER" --prefix delayed "${OBJ[@]}"
  [[ "$RC" == 0 && "$(digest_of "$WOUT")" == "$(digest_of "$PUT_OUT")" ]] &&
    pass "clientb read all 40 objects exact (digest $(digest_of "$WOUT"))" || fail "clientb get: exit $RC: $WOUT"
  check_tcp_only "clientb's gets" "$WOUT" read
  w3=$(node_bytes node3 write); r3=$(node_bytes node3 read)
  [[ "${w3:-0}" -gt 0 && "${r3:-0}" -gt 0 ]] && pass "node3 took $w3 bytes and served $r3 over its delayed link" ||
    fail "node3's /metrics: '$w3' written, '$r3' read"
  say "puts: $(stats_of "$PUT_OUT"); gets: $(stats_of "$WOUT")"
  check_shm_files "with netem"
fi

echo "$CHECKS checks, $FAILURES failed ($((SECONDS - T0)) s)"
((FAILURES == 0))
