"""Three processes on one store: a writer embedding its own segment, a reader that must use TCP,
and a setup_dummy reader attached to the standalone node, which must use shared memory. Every
reader checks every byte."""

import granary
from conftest import wait_for_line

COMMON = r"""
import sys
import numpy as np
from granary.compat.mooncake import MooncakeDistributedStore, ReplicateConfig
SIZES = [1, 4096, 65537, 1 << 20, 5 << 20]
KEYS = [f"proc/{i}" for i in range(len(SIZES))]
def value(i):
    return (np.arange(SIZES[i], dtype=np.uint64) * 40503 + i * 7919).astype(np.uint8).tobytes()
master = sys.argv[1]
s = MooncakeDistributedStore()
"""

WRITER = COMMON + r"""
assert s.setup("127.0.0.1", "P2PHANDSHAKE", "64MB", "16MB", "tcp", "", master) == 0
cfg = ReplicateConfig(preferred_segment=s.get_hostname())
for i, k in enumerate(KEYS):
    assert s.put(k, value(i), cfg) == 0, k
print("ready", s.get_hostname(), flush=True)
sys.stdin.readline()  # the segment (and its objects) live until the test says so
assert s.close() == 0
print("closed", flush=True)
"""

TCP_READER = COMMON + r"""
assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                "global_segment_size": 0, "local_buffer_size": "16MB", "protocol": "tcp",
                "master_server_addr": master, "use_shared_memory": False}) == 0
for i, k in enumerate(KEYS):
    assert s.get(k) == value(i), k
got = s.get_batch(KEYS)
assert got == [value(i) for i in range(len(KEYS))]
stats = s._client.stats()
assert stats["tcp_bytes_read"] == 2 * sum(SIZES) and stats["shm_bytes_read"] == 0, stats
print("ok", stats["tcp_bytes_read"], flush=True)
"""

DUMMY_READER = COMMON + r"""
assert s.setup_dummy("64MB", "16MB", master) == 0
addresses = [s.alloc_from_mem_pool(n) for n in SIZES]
assert all(addresses)
assert s.batch_get_into(KEYS, addresses, SIZES) == SIZES
import ctypes
for i, (a, n) in enumerate(zip(addresses, SIZES)):
    assert ctypes.string_at(a, n) == value(i), KEYS[i]
stats = s._client.stats()
assert stats["shm_bytes_read"] == sum(SIZES) and stats["tcp_bytes_read"] == 0, stats
print("ok", stats["shm_bytes_read"], flush=True)
"""


def finish(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def test_writer_tcp_reader_and_shared_memory_reader(standalone, run_python):
    writer = run_python(WRITER, standalone.master)
    line = wait_for_line(writer, "ready", timeout=30)
    writer_segment = line.split()[1]
    with granary.Store(standalone.master) as s:
        for i in range(5):
            replicas = s.stat(f"proc/{i}")["replicas"]
            assert [r["segment"] for r in replicas] == [writer_segment]
            assert writer_segment != standalone.segment

    assert finish(run_python(TCP_READER, standalone.master)).startswith("ok")
    assert finish(run_python(DUMMY_READER, standalone.master)).startswith("ok")

    writer.stdin.write(b"done\n")
    writer.stdin.flush()
    assert "closed" in finish(writer)
    # The writer's segment left with it: its objects are gone, not wrong.
    with granary.Store(standalone.master) as s:
        assert s.get_many([f"proc/{i}" for i in range(5)]) == [None] * 5
