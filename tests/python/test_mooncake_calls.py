"""granary.compat.mooncake: the calls engines make that issue 10 adds, each against real
processes through the public class: setup's full signature, host:port names, master address
forms, MooncakeHostMemAllocator, get_into_ranges, ReplicateConfig's soft-pin TTL and groups,
close(), local_buffer_size, and the rest of Mooncake's reference (replica descriptors, tensors,
what Granary does not support)."""

import ctypes
import logging
import os
import socket
import uuid

import numpy as np
import pytest

import granary
from granary.compat.mooncake import (MooncakeDistributedStore, MooncakeHostMemAllocator,
                                     ReplicateConfig, SoftPinAction, bind_to_numa_node)
from conftest import Master, Node, free_port

OK, BUFFER_OVERFLOW, INVALID_PARAMS, INVALID_READ = 0, -10, -600, -701
OBJECT_NOT_FOUND, CHECKSUM_MISMATCH, UNAVAILABLE = -704, -801, -1010
PORTS = range(12300, 14301)


def pattern(n, seed):
    return (np.arange(n, dtype=np.uint64) * 2654435761 + seed * 7919).astype(np.uint8).tobytes()


def connect(master, *, segment=0, buffer=16 << 20, host="127.0.0.1", **kwargs):
    s = MooncakeDistributedStore()
    code = s.setup(host, "P2PHANDSHAKE", segment, buffer, "tcp", "", master, **kwargs)
    assert code == OK, code
    return s


@pytest.fixture
def store(standalone):
    s = connect(standalone.master, segment=32 << 20)
    yield s
    assert s.close() == OK


@pytest.fixture
def registered(store):
    """A registered 64 KiB NumPy buffer of `store`: (array, address)."""
    arr = np.zeros(1 << 16, dtype=np.uint8)
    assert store.register_buffer(arr.ctypes.data, arr.nbytes) == OK
    yield arr, arr.ctypes.data
    assert store.unregister_buffer(arr.ctypes.data) == OK


def segments(master):
    with granary.Store(master) as n:
        return {seg["name"]: seg for seg in n.segments()}


# ---- setup(): the 8th positional `engine` and Mooncake's keywords ----

def test_setup_takes_engine_and_every_mooncake_keyword(standalone, caplog):
    caplog.set_level(logging.INFO, logger="granary.compat.mooncake")
    s = MooncakeDistributedStore()
    # SGLang's call over TCP: eight positional arguments, engine None, then its keywords.
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 8 << 20, 16 << 20, "tcp", "",
                   standalone.master, None, enable_client_http_server=True,
                   client_http_port=18007) == OK
    assert s.put("setup/kw", b"v") == OK and s.get("setup/kw") == b"v"
    assert s.close() == OK
    assert "enable_client_http_server is ignored" in caplog.text
    caplog.clear()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", standalone.master,
                   object(), enable_ssd_offload=False, ssd_offload_path="/tmp/granary-ssd",
                   tenant_id="default") == OK
    assert "transfer engine passed is not used" in caplog.text
    assert "ssd_offload_path '/tmp/granary-ssd' is ignored without enable_ssd_offload" \
        in caplog.text
    assert s.close() == OK
    # Every name as a keyword, Mooncake's spelling of the sixth included.
    assert s.setup(local_hostname="127.0.0.1", metadata_server="P2PHANDSHAKE",
                   global_segment_size=0, local_buffer_size=1 << 20, protocol="tcp",
                   rdma_devices="", master_server_addr=standalone.master, engine=None) == OK
    assert s.close() == OK
    # The dict form takes the same keys, with Mooncake's string-valued flags.
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": "0", "local_buffer_size": "1MB", "protocol": "tcp",
                    "rdma_devices": "", "master_server_address": standalone.master,
                    "enable_ssd_offload": "false", "tenant_id": "default",
                    "enable_client_http_server": "false", "client_http_port": "9300"}) == OK
    assert s.close() == OK


