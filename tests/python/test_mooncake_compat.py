"""granary.compat.mooncake against a real store: every method of MOONCAKE-API.md's table, with its
return conventions and error codes."""

import numpy as np
import pytest

import granary
from granary.compat.mooncake import MooncakeDistributedStore, ReplicateConfig, SoftPinAction
from conftest import Node, Worker

OK, BUFFER_OVERFLOW, INVALID_PARAMS = 0, -10, -600
OBJECT_NOT_FOUND, OBJECT_HAS_LEASE, UNAVAILABLE = -704, -706, -1010


def pattern(n, seed):
    return (np.arange(n, dtype=np.uint64) * 2654435761 + seed).astype(np.uint8).tobytes()


@pytest.fixture(scope="module")
def store(standalone):
    s = MooncakeDistributedStore()
    # Mooncake's seven positional arguments; a 64 MB segment embedded in this process.
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 64 * 1024 * 1024, 16 * 1024 * 1024, "tcp", "",
                   standalone.master) == OK
    yield s
    assert s.close() == OK


@pytest.fixture
def buf(store):
    """A registered 1 MiB NumPy buffer: (array, address)."""
    arr = np.zeros(1 << 20, dtype=np.uint8)
    address = arr.ctypes.data
    assert store.register_buffer(address, arr.nbytes) == OK
    yield arr, address
    assert store.unregister_buffer(address) == OK


def native(standalone):
    return granary.Store(standalone.master)


# ---- setup, health, hostname ----

def test_setup_embeds_a_segment_and_names_it(store, standalone):
    name = store.get_hostname()
    with native(standalone) as s:
        segments = {seg["name"]: seg for seg in s.segments()}
    assert name in segments and segments[name]["size"] == 64 * 1024 * 1024
    assert standalone.segment in segments


def test_setup_with_a_dict_and_human_sizes(standalone):
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": "16MB", "local_buffer_size": "1 GB",
                    "protocol": "tcp", "device_name": "",
                    "master_server_addr": standalone.master}) == OK
    with native(standalone) as n:
        sizes = {seg["name"]: seg["size"] for seg in n.segments()}
    assert sizes[s.get_hostname()] == 16 * 1024 * 1024
    # The 1 GB local buffer backs alloc_from_mem_pool; untouched pages cost nothing.
    assert s.alloc_from_mem_pool(1 << 29) != 0
    assert s.put("dict-setup", b"x") == OK and s.get("dict-setup") == b"x"
    assert s.setup({"master_server_addr": standalone.master}) == UNAVAILABLE  # already set up
    assert s.close() == OK


def test_setup_errors(standalone):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "rdma", "mlx5_0",
                   standalone.master) == INVALID_PARAMS
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "lots", 0, "tcp", "",
                   standalone.master) == INVALID_PARAMS
    assert s.setup({"master_server_addr": standalone.master, "no_such_key": 1}) == INVALID_PARAMS
    assert s.health_check() == 1
    assert s.put("k", b"v") == UNAVAILABLE and s.get("k") == b""


def test_health_check_lifecycle(master):
    s = MooncakeDistributedStore()
    assert s.health_check() == 1  # before setup
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master.address) == OK
    assert s.health_check() == 0
    master.stop()
    assert s.health_check() == 2
    assert s.close() == OK
    assert s.health_check() == 1  # after close


def test_setup_with_no_master_fails():
    from conftest import free_port
    s = MooncakeDistributedStore()
    code = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", f"127.0.0.1:{free_port()}")
    assert code in (-900, -901)
    assert s.health_check() == 1


# ---- put / get ----

def test_put_get_and_miss(store):
    value = pattern(100_000, 1)
    assert store.put("c/put", value) == OK
    assert store.get("c/put") == value
    assert store.get("c/missing") == b""
    assert store.get_size("c/put") == len(value)
    assert store.get_size("c/missing") == OBJECT_NOT_FOUND


