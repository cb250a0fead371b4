#!/usr/bin/env python3
"""Python client overhead: put and get throughput and latency through granary.Store (native) and
granary.compat.mooncake (zero-copy calls on registered memory), against a running store.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py --master 127.0.0.1:50051 \
        [--seconds 1] [--sizes 4KiB,64KiB,1MiB,4MiB] [--json out.json]

Each case runs for --seconds: puts of fresh keys, then gets of those same keys round robin (so a
large object is not served from the CPU cache) into a preallocated NumPy array; the keys are
removed at the end of the case. Prints one row per (api, op, size).

With --memcached HOST:PORT, the same cases against memcached from this same process, as a
minimal client would make them (text protocol on one socket, TCP_NODELAY; a get reads the value
into a preallocated NumPy array with recv_into): the yardstick of issue 23's 64 KiB get.
"""

import argparse
import json
import socket
import time

import numpy as np

import granary
from granary.compat.mooncake import MooncakeDistributedStore


def percentile(sorted_values, p):
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, len(sorted_values) * p // 100)]


BUDGET = 1 << 30  # bytes one put case may write, so the store never has to evict our keys (--budget)


def run_case(seconds, op, max_calls=1_000_000):
    """Calls op(i) until `seconds` pass or max_calls calls; returns (count, wall seconds, sorted
    latencies in us)."""
    latencies = []
    start = time.perf_counter()
    deadline = start + seconds
    i = 0
    while True:
        t0 = time.perf_counter()
        if t0 >= deadline or i >= max_calls:
            break
        op(i)
        latencies.append((time.perf_counter() - t0) * 1e6)
        i += 1
    return i, time.perf_counter() - start, sorted(latencies)


def row(api, op, size, batch, count, wall, lat):
    return {"api": api, "op": op, "size": size, "batch": batch, "ops": count,
            "ops_per_s": count / wall, "gb_per_s": count * batch * size / wall / 1e9,
            "p50_us": percentile(lat, 50), "p99_us": percentile(lat, 99)}


