# Shared by the bench/*.sh drivers: sourced, not run.

# A free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits (at most 20 s) until the master at 127.0.0.1:$1 lists at least one segment.
wait_for_segment() {
  for _ in $(seq 1 200); do
    [ -n "$("${BIN:-build/bin}"/granary --master "127.0.0.1:$1" nodes 2>/dev/null | sed -n 2p)" ] && return 0
    sleep 0.1
  done
  echo "no segment mounted at 127.0.0.1:$1 after 20 s" >&2
  return 1
}

# Waits (at most 10 s) until HTTP /health answers on 127.0.0.1:$1.
wait_for_health() {
  for _ in $(seq 1 100); do
    if command -v curl >/dev/null; then
      curl -fsS "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    else  # a machine without curl (the GPU machine)
      python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
        "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    fi
    sleep 0.1
  done
  echo "no /health answer on 127.0.0.1:$1 after 10 s" >&2
  return 1
}

# "2 cores, 24 GiB, <cpu model>"
machine_summary() {
  echo "$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
       "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
}

# Waits (at most 10 s) until something accepts TCP connections on 127.0.0.1:$1.
wait_for_port() {
  for _ in $(seq 1 100); do
    python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2)' \
      "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listening on 127.0.0.1:$1 after 10 s" >&2
  return 1
}

# Waits (at most 60 s) until process $1 has $2 bytes of shared memory resident: a --prefault
# node populates its segment on a background thread after mounting, and a case timed meanwhile
# shares the 2 cores with that zeroing (41% of the node's samples in a 4 MiB TCP run).
wait_for_populated() {
  local want_kib=$(( $2 / 1024 * 99 / 100 ))
  for _ in $(seq 1 600); do
    local have_kib
    have_kib=$(awk '/^RssShmem:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0)
    [ "${have_kib:-0}" -ge "$want_kib" ] && return 0
    sleep 0.1
  done
  echo "process $1 populated only ${have_kib:-0} KiB of $(( $2 / 1024 )) KiB after 60 s" >&2
  return 0
}

# HA: waits (at most 20 s) until one of the masters at 127.0.0.1:$1, $2... serves as the leader
# (`granary health` answers there, with an HA line; a standby refuses the call) and prints its port.
wait_for_ha_leader() {
  for _ in $(seq 1 100); do
    for port in "$@"; do
      if timeout 2 "${BIN:-build/bin}"/granary --master "127.0.0.1:$port" --timeout-ms 1000 health \
           2>/dev/null | grep -q "^HA cluster"; then
        echo "$port"; return 0
      fi
    done
    sleep 0.1
  done
  echo "no HA leader among 127.0.0.1:$* after 20 s" >&2
  return 1
}

# HA: waits (at most 20 s) until the leader at 127.0.0.1:$1 has a standby streaming with no lag,
# and synchronous when $2 is 1.
wait_for_ha_standby() {
  local want="streaming.*"
  [ "$2" = 1 ] && want="streaming, synchronous"
  for _ in $(seq 1 200); do
    "${BIN:-build/bin}"/granary --master "127.0.0.1:$1" health 2>/dev/null \
      | grep -q "standby .*: $want, acked seq [0-9]*, lag 0" && return 0
    sleep 0.1
  done
  echo "the leader at 127.0.0.1:$1 has no caught-up standby after 20 s" >&2
  return 1
}