def test_setup_errors_are_codes_not_exceptions(standalone, caplog):
    s = MooncakeDistributedStore()
    # A tenant the secret presented does not name (here none): refused, never silently shared.
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", standalone.master, None,
                   tenant_id="tenant-a") == -1101
    assert "tenant_id 'tenant-a'" in caplog.text
    assert s.health_check() == 1  # closed again
    # A tenant contributes no segment (others' objects would land in memory it can read).
    assert s.setup({"master_server_addr": standalone.master, "tenant_id": "b"}) == INVALID_PARAMS
    assert "global_segment_size=0" in caplog.text
    assert s.setup({"master_server_addr": standalone.master, "protocol": "nvlink",
                    "enable_egm_store_pool": "true"}) == INVALID_PARAMS
    assert s.health_check() == 1
    # A keyword Mooncake does not take is a TypeError there too (SGLang retries without it).
    with pytest.raises(TypeError, match="no_such_option"):
        s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", standalone.master, None,
                no_such_option=True)


# ---- local_hostname "host:port" and get_hostname() ----

def test_host_port_names_the_segment_and_the_data_port(standalone):
    port = free_port()
    s = connect(standalone.master, segment=8 << 20, host=f"localhost:{port}")
    try:
        assert s.get_hostname() == f"localhost:{port}"
        seg = segments(standalone.master)[f"localhost:{port}"]
        assert seg["size"] == 8 << 20 and seg["endpoint"].endswith(f":{port}")
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # it serves there
        cfg = ReplicateConfig(preferred_segment=s.get_hostname())
        assert s.put("hp/k", pattern(5000, 1), cfg) == OK
        with granary.Store(standalone.master) as n:
            assert [r["segment"] for r in n.stat("hp/k")["replicas"]] == [s.get_hostname()]
            assert n.get("hp/k") == pattern(5000, 1)  # a reader maps the colon-named segment
        with granary.Store(standalone.master, use_shared_memory=False) as n:
            assert n.get("hp/k") == pattern(5000, 1)  # and reaches it over TCP at that port
    finally:
        assert s.close() == OK
    assert f"localhost:{port}" not in segments(standalone.master)


def test_without_a_port_one_in_mooncakes_range_is_picked_and_served(standalone):
    a = connect(standalone.master, segment=8 << 20, host="localhost")
    b = connect(standalone.master, segment=8 << 20, host="localhost")
    c = connect(standalone.master, segment=0, host="127.0.0.1")
    try:
        names = [a.get_hostname(), b.get_hostname()]
        assert names[0] != names[1]
        segs = segments(standalone.master)
        for name in names:
            host, _, port = name.partition(":")
            assert host == "localhost" and int(port) in PORTS
            assert segs[name]["endpoint"].endswith(f":{port}")  # the port it really serves on
        host, _, port = c.get_hostname().partition(":")
        assert host == "127.0.0.1" and int(port) in PORTS
    finally:
        for s in (a, b, c):
            assert s.close() == OK


def test_a_taken_port_is_an_error_code(standalone):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        s = MooncakeDistributedStore()
        code = s.setup(f"127.0.0.1:{port}", "P2PHANDSHAKE", 8 << 20, 0, "tcp", "",
                       standalone.master)
        assert code < 0 and s.health_check() == 1
    assert s.setup("127.0.0.1:notaport", "P2PHANDSHAKE", 8 << 20, 0, "tcp", "",
                   standalone.master) == INVALID_PARAMS


# ---- master addresses ----

def test_master_address_forms(standalone, caplog):
    s = MooncakeDistributedStore()
    # etcd:// (Mooncake's HA form) works against HA masters (test_ha.py); a malformed one fails.
    etcd = "etcd://127.0.0.1:2379;127.0.0.1"
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", etcd) == INVALID_PARAMS
    assert "etcd://HOST:PORT[;HOST:PORT...]" in caplog.text
    assert s.setup_dummy(1 << 20, 1 << 20, etcd) == INVALID_PARAMS
    for bad in ("http://127.0.0.1:50051", "a:1;b:2", "", "127.0.0.1:99999", "etcd://"):
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", bad) == INVALID_PARAMS, bad
    assert s.health_check() == 1
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "",
                   f"  {standalone.master} ") == OK
    assert s.close() == OK


