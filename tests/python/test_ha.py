"""The Python package against HA masters: a real etcd, three granary-masters electing a leader in
it, and a granary-node that follows the leader through etcd://. granary.Store, the Mooncake layer
and the CLI all take "etcd://HOST:PORT[;HOST:PORT...]" with a cluster id; a Store keeps working
when the leader is killed.
"""

import os
import signal
import subprocess
import time

import pytest

import granary
from conftest import BIN_DIR, ETCD, HaCluster
from granary.compat.mooncake import MooncakeDistributedStore

OK, INVALID_PARAMS = 0, -600


def need_etcd():
    if not os.access(ETCD, os.X_OK):
        pytest.skip(f"no etcd server at {ETCD} (Debian's etcd-server)")


def pattern(key, size):
    """Bytes that differ for every key and offset."""
    seed = sum(key.encode()) % 251
    return bytes((seed + i * 7 + i // 251) % 256 for i in range(size))


@pytest.fixture(scope="module")
def ha(tmp_path_factory):
    """One HA cluster for the tests that do not kill anything."""
    need_etcd()
    cluster = HaCluster(str(tmp_path_factory.mktemp("ha")))
    yield cluster
    cluster.stop()


@pytest.fixture
def own_ha(tmp_path):
    """A cluster of the test's own, for a test that kills a master."""
    need_etcd()
    cluster = HaCluster(str(tmp_path))
    yield cluster
    cluster.stop()


# First in the file: the module's shared cluster is not started yet, so this one runs alone.
def test_a_store_keeps_working_when_the_leader_is_killed(own_ha):
    store = granary.Store(own_ha.address, cluster_id=own_ha.cluster_id, rpc_timeout_ms=3000)
    try:
        before = {f"ha/b/{i}": pattern(f"ha/b/{i}", 64 * 1024 + i) for i in range(20)}
        store.put_many(list(before), list(before.values()))
        old_leader = own_ha.leader_index()
        old_term = store.cluster_status()["term"]
        assert old_leader >= 0

        own_ha.masters[old_leader].stop(signal.SIGKILL)
        killed = time.monotonic()
        error = None
        for attempt in range(40):  # bounded: each failed put waits at most its rpc timeout
            if time.monotonic() - killed > 15:
                break
            try:
                store.put(f"ha/b/after/{attempt}", pattern("after", 4096))
                error = None
                break
            except granary.Error as e:
                error = e
                time.sleep(0.1)
        took = time.monotonic() - killed
        assert error is None and took < 15, f"no put succeeded {took:.1f}s after the kill: {error}"
        print(f"kill -9 of the leader to the first successful put: {took * 1000:.0f} ms")
        assert took < 10, f"the first put after the kill took {took:.1f}s"

        assert store.get_many(list(before)) == list(before.values())
        for key, value in before.items():
            assert store.get(key) == value
        status = store.cluster_status()
        assert status["term"] > old_term
        assert status["leader_address"] != own_ha.masters[old_leader].address
    finally:
        store.close()


def test_store_over_etcd_puts_gets_and_names_the_leader(ha):
    with granary.Store(ha.address, cluster_id=ha.cluster_id) as store:
        values = {f"ha/a/{i}": pattern(f"ha/a/{i}", 40_000 + 977 * i) for i in range(6)}
        for key, value in values.items():
            store.put(key, value)
        for key, value in values.items():
            assert store.get(key) == value
        assert store.get_many(list(values)) == list(values.values())

        status = store.cluster_status()
        leader = ha.leader_index()
        assert status["ha"] is True and status["cluster_id"] == ha.cluster_id
        assert status["leader_address"] == ha.masters[leader].address
        assert status["leader_id"] and status["term"] >= 1 and status["applied_seq"] > 0
        others = {m.address for i, m in enumerate(ha.masters) if i != leader}
        assert status["standbys"], status
        assert {s["address"] for s in status["standbys"]} <= others
        assert any(s["synchronous"] and s["connected"] for s in status["standbys"]), status
        for s in status["standbys"]:
            assert set(s) == {"id", "address", "connected", "synchronous", "acked_seq", "lag"}


def test_cluster_id_from_the_environment(ha, monkeypatch):
    monkeypatch.setenv("GRANARY_CLUSTER_ID", ha.cluster_id)
    with granary.Store(ha.address) as store:
        store.put("ha/env/0", b"from the environment")
        assert store.get("ha/env/0") == b"from the environment"
        assert store.cluster_status()["cluster_id"] == ha.cluster_id


def test_mooncake_setup_with_an_etcd_master(ha, monkeypatch):
    # The cluster id from setup's dict (a Granary key), with the master as SGLang's config names it.
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": 0, "local_buffer_size": 16 << 20, "protocol": "tcp",
                    "master_server_address": f" {ha.address};", "cluster_id": ha.cluster_id}) == OK
    try:
        value = pattern("ha/c/dict", 100_000)
        assert s.put("ha/c/dict", value) == OK
        assert s.get("ha/c/dict") == value
        assert s.is_exist("ha/c/dict") == 1 and s.health_check() == 0
    finally:
        assert s.close() == OK

    # Positional, the cluster id from $GRANARY_CLUSTER_ID, the address as engines read it from
    # $MOONCAKE_MASTER.
    monkeypatch.setenv("GRANARY_CLUSTER_ID", ha.cluster_id)
    monkeypatch.setenv("MOONCAKE_MASTER", ha.address)
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "",
                   os.environ["MOONCAKE_MASTER"]) == OK
    try:
        assert s.get("ha/c/dict") == value
        assert s.put_batch(["ha/c/0", "ha/c/1"], [b"zero", b"one"]) == OK
        assert s.get_batch(["ha/c/0", "ha/c/1"]) == [b"zero", b"one"]
    finally:
        assert s.close() == OK


