"""Fixtures for the Python package's tests: real granary-master / granary-node processes on free
loopback ports, started from the build tree and always stopped.

Environment: GRANARY_BIN_DIR (default <repo>/build/bin) holds the binaries; the package itself
comes from PYTHONPATH (the build tree's python/ directory, see tests/CMakeLists.txt).
"""

import itertools
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("GRANARY_BIN_DIR", os.path.join(REPO, "build", "bin"))


_HANDED_OUT = set()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A free port for a server a test starts, picked at random below the kernel's ephemeral
    range: no outgoing connection can take it before the server binds it or while the server
    restarts on it (127.0.0.1:0 picks from that range). Handed out once per process."""
    low = _ephemeral_low()
    candidates = [random.randrange(10000, low) for _ in range(1000)] if low - 10000 >= 2000 else []
    for port in candidates + [0] * 100:
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port")


def wait_for_line(proc, prefix, timeout=20.0):
    """Reads proc's stdout until a line starting with prefix (returned) or timeout."""
    deadline = time.monotonic() + timeout
    buffered = b""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before '{prefix}'")
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if not ready:
            continue
        chunk = os.read(proc.stdout.fileno(), 65536)
        buffered += chunk
        # Whole lines only: a chunk may end in the middle of the one we want.
        for line in buffered.decode(errors="replace").split("\n")[:-1]:
            if line.startswith(prefix):
                return line
    raise TimeoutError(f"no '{prefix}' from {proc.args[0]} within {timeout}s")


def stop(proc, sig=signal.SIGTERM, timeout=10.0):
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Master:
    """A granary-master on free ports."""

    def __init__(self, *extra):
        self.port = free_port()
        self.http_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [os.path.join(BIN_DIR, "granary-master"), "--port", str(self.port), "--http-port",
             str(self.http_port), "--log-level", "warn", *extra],
            stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/health", timeout=1)
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    stop(self.proc)
                    raise RuntimeError("granary-master did not come up")
                time.sleep(0.05)

    def stop(self, sig=signal.SIGTERM):
        stop(self.proc, sig)


class Node:
    """A granary-node; with standalone=True it runs its own master (at .master)."""

    def __init__(self, master=None, size="256MiB", standalone=False, name=None, extra=()):
        args = [os.path.join(BIN_DIR, "granary-node"), "--segment-size", size, "--log-level",
                "warn", "--prefault=false", *extra]
        if standalone:
            port = free_port()
            args += ["--standalone", "--master-port", str(port), "--http-port", str(free_port())]
            self.master = f"127.0.0.1:{port}"
        else:
            args += ["--master", master]
            self.master = master
        if name:
            args += ["--name", name]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE)
        try:
            line = wait_for_line(self.proc, "granary-node ready")
        except Exception:
            stop(self.proc)
            raise
        self.segment = line.split("segment ")[1].split(",")[0]

    def stop(self, sig=signal.SIGTERM):
        stop(self.proc, sig)


# The real etcd server (Debian's etcd-server) the HA masters elect their leader in.
ETCD = os.environ.get("GRANARY_ETCD", "/usr/bin/etcd")
# tests/integration/ha_fixture.cc's HaMasterFlags, less its log level: short leases and timeouts
# so that a failover takes about a second.
HA_MASTER_FLAGS = ("--client-ttl", "3s", "--lease-ttl", "1s", "--mount-quarantine", "1s",
                   "--put-discard-timeout", "1s", "--put-release-timeout", "3s",
                   "--leader-lease", "1s", "--lease-margin", "300ms", "--standby-timeout",
                   "500ms", "--sync-timeout", "2s", "--fast-port", "0")
_cluster_ids = itertools.count()


