"""granary.Store, the native Python API, against a real store: misses are None or KeyError,
errors are typed, values come from and go into any buffer-protocol object without copies."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import granary
from conftest import Worker


@pytest.fixture(scope="module")
def store(standalone):
    with granary.Store(standalone.master) as s:
        yield s


def test_put_get_and_miss(store):
    store.put("n/a", b"alpha")
    assert store.get("n/a") == b"alpha"
    assert store.get("n/missing") is None
    assert store.get("n/missing", b"fallback") == b"fallback"
    assert store.exist("n/a") and not store.exist("n/missing")
    assert "n/a" in store and "n/missing" not in store
    assert store.size("n/a") == 5 and store.size("n/missing") is None
    assert store.stat("n/missing") is None and store.stat("n/a")["size"] == 5


def test_mapping_protocol(store):
    with pytest.raises(KeyError):
        store["n/none"]
    with pytest.raises(granary.NotFound) as e:
        store["n/none"]
    assert e.value.code == -704 and e.value.code_name == "OBJECT_NOT_FOUND"
    store["n/item"] = b"one"
    store["n/item"] = b"two"  # item assignment overwrites, like a dict
    assert store["n/item"] == b"two"
    del store["n/item"]
    with pytest.raises(KeyError):
        del store["n/item"]


def test_write_once_and_upsert(store):
    store.put("n/once", b"first")
    store.put("n/once", b"second")
    assert store.get("n/once") == b"first"
    store.upsert("n/once", b"third")
    assert store.get("n/once") == b"third"


def test_any_buffer_protocol_value(store):
    values = {"n/bytes": b"xyz", "n/bytearray": bytearray(b"abc"),
              "n/memoryview": memoryview(b"0123456789")[2:6],
              "n/numpy": np.arange(12, dtype=np.int32).reshape(3, 4)}
    for k, v in values.items():
        store.put(k, v)
    assert store.get("n/bytes") == b"xyz"
    assert store.get("n/bytearray") == b"abc"
    assert store.get("n/memoryview") == b"2345"
    assert np.array_equal(np.frombuffer(store.get("n/numpy"), dtype=np.int32).reshape(3, 4),
                          values["n/numpy"])
    with pytest.raises(TypeError):
        store.put("n/str", "text is not bytes")
    with pytest.raises((BufferError, ValueError)):
        store.put("n/strided", np.arange(10)[::2])  # not contiguous


def test_numpy_round_trip_is_zero_copy(store):
    src = np.random.default_rng(7).standard_normal((256, 1024)).astype(np.float16)
    store.put("n/kv", src)
    dst = np.empty_like(src)
    address = dst.ctypes.data
    assert store.get_into("n/kv", dst) == src.nbytes
    assert dst.ctypes.data == address and np.array_equal(dst, src)  # written in place
    # get_buffer: the returned memory is shared with NumPy, not copied again.
    buf = store.get_buffer("n/kv")
    view = np.frombuffer(buf, dtype=np.float16).reshape(src.shape)
    assert view.ctypes.data == buf.ptr() and np.array_equal(view, src)


def test_get_into_errors(store):
    store.put("n/sized", b"x" * 100)
    small = bytearray(b"\xee" * 99)
    with pytest.raises(granary.BufferTooSmall) as e:
        store.get_into("n/sized", small)
    assert e.value.code == -10 and small == bytearray(b"\xee" * 99)
    assert isinstance(e.value, ValueError)
    assert store.get_into("n/missing", bytearray(10)) is None
    with pytest.raises(BufferError):
        store.get_into("n/sized", b"read-only bytes" * 10)


def test_batches(store):
    keys = [f"n/batch/{i}" for i in range(16)]
    values = [bytes([i]) * (1000 + i) for i in range(16)]
    store.put_many(keys, values)
    assert store.get_many(keys + ["n/missing"]) == values + [None]
    assert store.exist_many(["n/batch/0", "n/missing"]) == [True, False]
    assert store.size_many(["n/batch/1", "n/missing"]) == [1001, None]
    bufs = [bytearray(2000) for _ in keys]
    assert store.get_into_many(keys, bufs) == [len(v) for v in values]
    assert all(b[:len(v)] == v for b, v in zip(bufs, values))
    assert [bytes(b) for b in store.get_buffer_many(keys[:2])] == values[:2]
    assert store.prefix_match(keys[:3] + ["n/missing"] + keys[3:]) == 3
    store.upsert_many(keys[:2], [b"new0", b"new1"])
    assert store.get_many(keys[:2]) == [b"new0", b"new1"]
    assert store.remove_many([keys[0], "n/missing"]) == [True, False]


def test_batch_errors_keep_every_result(store):
    store.put("n/be", b"x" * 50)
    with pytest.raises(granary.BatchError) as e:
        store.get_into_many(["n/be", "n/be", "n/missing"], [bytearray(50), bytearray(10),
                                                             bytearray(5)])
    assert e.value.results[0] == 50 and e.value.results[2] is None
    assert isinstance(e.value.results[1], granary.BufferTooSmall)
    assert list(e.value.errors) == [1]


def test_parts(store):
    store.put_parts("n/parts", [b"ab", bytearray(b"cd"), np.frombuffer(b"ef", np.uint8)])
    assert store.get("n/parts") == b"abcdef"
    store.put_parts_many(["n/p1", "n/p2"], [[b"1", b"2"], [b"3"]])
    assert store.get_many(["n/p1", "n/p2"]) == [b"12", b"3"]


def test_raw_addresses_must_be_registered(store):
    arr = np.arange(4096, dtype=np.uint8)
    with pytest.raises(granary.InvalidArgument):
        store.put_from("n/raw", arr.ctypes.data, arr.nbytes)
    store.register_buffer(arr.ctypes.data, arr.nbytes)
    try:
        store.put_from("n/raw", arr.ctypes.data, arr.nbytes)
        out = np.zeros(8192, dtype=np.uint8)
        store.register_buffer(out.ctypes.data, out.nbytes)
        assert store.get_into_addr("n/raw", out.ctypes.data + 100, 4096) == 4096
        assert np.array_equal(out[100:4196], arr)
        store.put_from_parts_many(["n/rawp"], [[arr.ctypes.data, arr.ctypes.data + 10]],
                                  [[2, 3]])
        assert store.get("n/rawp") == bytes([0, 1, 10, 11, 12])
        assert store.get_into_addr_parts_many(
            ["n/rawp"], [[out.ctypes.data, out.ctypes.data + 50]], [[1, 4]]) == [5]
        assert list(out[0:1]) == [0] and list(out[50:54]) == [1, 10, 11, 12]
        store.unregister_buffer(out.ctypes.data)
        with pytest.raises(granary.InvalidArgument):
            store.get_into_addr("n/raw", out.ctypes.data, 4096)
    finally:
        store.unregister_buffer(arr.ctypes.data)


def test_remove_under_a_read_lock(store, standalone):
    store.put("n/leased", b"v")
    reader = Worker(standalone.master, "n/leased")
    try:
        with pytest.raises(granary.HasLease):
            store.remove("n/leased")
        assert store.remove("n/leased", force=True)
    finally:
        reader.stop()
    assert not store.remove("n/leased")


def test_regex_query_and_removal(store):
    store.put_many([f"n/rx/{i}" for i in range(4)], [b"v" * i for i in range(1, 5)])
    assert sorted(store.query("^n/rx/")) == [(f"n/rx/{i}", i + 1, 1) for i in range(4)]
    assert store.remove_regex("^n/rx/[02]$") == 2
    assert store.exist_many([f"n/rx/{i}" for i in range(4)]) == [False, True, False, True]
    with pytest.raises(granary.InvalidArgument):
        store.remove_regex("(")


def test_concurrent_calls_keep_every_value_intact(store):
    """Eight threads doing 4 MiB puts and gets at once finish with every value intact."""
    value = {i: np.full(4 << 20, i, dtype=np.uint8) for i in range(8)}
    errors = []

    def work(i):
        try:
            for round_ in range(3):
                key = f"n/threads/{i}/{round_}"
                store.put(key, value[i])
                out = np.empty(4 << 20, dtype=np.uint8)
                assert store.get_into(key, out) == out.nbytes and (out == i).all()
                store.remove(key)
        except Exception as e:  # reported below: pytest does not see other threads' failures
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)


def test_a_blocked_call_releases_the_gil(master):
    """While a call waits on a frozen master, another Python thread keeps running; so does
    dropping an open store (its embedded segment unmounts) without close()."""
    s = granary.Store(master.address, segment_size="8MiB", rpc_timeout_ms=1500)

    def ticks_during(blocking):
        ticks, stop = [], threading.Event()

        def ticker():
            while not stop.is_set() and len(ticks) < 10_000:
                ticks.append(time.monotonic())
                time.sleep(0.005)

        os.kill(master.proc.pid, signal.SIGSTOP)
        try:
            t = threading.Thread(target=ticker)
            t.start()
            started = time.monotonic()
            blocking()
            took = time.monotonic() - started
            stop.set()
            t.join(5)
        finally:
            os.kill(master.proc.pid, signal.SIGCONT)
        # With the GIL held the ticker gets no turn until the call returns; released, one per 5 ms.
        return took, len([x for x in ticks if started + 0.05 < x < started + took - 0.05])

    def exist_on_frozen_master():
        with pytest.raises(granary.Unavailable):
            s.exist("n/frozen")

    took, ticks = ticks_during(exist_on_frozen_master)
    assert took >= 1.0 and ticks > 50, (took, ticks)

    def drop():
        nonlocal s
        del s  # no close(): the destructor unmounts the segment, waiting on the frozen master

    took, ticks = ticks_during(drop)
    assert took < 0.2 or ticks > (took - 0.2) * 50, (took, ticks)


def test_stats_count_the_same_host_path(store):
    before = store.stats()
    store.put("n/stats", b"s" * 10_000)
    assert store.get("n/stats") == b"s" * 10_000
    after = store.stats()
    assert after["shm_bytes_written"] - before["shm_bytes_written"] == 10_000
    assert after["shm_bytes_read"] - before["shm_bytes_read"] == 10_000
    assert after["tcp_bytes_read"] == before["tcp_bytes_read"]


def test_stats_count_puts_into_reserved_space(store):
    # The first put of a size misses the pool and fills it in the background; later ones of that
    # size are one master call each (bounded: the refill is asynchronous).
    deadline = time.monotonic() + 10
    i = 0
    while store.stats()["reserved_puts"] == 0 and time.monotonic() < deadline:
        store.put(f"n/reserved/{i}", b"r" * 12_345)
        i += 1
        time.sleep(0.01)
    stats = store.stats()
    assert stats["reserved_puts"] >= 1, stats
    assert isinstance(stats["reservations_held"], int)
    for k in range(i):
        assert store.get(f"n/reserved/{k}") == b"r" * 12_345


def test_replicate_config_takes_only_the_masters_persistence_names():
    # python/types_binding.h: the --persistence names plus "default", and nothing else
    for name in ("default", "eager", "lazy", "none"):
        assert granary.ReplicateConfig(persistence=name).persistence == name
    with pytest.raises(Exception, match="none of default, eager, lazy, none"):
        granary.ReplicateConfig(persistence="sometimes")
    config = granary.ReplicateConfig()
    with pytest.raises(Exception, match="none of default"):
        config.persistence = "always"
    assert config.persistence == "default"


def test_repeat_gets_skip_the_master_unless_the_cache_is_off(standalone):
    # A repeat get within the cache lease is served from the client's location cache; with
    # location_cache_ms=0 every get asks the master.
    with granary.Store(standalone.master) as cached, \
            granary.Store(standalone.master, location_cache_ms=0) as plain:
        cached.put("n/cache/k", b"c" * 5_000)
        for s in (cached, plain):
            for _ in range(3):
                assert s.get("n/cache/k") == b"c" * 5_000
        assert cached.stats()["cached_gets"] == 2
        assert plain.stats()["cached_gets"] == 0
        # the writer's upsert is seen by the reader's next get, never its cached old bytes
        plain.upsert("n/cache/k", b"d" * 6_000)
        assert cached.get("n/cache/k") == b"d" * 6_000


def test_embedded_segment_and_close(standalone):
    s = granary.Store(standalone.master, segment_size="32MiB", segment_name="py-embedded")
    assert s.segment_name == "py-embedded"
    assert any(seg["name"] == "py-embedded" for seg in s.segments())
    s.put("n/emb", b"e", preferred_segments=["py-embedded"])
    assert s.stat("n/emb")["replicas"][0]["segment"] == "py-embedded"
    s.close()
    assert s.closed
    with pytest.raises(granary.Unavailable):
        s.get("n/emb")
    with granary.Store(standalone.master) as other:
        assert all(seg["name"] != "py-embedded" for seg in other.segments())
        assert other.get("n/emb") is None  # its segment is gone, and so is the object


def test_connecting_to_nothing_fails_clearly():
    from conftest import free_port
    with pytest.raises(granary.Unavailable):
        granary.Store(f"127.0.0.1:{free_port()}", segment_size="1MiB", rpc_timeout_ms=2000)
    s = granary.Store(f"127.0.0.1:{free_port()}", rpc_timeout_ms=2000)
    assert not s.healthy()
    with pytest.raises(granary.Unavailable):
        s.ping()
    s.close()


def test_parse_size():
    assert granary.parse_size("16MB") == 16 << 20
    assert granary.parse_size("1 GB") == 1 << 30
    assert granary.parse_size("4KiB") == 4096
    with pytest.raises(granary.InvalidArgument):
        granary.parse_size("many")