def test_master_host_without_port_means_50051(caplog):
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.2", 50051))
        except OSError:
            pytest.skip("something listens on port 50051 here")
    s = MooncakeDistributedStore()
    # Nothing listens on 127.0.0.2:50051: the error names the address tried.
    code = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", "127.0.0.2")
    assert code in (-900, -901)
    assert "127.0.0.2:50051" in caplog.text


# ---- MooncakeHostMemAllocator ----

def test_host_mem_allocator_alloc_and_free():
    a = MooncakeHostMemAllocator()
    ptr = a.alloc(3 * 4096 + 1)
    assert ptr and ptr % 4096 == 0
    ctypes.memmove(ptr, b"\x5a" * (3 * 4096 + 1), 3 * 4096 + 1)
    assert ctypes.string_at(ptr + 3 * 4096, 1) == b"\x5a"
    assert MooncakeHostMemAllocator().free(ptr) == OK  # any instance: the allocator is shared
    assert a.free(ptr) == INVALID_PARAMS
    assert a.free(12345) == INVALID_PARAMS
    assert a.alloc(0) == 0 and a.alloc(-1) == 0


def test_host_mem_allocator_memory_stays_zero_copy_with_setup_dummy(standalone):
    alloc = MooncakeHostMemAllocator()
    n = 1 << 20
    src, dst = alloc.alloc(n), alloc.alloc(n)  # before setup_dummy, as SGLang does
    try:
        ctypes.memmove(src, pattern(n, 9), n)
        s = MooncakeDistributedStore()
        assert s.setup_dummy(1 << 20, 1 << 20, standalone.master) == OK
        try:
            assert s.register_buffer(src, n) == OK and s.register_buffer(dst, n) == OK
            cfg = ReplicateConfig(preferred_segment=standalone.segment)
            assert s.put_from("ham/k", src, n, cfg) == OK
            assert s.get_into("ham/k", dst, n) == n
            assert ctypes.string_at(dst, n) == pattern(n, 9)
            stats = s._client.stats()
            # One memcpy each way, straight between this memory and the node's segment.
            assert stats["shm_bytes_written"] == n and stats["shm_bytes_read"] == n, stats
            assert stats["tcp_bytes_written"] == 0 and stats["tcp_bytes_read"] == 0, stats
        finally:
            assert s.close() == OK
    finally:
        assert alloc.free(src) == OK and alloc.free(dst) == OK


# ---- get_into_ranges ----

def test_get_into_ranges_mooncakes_example(store):
    data1 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    data2 = b"abcdefghijklmnopqrstuvwxyz0123456789"
    assert store.put("gr/1", data1) == OK and store.put("gr/2", data2) == OK
    b0, b1 = (ctypes.c_ubyte * 32)(), (ctypes.c_ubyte * 32)()
    p0, p1 = ctypes.addressof(b0), ctypes.addressof(b1)
    assert store.register_buffer(p0, 32) == OK and store.register_buffer(p1, 32) == OK
    ctypes.memset(b0, ord("_"), 32)
    ctypes.memset(b1, ord("_"), 32)
    got = store.get_into_ranges([p0, p1], [["gr/1", "gr/2"], ["gr/2", "gr/1"]],
                                [[[0, 20], [8]], [[4], [16]]], [[[1, 30], [2]], [[0], [10]]],
                                [[[4, 3], [5]], [[6], [4]]])
    assert got == [[[4, 3], [5]], [[6], [4]]]
    assert bytes(b0) == b"1234____cdefg_______UVW_________"
    assert bytes(b1) == b"____abcdef______ABCD____________"
    assert store.unregister_buffer(p0) == OK and store.unregister_buffer(p1) == OK