def test_put_of_an_existing_key_keeps_the_old_value(store):
    assert store.put("c/once", b"first") == OK
    assert store.put("c/once", b"second, longer") == OK
    assert store.get("c/once") == b"first"


def test_upsert_overwrites(store, buf):
    assert store.upsert("c/up", b"one") == OK
    assert store.upsert("c/up", b"two, longer") == OK
    assert store.get("c/up") == b"two, longer"
    arr, address = buf
    arr[:5] = np.frombuffer(b"three", dtype=np.uint8)
    assert store.upsert_from("c/up", address, 5) == OK
    assert store.get("c/up") == b"three"
    arr[100:104] = np.frombuffer(b"four", dtype=np.uint8)
    assert store.batch_upsert_from(["c/up", "c/up2"], [address + 100, address],
                                   [4, 5]) == [OK, OK]
    assert store.get_batch(["c/up", "c/up2"]) == [b"four", b"three"]


def test_put_parts_concatenates(store):
    assert store.put_parts("c/parts", b"ab", bytearray(b"cd"), memoryview(b"ef")) == OK
    assert store.get("c/parts") == b"abcdef"


def test_put_batch_and_get_batch_with_duplicates_and_misses(store):
    keys = ["c/b0", "c/b1", "c/b0"]
    assert store.put_batch(keys, [b"zero", b"one", b"other"]) == OK
    assert store.get("c/b0") == b"zero"  # the first of the duplicates wins; the second is a no-op
    assert store.get_batch(["c/b0", "c/nope", "c/b1", "c/b0"]) == [b"zero", b"", b"one", b"zero"]
    assert store.batch_is_exist(["c/b0", "c/nope", "c/b1"]) == [1, 0, 1]
    assert store.put_batch(["c/b2"], [b"a", b"b"]) == INVALID_PARAMS  # counts differ


def test_get_buffer(store):
    value = pattern(3000, 2)
    assert store.put("c/gb", value) == OK
    b = store.get_buffer("c/gb")
    assert bytes(memoryview(b)) == value and b.size() == len(value) and b.ptr() != 0
    assert store.get_buffer("c/nope") is None
    got = store.batch_get_buffer(["c/gb", "c/nope"])
    assert bytes(got[0]) == value and got[1] is None


# ---- zero copy ----

def test_put_from_and_get_into(store, buf):
    arr, address = buf
    value = np.frombuffer(pattern(200_000, 3), dtype=np.uint8)
    arr[:value.size] = value
    assert store.put_from("c/zc", address, value.size) == OK
    arr[:] = 0
    assert store.get_into("c/zc", address + 4096, arr.nbytes - 4096) == value.size
    assert np.array_equal(arr[4096:4096 + value.size], value)
    assert store.get_into("c/nope", address, 100) == OBJECT_NOT_FOUND


def test_get_into_too_small_is_an_error_not_a_partial_copy(store, buf):
    arr, address = buf
    assert store.put("c/big", pattern(5000, 4)) == OK
    arr[:] = 0xAB
    assert store.get_into("c/big", address, 4999) == BUFFER_OVERFLOW
    assert (arr == 0xAB).all()  # not one byte written
    assert store.batch_get_into(["c/big"], [address], [10]) == [BUFFER_OVERFLOW]
    assert (arr == 0xAB).all()


def test_unregistered_or_out_of_range_addresses_are_refused(store, buf):
    arr, address = buf
    other = np.zeros(4096, dtype=np.uint8)
    assert store.put("c/addr", b"x" * 100) == OK
    assert store.put_from("c/addr2", other.ctypes.data, 100) == INVALID_PARAMS
    assert store.get_into("c/addr", other.ctypes.data, 4096) == INVALID_PARAMS
    # Inside the registered buffer at the start, past its end by one byte at the end.
    assert store.get_into("c/addr", address + arr.nbytes - 100, 101) == INVALID_PARAMS
    assert store.put_from("c/addr3", address, arr.nbytes + 1) == INVALID_PARAMS
    assert store.put_from("c/addr4", 2**64 - 8, 16) == INVALID_PARAMS
    assert store.is_exist("c/addr2") == 0 and store.is_exist("c/addr3") == 0
    assert store.register_buffer(0, 100) == INVALID_PARAMS
    assert store.unregister_buffer(other.ctypes.data) == INVALID_PARAMS