@pytest.mark.parametrize("address, says", [
    ("etcd://", "no etcd endpoint"),
    ("etcd:// ; ;", "no etcd endpoint"),
    ("etcd://127.0.0.1", "'127.0.0.1' is not HOST:PORT"),
    ("etcd://127.0.0.1:2379;127.0.0.1", "'127.0.0.1' is not HOST:PORT"),
    ("etcd://127.0.0.1:0", "bad port"),
    ("etcd://127.0.0.1:65536", "bad port"),
    ("etcd://127.0.0.1:23x9", "bad port"),
    ("etcd://[::1]:2379x", "not [IPv6]:PORT"),
    ("etcd://[nope]:2379", "bad IPv6 address"),
    ("etcd://http://127.0.0.1:2379", "is not HOST:PORT"),
])
def test_mooncake_setup_refuses_a_malformed_etcd_address(address, says, caplog):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", address) == INVALID_PARAMS
    assert says in caplog.text and "etcd://HOST:PORT[;HOST:PORT...]" in caplog.text
    assert s.setup_dummy(1 << 20, 1 << 20, address) == INVALID_PARAMS
    assert s.health_check() == 1


def test_mooncake_setup_refuses_a_cluster_id_with_a_slash(caplog):
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                    "master_server_addr": "etcd://127.0.0.1:2379",
                    "cluster_id": "a/b"}) == INVALID_PARAMS
    assert "cluster_id 'a/b'" in caplog.text


def test_cli_health_over_etcd(ha):
    cli = os.path.join(BIN_DIR, "granary")
    leader = ha.masters[ha.leader_index()].address

    def run(args, env=None):
        r = subprocess.run([cli, *args, "health"], capture_output=True, text=True, timeout=30,
                           env=env)
        assert r.returncode == 0, r.stderr + r.stdout
        return r.stdout

    by_flags = run(["--master", ha.address, "--cluster-id", ha.cluster_id])
    env = dict(os.environ, GRANARY_MASTER=ha.address, GRANARY_CLUSTER_ID=ha.cluster_id)
    by_env = run([], env)
    for out in (by_flags, by_env):
        assert f"HA cluster {ha.cluster_id}: leader " in out and f" at {leader}," in out, out
        standbys = [line for line in out.splitlines() if line.strip().startswith("standby ")]
        assert any("streaming" in line for line in standbys), out


def test_cluster_status_of_a_master_running_alone(master):
    with granary.Store(master.address, segment_size="4MiB") as store:
        store.put("alone", b"x")
        status = store.cluster_status()
        assert status["ha"] is False and status["standbys"] == []
        assert status["applied_seq"] > 0