def bench_memcpy(size, seconds):
    """numpy.copyto of `size` bytes from one array into buffers taken round robin from 256 MiB
    (as the get cases do, so that a large copy is not served from the CPU cache): the limit the
    put and get rows read as a fraction of."""
    count = max(2, min(4096, (256 << 20) // size))
    src = np.random.default_rng(size + 3).integers(0, 255, size, dtype=np.uint8)
    dst = [np.empty(size, dtype=np.uint8) for _ in range(count)]
    for d in dst:
        d.fill(1)  # touched once: page faults are not the copy's

    def copy(i):
        np.copyto(dst[i % count], src)

    count_done, wall, lat = run_case(seconds, copy)
    return [row("numpy", "copyto", size, 1, count_done, wall, lat)]


def bench_native(store, size, seconds, batch):
    value = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
    out = [np.empty(size, dtype=np.uint8) for _ in range(batch)]
    prefix = f"pybench/native/{size}/{batch}"
    rows = []

    def put(i):
        if batch == 1:
            store.put(f"{prefix}/{i}", value)
        else:
            store.put_many([f"{prefix}/{i}/{j}" for j in range(batch)], [value] * batch)

    puts, wall, lat = run_case(seconds, put, max(1, BUDGET // (size * batch)))
    rows.append(row("native", "put", size, batch, puts, wall, lat))

    def get(i):
        n = i % puts
        if batch == 1:
            assert store.get_into(f"{prefix}/{n}", out[0]) == size
        else:
            keys = [f"{prefix}/{n}/{j}" for j in range(batch)]
            assert store.get_into_many(keys, out) == [size] * batch

    count, wall, lat = run_case(seconds, get)
    rows.append(row("native", "get_into", size, batch, count, wall, lat))
    assert np.array_equal(out[0], value)
    store.remove_regex("^" + prefix + "/", force=True)
    return rows


def put_one(store, key, src, size):
    code = store.put_from(key, src.ctypes.data, size)
    assert code == 0, code


def wait_until_warm(store, limit_s=30.0):
    """Waits (bounded) until the client has populated its mappings of this host's segments."""
    deadline = time.monotonic() + limit_s
    while store._client.stats()["shm_bytes_warm_pending"] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)


def bench_compat_first(store, size, seconds):
    """put_from right after setup ("put_from.1st"): the client's mapping of the segment is still
    being populated (about 0.1 s per GiB of one core), which these puts share the cores with.
    Returns once the mapping is warm, for the cases after it."""
    src = np.random.default_rng(size + 1).integers(0, 255, size, dtype=np.uint8)
    assert store.register_buffer(src.ctypes.data, src.nbytes) == 0
    prefix = f"pybench/compat-first/{size}"
    puts, wall, lat = run_case(seconds, lambda i: put_one(store, f"{prefix}/{i}", src, size),
                               max(1, BUDGET // size))
    store.remove_by_regex("^" + prefix + "/", force=True)
    store.unregister_buffer(src.ctypes.data)
    wait_until_warm(store)
    return [row("compat", "put_from.1st", size, 1, puts, wall, lat)]


def bench_compat(store, size, seconds):
    """put_from and get_into of one size."""
    src = np.random.default_rng(size + 1).integers(0, 255, size, dtype=np.uint8)
    dst = np.empty(size, dtype=np.uint8)
    for a in (src, dst):
        assert store.register_buffer(a.ctypes.data, a.nbytes) == 0
    prefix = f"pybench/compat/{size}"
    puts, wall, lat = run_case(seconds, lambda i: put_one(store, f"{prefix}/{i}", src, size),
                               max(1, BUDGET // size))
    rows = [row("compat", "put_from", size, 1, puts, wall, lat)]

    # Objects of many sizes near this one (each up to 1/16 smaller, all different), as a model
    # whose pages vary a little in size puts them: they share the client's reserved space.
    mixed = f"pybench/compat-mixed/{size}"
    step = max(1, size // 16 // 97)
    n, wall, lat = run_case(
        seconds, lambda i: put_one(store, f"{mixed}/{i}", src, size - (i % 97) * step),
        max(1, BUDGET // size))
    rows.append(row("compat", "put_from~", size, 1, n, wall, lat))
    store.remove_by_regex("^" + mixed + "/", force=True)

    def get(i):
        got = store.get_into(f"{prefix}/{i % puts}", dst.ctypes.data, size)
        assert got == size, got

    count, wall, lat = run_case(seconds, get)
    rows.append(row("compat", "get_into", size, 1, count, wall, lat))
    assert np.array_equal(src, dst)
    store.remove_by_regex("^" + prefix + "/", force=True)
    for a in (src, dst):
        store.unregister_buffer(a.ctypes.data)
    return rows


class Memcached:
    """The text protocol on one TCP connection: set and get into a caller's buffer. Replies are
    read in large receives (what follows a header in the same receive is used, not re-read);
    a value bigger than what came with its header is received straight into the caller's array."""

    def __init__(self, address):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pending = bytearray()  # received, not consumed yet

    def _receive(self):
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("memcached closed the connection")
        self.pending += chunk

    def _line(self):
        """The next line, without its CRLF."""
        while (end := self.pending.find(b"\r\n")) < 0:
            self._receive()
        line = bytes(self.pending[:end])
        del self.pending[:end + 2]
        return line

    def _exact_into(self, view):
        """Fills the memoryview: what is pending first, then straight from the socket."""
        have = min(len(self.pending), len(view))
        view[:have] = self.pending[:have]
        del self.pending[:have]
        while have < len(view):
            n = self.sock.recv_into(view[have:], len(view) - have)
            if n == 0:
                raise ConnectionError("memcached closed the connection")
            have += n

    def set(self, key, value):
        header = b"set %s 0 0 %d\r\n" % (key.encode(), value.nbytes)
        parts = [header, memoryview(value).cast("B"), b"\r\n"]
        total = sum(len(p) for p in parts)
        sent = self.sock.sendmsg(parts)  # one gathered send, no copy of the value
        if sent < total:
            self.sock.sendall(b"".join(bytes(p) for p in parts)[sent:])
        reply = self._line()
        assert reply == b"STORED", reply

    def get_into(self, key, out):
        """Reads the value into `out` (a NumPy uint8 array); returns its size."""
        self.sock.sendall(b"get %s\r\n" % key.encode())
        header = self._line()  # VALUE <key> <flags> <bytes>
        assert header.startswith(b"VALUE "), header
        size = int(header.rsplit(b" ", 1)[1])
        self._exact_into(memoryview(out).cast("B")[:size])
        tail = bytearray(7)
        self._exact_into(memoryview(tail))
        assert tail == b"\r\nEND\r\n", tail
        return size

    def flush(self):
        self.sock.sendall(b"flush_all\r\n")
        assert self._line() == b"OK"


def bench_memcached(mc, size, seconds):
    value = np.random.default_rng(size + 2).integers(0, 255, size, dtype=np.uint8)
    out = np.empty(size, dtype=np.uint8)
    prefix = f"pybench/{size}"

    def put(i):
        mc.set(f"{prefix}/{i}", value)

    puts, wall, lat = run_case(seconds, put, max(1, BUDGET // size))
    rows = [row("memcached", "set", size, 1, puts, wall, lat)]

    def get(i):
        assert mc.get_into(f"{prefix}/{i % puts}", out) == size

    count, wall, lat = run_case(seconds, get)
    rows.append(row("memcached", "get_into", size, 1, count, wall, lat))
    assert np.array_equal(out, value)
    mc.flush()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--master", default="127.0.0.1:50051")
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--sizes", default="4KiB,64KiB,1MiB,4MiB")
    parser.add_argument("--batch", type=int, default=8, help="objects per batched call")
    parser.add_argument("--memcached", help="memcached HOST:PORT: the same cases against it")
    parser.add_argument("--json")
    parser.add_argument("--budget", default="1GiB",
                        help="bytes one put case may write: at most a quarter of the store's "
                             "memory, so that a case never reads keys the store had to evict")
    args = parser.parse_args()
    global BUDGET
    BUDGET = granary.parse_size(args.budget)
    sizes = [granary.parse_size(s) for s in args.sizes.split(",")]
    rows = []
    for size in sizes:
        rows += bench_memcpy(size, args.seconds)
    with granary.Store(args.master) as store:
        for size in sizes:
            rows += bench_native(store, size, args.seconds, 1)
            rows += bench_native(store, size, args.seconds, args.batch)
    compat = MooncakeDistributedStore()
    assert compat.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", args.master) == 0
    rows += bench_compat_first(compat, max(sizes), args.seconds)
    for size in sizes:
        rows += bench_compat(compat, size, args.seconds)
    warm = compat._client.stats()
    compat.close()
    if args.memcached:
        mc = Memcached(args.memcached)
        mc.flush()  # what an earlier suite left there would be evicted mid-case
        for size in sizes:
            rows += bench_memcached(mc, size, args.seconds)
    print(f"{'api':9} {'op':12} {'size':>8} {'batch':>5} {'ops/s':>9} {'GB/s':>7} "
          f"{'p50 us':>8} {'p99 us':>8}")
    print("(memcached: this process over one TCP connection, when --memcached is given)")
    for r in rows:
        print(f"{r['api']:9} {r['op']:12} {r['size']:>8} {r['batch']:>5} {r['ops_per_s']:>9.0f} "
              f"{r['gb_per_s']:>7.2f} {r['p50_us']:>8.0f} {r['p99_us']:>8.0f}")
    print(f"(put_from.1st: the first puts of a client just set up, while its mapping of the "
          f"{warm['shm_bytes_warmed'] / 2**30:.1f} GiB segment is populated: "
          f"{warm['shm_warm_ns'] / 1e6:.0f} ms of one core)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"suite": "python", "seconds": args.seconds, "rows": rows,
                   "client_warm_up_ms": warm["shm_warm_ns"] / 1e6,
                   "client_warmed_bytes": warm["shm_bytes_warmed"]}, f, indent=1)


if __name__ == "__main__":
    main()
