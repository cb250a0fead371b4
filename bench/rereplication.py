#!/usr/bin/env python3
"""Re-replication and drain speed against this machine's limits, in one run.

    PYTHONPATH=build/python python3 bench/rereplication.py [--bin-dir build/bin] [--objects 256]
        [--object-mib 1] [--mbps 100000]

Starts a granary-master and three granary-nodes on 127.0.0.1 (free ports), puts OBJECTS objects
of OBJECT_MIB MiB with one replica, then measures:
  1. replicate to 2: from the Replicate call until every object has 2 replicas;
  2. drain: from `drain` of the node holding the most until it is unmounted;
  3. kill -9 of a node holding second replicas: from its expiry (no longer listed) until every
     object has 2 replicas again.
Each as MB/s of copied bytes, beside `granary-bench limits` (memcpy, one loopback TCP stream)
measured in the same run. --mbps is the master's --rereplicate-mbps (the cap under test).
Every wait is bounded; every process is killed at the end.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import granary


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded
        if predicate():
            return True
        time.sleep(0.02)
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default="build/bin")
    ap.add_argument("--objects", type=int, default=256)
    ap.add_argument("--object-mib", type=int, default=1)
    ap.add_argument("--mbps", default="100000")
    args = ap.parse_args()
    procs = []
    tmp = tempfile.mkdtemp(prefix="granary-rerep-")
    try:
        limits_json = os.path.join(tmp, "limits.json")
        subprocess.run([os.path.join(args.bin_dir, "granary-bench"), "limits", "--seconds", "0.5",
                        "--tcp-streams", "1", "--disk-dir", tmp, "--disk-bytes", str(64 << 20),
                        "--json", limits_json], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=300)
        limits = json.load(open(limits_json))
        port, http = free_port(), free_port()
        procs.append(subprocess.Popen(
            [os.path.join(args.bin_dir, "granary-master"), "--port", str(port), "--http-port",
             str(http), "--log-level", "warn", "--client-ttl", "2s", "--rereplicate-mbps",
             args.mbps], stdout=subprocess.DEVNULL))
        master = f"127.0.0.1:{port}"
        assert wait(lambda: _up(http), 20), "master did not start"
        size = args.objects * args.object_mib * 2 + 64
        names = [f"rerep-{os.getpid()}-{i}" for i in range(3)]
        for name in names:
            procs.append(subprocess.Popen(
                [os.path.join(args.bin_dir, "granary-node"), "--master", master, "--segment-size",
                 f"{size}MiB", "--name", name, "--log-level", "warn", "--heartbeat-interval",
                 "200ms"], stdout=subprocess.DEVNULL))
        store = granary.Store(master)
        assert wait(lambda: len(store.segments()) == 3, 20), "nodes did not mount"
        value = os.urandom(args.object_mib << 20)
        keys = [f"rerep/{i}" for i in range(args.objects)]
        for k in keys:
            store.put(k, value)
        total_mb = args.objects * len(value) / 1e6

        def all_at(n):
            return all(len(store.stat(k)["replicas"]) == n for k in keys)

        t0 = time.monotonic()
        store.replicate_many(keys, 2)
        assert wait(lambda: all_at(2), 600), "replicate to 2 did not finish"
        replicate_s = time.monotonic() - t0

        held = {s["name"]: s["objects"] for s in store.segments()}
        victim = max(held, key=held.get)
        moved_mb = sum(1 for k in keys if any(r["segment"] == victim
                                               for r in store.stat(k)["replicas"])) * len(value) / 1e6
        t0 = time.monotonic()
        store.drain(victim)
        assert wait(lambda: victim not in [s["name"] for s in store.segments()], 600)
        drain_s = time.monotonic() - t0
        procs[1 + names.index(victim)].kill()
        store.undrain(victim)

        alive = [n for n in names if n != victim]
        second = alive[0]
        lost_mb = sum(1 for k in keys if any(r["segment"] == second
                                              for r in store.stat(k)["replicas"])) * len(value) / 1e6
        procs[1 + names.index(second)].send_signal(signal.SIGKILL)
        # Restart the drained node under a new name: the copies need a second live node.
        procs.append(subprocess.Popen(
            [os.path.join(args.bin_dir, "granary-node"), "--master", master, "--segment-size",
             f"{size}MiB", "--name", victim + "-b", "--log-level", "warn"],
            stdout=subprocess.DEVNULL))
        assert wait(lambda: second not in [s["name"] for s in store.segments()], 30)
        t0 = time.monotonic()
        assert wait(lambda: all_at(2), 600), "re-replication after the kill did not finish"
        kill_s = time.monotonic() - t0
        for k in keys[:: max(1, len(keys) // 16)]:
            assert store.get(k) == value, k

        print(f"limits (same run): {json.dumps(limits)}")
        print(f"objects: {args.objects} x {args.object_mib} MiB, --rereplicate-mbps {args.mbps}")
        for what, mb, s in (("replicate 1->2", total_mb, replicate_s),
                            ("drain", moved_mb, drain_s),
                            ("kill -9, after expiry", lost_mb, kill_s)):
            print(f"{what:24s} {mb:8.1f} MB in {s:6.2f} s = {mb / s:8.1f} MB/s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def _up(http):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{http}/health", timeout=1)
        return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