def test_get_into_ranges_failures_are_per_fragment(store, registered):
    arr, base = registered
    size = arr.nbytes
    value = pattern(1000, 2)
    assert store.put("gr/v", value) == OK
    arr[:] = 0xEE
    # A key's fragments disagree in count: that key fails, its neighbours do not.
    got = store.get_into_ranges([base], [["gr/v", "gr/v"]], [[[0], [100]]],
                                [[[0, 1], [10]]], [[[4, 4], [5]]])
    assert got[0][0] and all(c == INVALID_PARAMS for c in got[0][0]) and got[0][1] == [5]
    assert bytes(arr[100:105]) == value[10:15]
    # Source past the object, destination past the registered buffer, a missing key: each
    # fails alone; the good fragments around them are read.
    got = store.get_into_ranges(
        [base], [["gr/v", "gr/missing", "gr/v"]],
        [[[0, 200, size - 1], [300], [400]]], [[[len(value) - 1, 0, 0], [0], [990]]],
        [[[4, 8, 4], [4], [10]]])
    assert got == [[[INVALID_READ, 8, BUFFER_OVERFLOW], [OBJECT_NOT_FOUND], [10]]]
    assert bytes(arr[200:208]) == value[:8] and bytes(arr[400:410]) == value[990:]
    assert (arr[0:4] == 0xEE).all() and (arr[300:304] == 0xEE).all()
    assert (arr[size - 1:] == 0xEE).all()
    # A buffer nobody registered, a buffer whose lists disagree, bad numbers.
    other = np.zeros(64, dtype=np.uint8)
    got = store.get_into_ranges([other.ctypes.data, base], [["gr/v"], ["gr/v", "gr/v"]],
                                [[[0]], [[0], [8]]], [[[0]], [[0]]], [[[4]], [[4], [4]]])
    assert got == [[[INVALID_PARAMS]], [[INVALID_PARAMS], [INVALID_PARAMS]]]
    got = store.get_into_ranges([base], [["gr/v"]], [[[0, -1]]], [[[0, 0]]], [[[4, 4]]])
    assert got == [[[4, INVALID_PARAMS]]]
    # Top-level lists that disagree fail every buffer; empty lists give empty results.
    assert store.get_into_ranges([base], [["gr/v"]], [], [[[0]]], [[[4]]]) == \
        [[[INVALID_PARAMS]]]
    assert store.get_into_ranges([], [], [], [], []) == []
    assert store.get_into_ranges([base], [["gr/v"]], [[[]]], [[[]]], [[[]]]) == [[[]]]
    assert not other.any()


def test_get_into_ranges_over_tcp_and_many_fragments(standalone):
    writer = connect(standalone.master)
    reader = MooncakeDistributedStore()
    assert reader.setup({"local_hostname": "127.0.0.1", "master_server_addr": standalone.master,
                         "global_segment_size": 0, "use_shared_memory": False}) == OK
    values = [pattern(3 << 20, 10 + i) for i in range(3)]  # 3 MiB objects
    for i, v in enumerate(values):
        assert writer.put(f"grt/{i}", v) == OK
    out = np.zeros(1 << 20, dtype=np.uint8)
    assert reader.register_buffer(out.ctypes.data, out.nbytes) == OK
    # 3 keys x 256 fragments of 1 KiB each, interleaved in one buffer.
    keys = [f"grt/{i}" for i in range(3)]
    dst = [[(k * 3 + i) * 1024 for k in range(256)] for i in range(3)]
    src = [[k * 12288 + 7 for k in range(256)] for _ in range(3)]
    got = reader.get_into_ranges([out.ctypes.data], [keys], [dst], [src],
                                 [[[1024] * 256] * 3])
    assert got == [[[1024] * 256] * 3]
    for i, v in enumerate(values):
        for k in range(256):
            at = (k * 3 + i) * 1024
            assert bytes(out[at:at + 1024]) == v[k * 12288 + 7:k * 12288 + 7 + 1024]
    assert reader._client.stats()["shm_bytes_read"] == 0  # it really went over TCP
    assert reader.close() == OK and writer.close() == OK