def test_batch_put_from_and_batch_get_into(store, buf):
    arr, address = buf
    keys = [f"c/bz{i}" for i in range(8)]
    values = [np.frombuffer(pattern(10_000 + i, i), dtype=np.uint8) for i in range(8)]
    offsets = [i * 16384 for i in range(8)]
    for v, o in zip(values, offsets):
        arr[o:o + v.size] = v
    assert store.batch_put_from(keys, [address + o for o in offsets],
                                [v.size for v in values]) == [OK] * 8
    arr[:] = 0
    got = store.batch_get_into(keys + ["c/nope"], [address + o for o in offsets] + [address],
                               [16384] * 9)
    assert got == [v.size for v in values] + [OBJECT_NOT_FOUND]
    for v, o in zip(values, offsets):
        assert np.array_equal(arr[o:o + v.size], v)
    # One bad address fails its own key only.
    assert store.batch_put_from(["c/bz-ok", "c/bz-bad"], [address, 12345], [10, 10]) == \
        [OK, INVALID_PARAMS]
    assert store.batch_put_from(["a", "b"], [address], [1, 2]) == [INVALID_PARAMS] * 2


def test_multi_buffer_calls_gather_and_scatter(store, buf):
    arr, address = buf
    arr[0:3] = [1, 2, 3]
    arr[1000:1002] = [4, 5]
    arr[5000:5004] = [6, 7, 8, 9]
    codes = store.batch_put_from_multi_buffers(
        ["c/mb0", "c/mb1"], [[address, address + 1000], [address + 5000]], [[3, 2], [4]])
    assert codes == [OK, OK]
    assert store.get("c/mb0") == bytes([1, 2, 3, 4, 5])
    arr[:] = 0
    got = store.batch_get_into_multi_buffers(
        ["c/mb0", "c/mb1", "c/nope"],
        [[address + 100, address + 200], [address + 300], [address]], [[2, 10], [4], [4]])
    assert got == [5, 4, OBJECT_NOT_FOUND]
    assert list(arr[100:102]) == [1, 2] and list(arr[200:203]) == [3, 4, 5]
    assert list(arr[300:304]) == [6, 7, 8, 9]
    # Together the buffers are one byte short: an error, nothing written.
    arr[:] = 0
    assert store.batch_get_into_multi_buffers(["c/mb0"], [[address, address + 10]],
                                              [[2, 2]]) == [BUFFER_OVERFLOW]
    assert not arr.any()


# ---- existence, removal ----

def test_is_exist(store):
    assert store.put("c/ex", b"1") == OK
    assert store.is_exist("c/ex") == 1 and store.is_exist("c/nope") == 0


def test_remove_with_and_without_force_under_a_read_lock(store, standalone):
    assert store.put("c/leased", b"held") == OK
    reader = Worker(standalone.master, "c/leased")  # another client holding a read lock
    try:
        assert store.remove("c/leased") == OBJECT_HAS_LEASE
        assert store.get("c/leased") == b"held"
        assert store.batch_remove(["c/leased"]) == [OBJECT_HAS_LEASE]
        assert store.remove("c/leased", force=True) == OK
        assert store.is_exist("c/leased") == 0
    finally:
        reader.stop()
    assert store.remove("c/leased") == OBJECT_NOT_FOUND


