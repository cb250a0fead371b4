"""The SSD tier from Python, against real masters: Mooncake's setup(enable_ssd_offload=True,
ssd_offload_path=DIR) runs the embedded segment's disk tier in DIR, bad values are error codes;
the native Store(disk_dir=...) does the same, and put(persistence=...) overrides the master's
--persistence for one object."""

import os
import time

import pytest

import granary
from granary.compat.mooncake import MooncakeDistributedStore
from conftest import Master

OK, INVALID_PARAMS = 0, -600


def wait_until(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def on_disk(observer, key):
    st = observer.stat(key)
    return st is not None and len(st["disk_replicas"]) > 0


def setup_args(master, segment=16 << 20):
    return ("127.0.0.1", "P2PHANDSHAKE", segment, 16 << 20, "tcp", "", master)


def test_mooncake_setup_enables_the_ssd_tier(tmp_path):
    m = Master("--persistence", "eager")
    s = MooncakeDistributedStore()
    try:
        assert s.setup(*setup_args(m.address), enable_ssd_offload=True,
                       ssd_offload_path=str(tmp_path)) == OK
        values = {f"ssd/{i}": os.urandom(100_000 + i) for i in range(4)}
        for key, value in values.items():
            assert s.put(key, value) == OK
        with granary.Store(m.address) as observer:
            # The embedded segment reports a disk tier, and eager offload fills it.
            assert all(wait_until(lambda k=k: on_disk(observer, k)) for k in values), \
                "the embedded segment offloaded nothing"
            # Its pings report the tier (at the next heartbeat).
            assert wait_until(lambda: [(seg["disk_capacity"] > 0, seg["disk_objects"])
                                       for seg in observer.segments()] == [(True, len(values))])
            for key, value in values.items():
                assert observer.get(key) == value
        assert os.path.exists(tmp_path / "DISK_ID"), "the tier does not live in ssd_offload_path"
        assert s.close() == OK
        # The dict form takes the same two keys, with Mooncake's string flags; the directory
        # holds the first store's disk, which the second takes over.
        assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                        "global_segment_size": "16MB", "local_buffer_size": "16MB",
                        "protocol": "tcp", "master_server_addr": m.address,
                        "enable_ssd_offload": "true", "ssd_offload_path": str(tmp_path)}) == OK
        with granary.Store(m.address) as observer:
            assert wait_until(lambda: observer.segments()[0]["disk_capacity"] > 0)
        assert s.close() == OK
    finally:
        s.close()
        m.stop()


def test_mooncake_ssd_settings_that_cannot_work_are_codes(tmp_path, caplog):
    m = Master()
    s = MooncakeDistributedStore()
    try:
        # Enabled without a path (Mooncake might read its environment; Granary reads none).
        assert s.setup(*setup_args(m.address), enable_ssd_offload=True) == INVALID_PARAMS
        assert "needs ssd_offload_path" in caplog.text
        # Enabled without a segment: nothing to offload from.
        assert s.setup(*setup_args(m.address, segment=0), enable_ssd_offload=True,
                       ssd_offload_path=str(tmp_path)) == INVALID_PARAMS
        assert "global_segment_size > 0" in caplog.text
        # A directory the tier cannot use: the node refuses it, setup says so.
        assert s.setup(*setup_args(m.address), enable_ssd_offload=True,
                       ssd_offload_path=str(tmp_path / "missing")) == INVALID_PARAMS
        assert s.setup(*setup_args(m.address), enable_ssd_offload=True,
                       ssd_offload_path=42) == INVALID_PARAMS
        assert s.health_check() == 1, "a failed setup left the store set up"
        with granary.Store(m.address) as observer:
            assert observer.segments() == [], "a failed setup left a segment mounted"
        # A path without enable_ssd_offload is ignored (as in Mooncake), and said so.
        caplog.clear()
        assert s.setup(*setup_args(m.address), ssd_offload_path=str(tmp_path)) == OK
        assert "is ignored without enable_ssd_offload" in caplog.text
        with granary.Store(m.address) as observer:
            assert observer.segments()[0]["disk_capacity"] == 0
        assert not os.path.exists(tmp_path / "DISK_ID")
        assert s.close() == OK
    finally:
        s.close()
        m.stop()


def test_native_store_disk_tier_and_per_put_persistence(tmp_path):
    m = Master("--persistence", "none")
    try:
        with granary.Store(m.address, segment_size="16MB", disk_dir=tmp_path, disk_size=64 << 20,
                           offload_interval_ms=100) as store:
            store.put("native/eager", b"e" * 50_000, persistence="eager")
            store.put("native/default", b"d" * 50_000)
            assert wait_until(lambda: on_disk(store, "native/eager")), \
                "persistence='eager' was not offloaded under --persistence none"
            time.sleep(1.0)  # ten offload rounds
            assert not on_disk(store, "native/default")
            assert store.segments()[0]["disk_capacity"] == 64 << 20
        config = granary.ReplicateConfig(persistence="lazy")
        assert config.persistence == "lazy"
        config.persistence = "none"
        assert config.persistence == "none"
        assert granary.ReplicateConfig().persistence == "default"
        with pytest.raises(granary.InvalidArgument):
            granary.ReplicateConfig(persistence="sometimes")
        with pytest.raises(granary.InvalidArgument):
            granary.Store(m.address, segment_size="16MB", disk_dir=tmp_path, disk_io="tape")
        with pytest.raises(granary.InvalidArgument):
            granary.Store(m.address, disk_dir=tmp_path)  # a disk tier needs a segment
    finally:
        m.stop()