def test_get_into_ranges_reads_in_rounds_within_its_scratch_budget(store, registered,
                                                                monkeypatch):
    import granary.compat.mooncake as mc
    arr, base = registered
    values = [pattern(5000 + i, 20 + i) for i in range(6)]
    keys = [f"grb/{i}" for i in range(6)]
    assert store.put_batch(keys, values) == OK
    # 12 KB of scratch: two 5 KB objects per round, so three rounds for six keys; one key is
    # missing and two fragments name keys that another buffer lists too.
    monkeypatch.setattr(mc, "_RANGE_SCRATCH_BUDGET", 12_000)
    got = store.get_into_ranges(
        [base, base + 32768], [keys[:3] + ["grb/missing"], keys[3:] + keys[:1]],
        [[[i * 100] for i in range(4)], [[i * 100] for i in range(4)]],
        [[[i] for i in range(4)], [[i] for i in range(4)]],
        [[[50]] * 4, [[50]] * 4])
    assert got == [[[50], [50], [50], [OBJECT_NOT_FOUND]], [[50], [50], [50], [50]]]
    for i in range(3):
        assert bytes(arr[i * 100:i * 100 + 50]) == values[i][i:i + 50]
        assert bytes(arr[32768 + i * 100:32768 + i * 100 + 50]) == values[3 + i][i:i + 50]
    assert bytes(arr[32768 + 300:32768 + 350]) == values[0][3:53]
    # A single object larger than the budget is still read.
    monkeypatch.setattr(mc, "_RANGE_SCRATCH_BUDGET", 1)
    assert store.get_into_ranges([base], [[keys[5]]], [[[0]]], [[[4000]]], [[[1000]]]) == \
        [[[1000]]]
    assert bytes(arr[:1000]) == values[5][4000:5000]


def test_get_into_ranges_never_returns_bytes_that_fail_the_checksum():
    node = Node(standalone=True, size="16MiB")
    s = connect(node.master)
    try:
        value = pattern(1 << 16, 3)
        assert s.put("grc/k", value) == OK
        with granary.Store(node.master) as n:
            replica = n.stat("grc/k")["replicas"][0]
        # Damage one byte of the stored object, far from the fragment asked for.
        shm = [f for f in os.listdir("/dev/shm") if f == f"granary-{node.segment}"]
        assert shm, "the node's segment is not in /dev/shm"
        seg = np.memmap(f"/dev/shm/{shm[0]}", dtype=np.uint8, mode="r+")
        seg[replica["offset"] + 60000] ^= 0xFF
        seg.flush()
        del seg
        out = np.full(64, 0xEE, dtype=np.uint8)
        assert s.register_buffer(out.ctypes.data, out.nbytes) == OK
        got = s.get_into_ranges([out.ctypes.data], [["grc/k"]], [[[0]]], [[[0]]], [[[16]]])
        assert got == [[[CHECKSUM_MISMATCH]]]
        assert (out == 0xEE).all()  # bytes 0..15 were intact, but unverifiable: not copied
        assert s.get("grc/k") == b""
    finally:
        s.close()
        node.stop()


# ---- ReplicateConfig ----

def test_soft_pin_ttl_ms_is_optional_and_checked_like_mooncake():
    assert all(hasattr(ReplicateConfig, f) for f in (
        "replica_num", "with_soft_pin", "with_hard_pin", "preferred_segment", "group_ids",
        "prefer_alloc_in_same_node", "soft_pin_ttl_ms", "soft_pin_action"))
    cfg = ReplicateConfig()
    assert cfg.soft_pin_ttl_ms is None and cfg.group_ids is None
    for bad in (-1, 2**64, "5", 1.5):
        with pytest.raises(TypeError):
            cfg.soft_pin_ttl_ms = bad
        with pytest.raises(TypeError):
            ReplicateConfig(soft_pin_ttl_ms=bad)
    cfg.soft_pin_ttl_ms = 2**64 - 1
    assert cfg.soft_pin_ttl_ms == 2**64 - 1
    cfg.soft_pin_ttl_ms = None
    text = str(ReplicateConfig(replica_num=3, soft_pin_ttl_ms=5))
    assert "replica_num=3" in text and "soft_pin_ttl_ms=5" in text