def http_json(port, path, timeout=1.0):
    """The JSON document at http://127.0.0.1:port/path, or None if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


class Etcd:
    """One etcd member on free loopback ports with its data in data_dir, fast raft settings
    (heartbeat 50 ms, election 500 ms: etcd then grants 1 s leases); ready once /health says
    so."""

    def __init__(self, data_dir, timeout=20.0):
        self.port = free_port()
        peer_port = free_port()
        while peer_port == self.port:
            peer_port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        client_url, peer_url = f"http://{self.endpoint}", f"http://127.0.0.1:{peer_port}"
        os.makedirs(data_dir, exist_ok=True)
        self.log_path = os.path.join(data_dir, "etcd.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [ETCD, "--name", "py", "--data-dir", os.path.join(data_dir, "member"),
                 "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                 "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                 "--initial-cluster", f"py={peer_url}", "--initial-cluster-state", "new",
                 "--initial-cluster-token", f"granary-py-{self.port}",
                 "--heartbeat-interval", "50", "--election-timeout", "500",
                 "--logger", "zap", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while (http_json(self.port, "/health") or {}).get("health") != "true":
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"etcd did not become healthy:\n{self.log()}")
            time.sleep(0.05)

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    def stop(self):
        stop(self.proc, signal.SIGKILL)


class HaCluster:
    """An etcd, `masters` granary-masters electing a leader in it under a cluster id of their
    own, and one granary-node following the leader through etcd://. Ready once the leader has a
    synchronous standby and every other master streams its history; stop() kills everything."""

    def __init__(self, data_dir, masters=3, node_size="64MiB", timeout=30.0):
        self.cluster_id = f"py-ha-{os.getpid()}-{next(_cluster_ids)}"
        self.masters, self.node = [], None
        self.etcd = Etcd(os.path.join(data_dir, "etcd"))
        self.address = f"etcd://{self.etcd.endpoint}"
        try:
            for _ in range(masters):
                self.masters.append(Master("--host", "127.0.0.1", "--etcd", self.etcd.endpoint,
                                           "--cluster-id", self.cluster_id, *HA_MASTER_FLAGS))
            if self.wait_ready(timeout) < 0:
                raise RuntimeError(f"no HA leader with its standbys within {timeout}s: "
                                   f"{[self.status(i) for i in range(len(self.masters))]}")
            self.node = Node(self.address, size=node_size,
                             extra=("--cluster-id", self.cluster_id))
        except BaseException:
            self.stop()
            raise

    def status(self, i):
        """Master i's HA status (the "ha" part of its /status), or None."""
        m = self.masters[i]
        if m.proc.poll() is not None:
            return None
        return (http_json(m.http_port, "/status", timeout=0.5) or {}).get("ha")

    def leader_index(self):
        for i in range(len(self.masters)):
            if (self.status(i) or {}).get("role") == "leader":
                return i
        return -1

    def wait_ready(self, timeout):
        """The leader's index once it serves with a synchronous standby and every other live
        master connected as its standby; -1 after timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader_index()
            if leader >= 0:
                standbys = self.status(leader).get("standbys", [])
                live = sum(1 for i, m in enumerate(self.masters)
                           if i != leader and m.proc.poll() is None)
                connected = [s for s in standbys if s.get("connected")]
                if len(connected) >= live and any(s.get("synchronous") for s in connected):
                    return leader
            time.sleep(0.05)
        return -1

    def stop(self):
        if self.node is not None:
            self.node.stop()  # SIGTERM first: it removes its shared memory
        for m in self.masters:
            m.stop(signal.SIGKILL)
        self.etcd.stop()


class Worker:
    """granary-test-worker get-and-hang: another client holding read locks until stopped."""

    def __init__(self, master, *keys):
        args = [os.path.join(BIN_DIR, "granary-test-worker"), "get-and-hang", "--master", master,
                "--max-hang", "60"]
        for k in keys:
            args += ["--key", k]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE)
        try:
            wait_for_line(self.proc, "locked")
        except Exception:
            stop(self.proc, signal.SIGKILL)
            raise

    def stop(self):
        stop(self.proc, signal.SIGKILL)


@pytest.fixture(scope="module")
def standalone():
    """One standalone node (master + 256 MiB segment) shared by a test module."""
    node = Node(standalone=True)
    yield node
    node.stop()


@pytest.fixture
def master():
    m = Master()
    yield m
    m.stop()


@pytest.fixture
def run_python():
    """Runs a Python script in a new interpreter with this package importable."""
    procs = []

    def start(script, *args):
        proc = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(os.environ))
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        stop(p, signal.SIGKILL)