def test_batch_remove_and_remove_by_regex(store):
    assert store.put_batch([f"c/rx/{i}" for i in range(5)], [b"v"] * 5) == OK
    assert store.put("c/keep", b"k") == OK
    assert store.batch_remove(["c/rx/0", "c/nope"]) == [OK, OBJECT_NOT_FOUND]
    assert store.remove_by_regex("^c/rx/[0-2]") == 2
    assert store.remove_by_regex(regex="^c/rx/3") == 1
    assert store.remove_by_regex(regex_pattern="^c/rx/") == 1
    assert store.batch_is_exist([f"c/rx/{i}" for i in range(5)]) == [0] * 5
    assert store.is_exist("c/keep") == 1
    assert store.remove_by_regex("(") == INVALID_PARAMS


def test_remove_all():
    node = Node(standalone=True, size="64MiB")
    s = MooncakeDistributedStore()
    try:
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 4096, "tcp", "", node.master) == OK
        assert s.put_batch([f"all/{i}" for i in range(10)], [b"v"] * 10) == OK
        reader = Worker(node.master, "all/3")
        try:
            assert s.remove_all() == 9  # the read-locked one stays
            assert s.is_exist("all/3") == 1
            assert s.remove_all(force=True) == 1
        finally:
            reader.stop()
        assert s.batch_is_exist([f"all/{i}" for i in range(10)]) == [0] * 10
    finally:
        s.close()
        node.stop()


# ---- configs and the memory pool ----

def test_replicate_config(store, standalone):
    cfg = ReplicateConfig()
    cfg.replica_num = 2  # two segments in this store: the node's and the embedded one
    cfg.with_hard_pin = True
    assert store.put("c/rep2", b"twice", cfg) == OK
    with native(standalone) as n:
        st = n.stat("c/rep2")
        assert len(st["replicas"]) == 2 and st["hard_pinned"]
        assert len({r["segment"] for r in st["replicas"]}) == 2
        cfg = ReplicateConfig(preferred_segment=store.get_hostname(),
                              soft_pin_action=SoftPinAction.ENABLE)
        assert store.put("c/pref", b"here", config=cfg) == OK
        st = n.stat("c/pref")
        assert [r["segment"] for r in st["replicas"]] == [store.get_hostname()]
        assert st["soft_pinned"]
    cfg = ReplicateConfig()
    cfg.replica_num = 0
    assert store.put("c/rep0", b"x", cfg) == INVALID_PARAMS


def test_replica_num_above_the_segment_count_stores_what_fits(standalone):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 4096, "tcp", "", standalone.master) == OK
    try:
        assert s.put("c/rep9", b"best effort", ReplicateConfig(replica_num=9)) == OK
        assert s.get("c/rep9") == b"best effort"
    finally:
        s.close()


def test_alloc_from_mem_pool(standalone):
    s = MooncakeDistributedStore()
    assert s.alloc_from_mem_pool(100) == 0  # no pool before setup
    assert s.setup_dummy(1 << 20, 1 << 20, standalone.master) == OK
    try:
        a = s.alloc_from_mem_pool(4096)
        b = s.alloc_from_mem_pool(4096)
        assert a and b and abs(a - b) >= 4096 and a % 64 == 0
        assert s.alloc_from_mem_pool(2 << 20) == 0  # larger than the pool
        assert s.put("c/pool", pattern(4096, 5)) == OK
        assert s.get_into("c/pool", a, 4096) == 4096  # pool memory needs no register_buffer
        assert bytes((np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * 4096)
                                            .from_address(a)))) == pattern(4096, 5)
        assert s.free_to_mem_pool(a) == OK and s.free_to_mem_pool(a) == INVALID_PARAMS
        assert s.alloc_from_mem_pool(4096) == a  # the freed block is reused
    finally:
        s.close()


def test_calls_after_close_report_unavailable(standalone):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", standalone.master) == OK
    assert s.close() == OK
    assert s.put("c/closed", b"x") == UNAVAILABLE
    assert s.batch_is_exist(["a", "b"]) == [UNAVAILABLE] * 2
    assert s.get("c/closed") == b"" and s.get_buffer("c/closed") is None
