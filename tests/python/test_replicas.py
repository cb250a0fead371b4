"""Replica counts and drains from Python (granary.Store.replicate, drain, undrain) against a real
master and three real nodes: a raised count is copied in the background, a lowered one drops at
once, a drained segment is emptied of what only it held and unmounted, and every byte reads back
exact."""

import time

import pytest

import granary
from conftest import Master, Node


def wait(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def cluster():
    master = Master("--client-ttl", "2s", "--lease-ttl", "1s")
    nodes = [Node(master.address, size="32MiB") for _ in range(3)]
    try:
        yield master, nodes
    finally:
        for n in nodes:
            n.stop()
        master.stop()


def test_replicate_up_down_and_errors(cluster):
    master, nodes = cluster
    store = granary.Store(master.address)
    values = {f"py/rep{i}": bytes([i]) * (10000 + i) for i in range(10)}
    for k, v in values.items():
        store.put(k, v)
    for k in values:
        store.replicate(k, 3)
        assert store.stat(k)["want_replicas"] == 3
    assert wait(lambda: all(len(store.stat(k)["replicas"]) == 3 for k in values))
    for k, v in values.items():
        assert store.get(k) == v
        assert len({r["segment"] for r in store.stat(k)["replicas"]}) == 3
    assert store.replicate_many(list(values) + ["py/none"], 1) == [True] * 10 + [False]
    assert all(len(store.stat(k)["replicas"]) == 1 for k in values)
    with pytest.raises(granary.NotFound):
        store.replicate("py/none", 2)
    with pytest.raises(granary.Error):
        store.replicate("py/rep0", 0)


def test_drain_moves_single_replicas_off_and_unmounts(cluster):
    master, nodes = cluster
    store = granary.Store(master.address)
    values = {f"py/drain{i}": bytes([i + 1]) * (20000 + i) for i in range(30)}
    for k, v in values.items():
        store.put(k, v)
    victim = nodes[0].segment
    on_victim = [k for k in values if store.stat(k)["replicas"][0]["segment"] == victim]
    assert on_victim, "placement did not use the victim"
    store.drain(victim)
    assert any(s["draining"] for s in store.segments() if s["name"] == victim) or \
        victim not in [s["name"] for s in store.segments()]
    assert wait(lambda: victim not in [s["name"] for s in store.segments()])
    for k, v in values.items():
        assert store.get(k) == v
        assert store.stat(k)["replicas"][0]["segment"] != victim
    with pytest.raises(granary.Error):
        store.drain("py-no-such-segment")
    done = [d for d in store.drains() if d["segment"] == victim]
    assert len(done) == 1 and done[0]["done"] and not done[0]["drop"], store.drains()
    store.undrain(victim)
    assert victim not in [d["segment"] for d in store.drains()]