def test_soft_pin_ttl_needs_enable(store, registered, standalone):
    arr, base = registered
    ttl_only = ReplicateConfig(soft_pin_ttl_ms=60_000)
    assert store.put("sp/a", b"x", ttl_only) == INVALID_PARAMS
    assert store.upsert("sp/a", b"x", ttl_only) == INVALID_PARAMS
    ttl_only.with_soft_pin = True  # with_soft_pin does not stand in for ENABLE
    assert store.put("sp/a", b"x", ttl_only) == INVALID_PARAMS
    assert store.batch_put_from(["sp/a", "sp/b"], [base, base], [1, 1], ttl_only) == \
        [INVALID_PARAMS] * 2
    assert store.batch_is_exist(["sp/a", "sp/b"]) == [0, 0]
    enable = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=60_000)
    assert store.put("sp/pinned", b"x", enable) == OK
    zero = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=0)
    assert store.put("sp/zero", b"x", zero) == OK
    with granary.Store(standalone.master) as n:
        assert n.stat("sp/pinned")["soft_pinned"]
        assert not n.stat("sp/zero")["soft_pinned"]  # a zero TTL pins nothing


def test_group_ids_are_checked_per_key(store, registered):
    arr, base = registered
    assert store.put("grp/a", b"a", ReplicateConfig(group_ids=["session-a"])) == OK
    cfg = ReplicateConfig(group_ids=["s", "", "t"])
    assert store.put_batch(["grp/b", "grp/c", "grp/d"], [b"b", b"c", b"d"], cfg) == OK
    assert store.put_batch(["grp/e", "grp/f"], [b"e", b"f"], cfg) == INVALID_PARAMS
    assert store.batch_put_from(["grp/g"], [base], [1], cfg) == [INVALID_PARAMS]
    assert store.put("grp/h", b"h", ReplicateConfig(group_ids="session")) == INVALID_PARAMS
    assert store.batch_is_exist(["grp/a", "grp/b", "grp/d", "grp/e", "grp/g", "grp/h"]) == \
        [1, 1, 1, 0, 0, 0]


def test_prefer_alloc_in_same_node_keeps_objects_in_the_own_segment(store, standalone):
    cfg = ReplicateConfig(prefer_alloc_in_same_node=True)
    for i in range(4):
        assert store.put(f"same/{i}", b"local", cfg) == OK
    with granary.Store(standalone.master) as n:
        for i in range(4):
            assert [r["segment"] for r in n.stat(f"same/{i}")["replicas"]] == \
                [store.get_hostname()]


# ---- close() ----

def test_close_takes_the_objects_stored_only_in_its_segment():
    master = Master()
    try:
        owner = connect(master.address, segment=8 << 20)
        other = connect(master.address)
        assert owner.put("close/k", b"only here") == OK
        assert other.get("close/k") == b"only here"
        assert owner.close() == OK
        assert other.get("close/k") == b"" and other.is_exist("close/k") == 0
        fresh = connect(master.address)
        assert fresh.get("close/k") == b"" and fresh.is_exist("close/k") == 0
        # The same object sets up again and works (Mooncake's tear-down test).
        assert owner.setup("127.0.0.1", "P2PHANDSHAKE", 8 << 20, 1 << 20, "tcp", "",
                           master.address) == OK
        assert owner.put("close/k", b"again") == OK and fresh.get("close/k") == b"again"
        for s in (owner, other, fresh):
            assert s.close() == OK
        assert MooncakeDistributedStore().close() == OK  # never set up: 0, as in Mooncake
    finally:
        master.stop()


# ---- local_buffer_size ----

