"""Fixtures for the Python package's tests: real granary-master / granary-node processes on free
loopback ports, started from the build tree and always stopped.

Environment: GRANARY_BIN_DIR (default <repo>/build/bin) holds the binaries; the package itself
comes from PYTHONPATH (the build tree's python/ directory, see tests/CMakeLists.txt).
"""

import os
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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    def __init__(self, master=None, size="256MiB", standalone=False, name=None):
        args = [os.path.join(BIN_DIR, "granary-node"), "--segment-size", size, "--log-level",
                "warn", "--prefault=false"]
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