def test_zero_local_buffer_refuses_copy_path_puts_only(standalone):
    s = connect(standalone.master, buffer=0)
    try:
        assert s.put("lb/a", b"value") == INVALID_PARAMS
        assert s.put_batch(["lb/b", "lb/c"], [b"1", b"2"]) == INVALID_PARAMS
        assert s.put_parts("lb/d", b"a", b"b") == INVALID_PARAMS
        assert s.upsert("lb/e", b"v") == INVALID_PARAMS
        assert s.batch_is_exist(["lb/a", "lb/b", "lb/c", "lb/d", "lb/e"]) == [0] * 5
        # The zero-copy calls stage nothing and still work.
        arr = np.frombuffer(bytearray(pattern(4096, 4)), dtype=np.uint8)
        assert s.register_buffer(arr.ctypes.data, arr.nbytes) == OK
        assert s.put_from("lb/f", arr.ctypes.data, 4096) == OK
        assert s.batch_put_from(["lb/g"], [arr.ctypes.data], [100]) == [OK]
        assert s.get("lb/f") == pattern(4096, 4)
        assert s.get_into("lb/g", arr.ctypes.data + 2048, 2048) == 100
    finally:
        s.close()


def test_local_buffer_size_bounds_what_one_copy_path_call_stages(standalone):
    s = connect(standalone.master, buffer=100)
    try:
        assert s.put("lb/100", b"x" * 100) == OK
        assert s.put("lb/101", b"x" * 101) == INVALID_PARAMS
        assert s.put_batch(["lb/p", "lb/q"], [b"x" * 60, b"y" * 60]) == INVALID_PARAMS
        assert s.put_parts("lb/r", b"x" * 50, b"y" * 51) == INVALID_PARAMS
        assert s.batch_is_exist(["lb/100", "lb/101", "lb/p", "lb/q", "lb/r"]) == [1, 0, 0, 0, 0]
    finally:
        s.close()
    d = MooncakeDistributedStore()
    assert d.setup_dummy(1 << 20, 10, standalone.master) == OK
    try:
        assert d.put("lb/dummy", b"x" * 11) == INVALID_PARAMS
        a = d.alloc_from_mem_pool(11)
        assert d.put_from("lb/dummy", a, 11) == OK
    finally:
        d.close()


# ---- the rest of the reference ----

def test_replica_descriptors(store, standalone):
    assert store.put("rd/k", pattern(777, 5), ReplicateConfig(replica_num=2)) == OK
    descs = store.get_replica_desc("rd/k")
    assert len(descs) == 2
    endpoints = {seg["name"]: seg["endpoint"] for seg in segments(standalone.master).values()}
    for d in descs:
        assert d.is_memory_replica() and not d.is_disk_replica()
        m = d.get_memory_descriptor().buffer_descriptor
        assert m.size == 777 and m.transport_endpoint == endpoints[m.segment_name]
    assert store.get_replica_desc("rd/missing") == []
    both = store.batch_get_replica_desc(["rd/k", "rd/missing"])
    assert len(both["rd/k"]) == 2 and both["rd/missing"] == []


def test_put_from_with_metadata_stores_metadata_then_data(store, registered):
    arr, base = registered
    arr[:5] = np.frombuffer(b"DATA!", dtype=np.uint8)
    arr[100:104] = np.frombuffer(b"META", dtype=np.uint8)
    assert store.put_from_with_metadata("meta/k", base, base + 100, 5, 4) == OK
    assert store.get("meta/k") == b"METADATA!"
    assert store.put_from_with_metadata("meta/empty", base, base + 100, 0, 4) == OK
    assert store.is_exist("meta/empty") == 0  # size 0 stores nothing, as in Mooncake


def test_multi_buffer_get_takes_mooncakes_fourth_argument(store, registered):
    arr, base = registered
    assert store.put("mb4/k", b"abcdef") == OK
    assert store.batch_get_into_multi_buffers(["mb4/k"], [[base, base + 10]], [[3, 3]],
                                              True) == [6]
    assert bytes(arr[0:3]) == b"abc" and bytes(arr[10:13]) == b"def"


def test_tensor_from_calls_need_no_torch(store, registered):
    arr, base = registered
    blob = pattern(300, 6)  # a caller-serialized tensor object: stored as is
    arr[:300] = np.frombuffer(blob, dtype=np.uint8)
    assert store.put_tensor_from("t/from", base, 300) == OK
    assert store.batch_put_tensor_from(["t/from2"], [base], [300]) == [OK]
    assert store.upsert_tensor_from("t/from", base + 1, 299) == OK
    assert store.batch_upsert_tensor_from(["t/from2"], [base + 2], [298]) == [OK]
    assert store.get_batch(["t/from", "t/from2"]) == [blob[1:], blob[2:]]


def test_tensor_helpers_without_torch(store, monkeypatch):
    import granary.compat.mooncake as layer
    monkeypatch.setattr(layer, "_torch", lambda: None)  # as on a host where import torch fails
    assert store.put_tensor("t/x", object()) == INVALID_PARAMS
    assert store.batch_put_tensor(["t/x", "t/y"], [1, 2]) == [INVALID_PARAMS] * 2
    assert store.pub_tensor("t/x", object(), ReplicateConfig()) == INVALID_PARAMS
    assert store.put_tensor_with_tp("t/x", object(), 0, 2) == INVALID_PARAMS
    assert store.put("t/raw", b"not a tensor") == OK
    assert store.get_tensor("t/raw") is None
    assert store.batch_get_tensor(["t/raw", "t/x"]) == [None, None]
    assert store.get_tensor_with_tp("t/raw", 0, 2) is None
    assert store.is_exist("t/x") == 0


def test_tensor_helpers_with_torch(store):
    import torch
    t = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    assert store.put_tensor("tt/a", t) == OK
    assert torch.equal(store.get_tensor("tt/a"), t)
    b = torch.ones(8, dtype=torch.bfloat16)
    assert store.batch_put_tensor(["tt/b", "tt/c"], [b, t]) == [OK, OK]
    got = store.batch_get_tensor(["tt/b", "tt/c", "tt/missing"])
    assert torch.equal(got[0], b) and torch.equal(got[1], t) and got[2] is None
    assert store.put_tensor_with_tp("tt/tp", t, tp_rank=0, tp_size=2, split_dim=2) == OK
    assert torch.equal(store.get_tensor_with_tp("tt/tp", 1, 2), t.chunk(2, 2)[1])


def test_calls_granary_does_not_support_return_codes(store):
    assert store.init_all("tcp", "") == INVALID_PARAMS
    assert store.mount_segment("/dev/shm/x", 4096) == {"ret": INVALID_PARAMS, "segment_ids": []}
    assert store.allocate_and_mount_segment(4096)["ret"] == INVALID_PARAMS
    assert store.unmount_segment(["x"]) == INVALID_PARAMS
    assert store.unmount_and_free_segment(["x"]) == INVALID_PARAMS
    assert store.create_copy_task("k", ["seg"]) == (uuid.UUID(int=0), INVALID_PARAMS)
    assert store.create_move_task("k", "a", "b") == (uuid.UUID(int=0), INVALID_PARAMS)
    assert store.query_task(uuid.uuid4()) == (None, INVALID_PARAMS)
    assert store.put_tensor_with_parallelism("k", object()) == INVALID_PARAMS
    assert store.batch_put_tensor_with_parallelism(["k", "l"], [1, 2]) == [INVALID_PARAMS] * 2
    assert store.get_tensor_with_parallelism("k") is None


def test_bind_to_numa_node_pins_to_that_nodes_cpus():
    path = "/sys/devices/system/node/node0/cpulist"
    if not os.path.exists(path):
        pytest.skip("this host exposes no NUMA topology")
    node0 = set()
    for part in open(path).read().strip().split(","):
        lo, _, hi = part.partition("-")
        node0.update(range(int(lo), int(hi or lo) + 1))
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})  # narrowed first, so the binding must widen it
        bind_to_numa_node(0)
        assert os.sched_getaffinity(0) == node0 & before
        bind_to_numa_node(4096)  # no such node: logged, affinity unchanged
        assert os.sched_getaffinity(0) == node0 & before
    finally:
        os.sched_setaffinity(0, before)
