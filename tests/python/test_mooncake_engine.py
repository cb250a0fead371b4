"""An engine-shaped test of our own: what a tensor-parallel engine's host KV cache does with
granary.compat.mooncake, in separate processes.

Two "TP rank" writer processes each register a host KV pool and back their pages up: a first
request's pages with batch_put_from (one page-major buffer per page), then, after batch_is_exist
finds that prefix stored, only the new pages of a longer request with
batch_put_from_multi_buffers (each page gathered from a K pool and a V pool). Two loader
processes, one per rank, find the stored prefix with batch_is_exist and load it into their own
pools with batch_get_into and batch_get_into_multi_buffers, then compare every byte.

Run twice: writers embedding their own segments (setup), one loader over shared memory and one
over TCP; and every process a setup_dummy client of `granary-node --standalone` whose pools come
from MooncakeHostMemAllocator, with every byte moving through shared memory."""

import pytest

from conftest import wait_for_line

COMMON = r"""
import ctypes, sys
import numpy as np
from granary.compat.mooncake import MooncakeDistributedStore, MooncakeHostMemAllocator

master, rank, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
PAGES, HALF = 8, 32 * 1024            # a page: K and V halves of 32 KiB (4 layers x 8 KiB)
FIRST, SECOND = range(0, 4), range(4, 8)
MISSING = [f"model-{mode}/h{p}/tp{rank}" for p in (8, 9)]  # pages no one stored
KEYS = [f"model-{mode}/h{p}/tp{rank}" for p in range(PAGES)]

def page(p):
    # The page's bytes, unique per rank and page.
    x = np.arange(2 * HALF, dtype=np.uint64)
    return ((x * 2654435761 + rank * 1000003 + p * 7919) >> np.uint64(7)).astype(np.uint8)

s = MooncakeDistributedStore()
allocator = MooncakeHostMemAllocator()
blocks = []

def pool(n):
    # A host pool of n bytes: NumPy memory, or (standalone mode) MooncakeHostMemAllocator's.
    if mode == "embedded":
        return np.zeros(n, dtype=np.uint8)
    ptr = allocator.alloc(n)
    assert ptr, "MooncakeHostMemAllocator.alloc failed"
    blocks.append(ptr)
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))

# Pools first, then setup: SGLang's standalone mode allocates its host pool before setup_dummy.
kv = pool(PAGES * 2 * HALF).reshape(PAGES, 2 * HALF)     # page-major: K then V
k_pool = pool(PAGES * HALF).reshape(PAGES, HALF)          # layer-split: K pages ...
v_pool = pool(PAGES * HALF).reshape(PAGES, HALF)          # ... and V pages

def connect(segment, use_shm=True):
    if mode == "embedded":
        code = s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                        "global_segment_size": segment, "local_buffer_size": "16MB",
                        "protocol": "tcp", "master_server_addr": master,
                        "use_shared_memory": use_shm})
    else:
        code = s.setup_dummy(kv.nbytes + k_pool.nbytes + v_pool.nbytes, "16MB", master)
    assert code == 0, code
    for arr in (kv, k_pool, v_pool):
        assert s.register_buffer(arr.ctypes.data, arr.nbytes) == 0

def addr(arr, p):
    return arr.ctypes.data + p * arr.shape[1]

def close():
    assert s.close() == 0
    for ptr in blocks:
        assert allocator.free(ptr) == 0
"""

WRITER = COMMON + r"""
connect("32MB")
# Request 1 covers pages 0-3: none stored yet, so all are backed up, one buffer per page.
assert s.batch_is_exist([KEYS[p] for p in FIRST]) == [0] * 4
for p in FIRST:
    kv[p] = page(p)
assert s.batch_put_from([KEYS[p] for p in FIRST], [addr(kv, p) for p in FIRST],
                        [2 * HALF] * 4) == [0] * 4
# Request 2 covers pages 0-7: the prefix check finds 0-3, so only 4-7 are written, each
# gathered from its K and V pages.
found = s.batch_is_exist(KEYS)
assert found == [1] * 4 + [0] * 4, found
prefix = found.index(0)
new = range(prefix, PAGES)
for p in new:
    k_pool[p], v_pool[p] = page(p)[:HALF], page(p)[HALF:]
assert s.batch_put_from_multi_buffers(
    [KEYS[p] for p in new], [[addr(k_pool, p), addr(v_pool, p)] for p in new],
    [[HALF, HALF] for _ in new]) == [0] * 4
stats = s._client.stats()
print("backed", prefix, stats["shm_bytes_written"], stats["tcp_bytes_written"], flush=True)
sys.stdin.readline()  # an embedded segment holds pages: keep it until the loaders are done
close()
print("closed", flush=True)
"""

LOADER = COMMON + r"""
use_shm = sys.argv[4] == "shm"
connect(0, use_shm)
# Which prefix of this request (10 pages) is stored?
found = s.batch_is_exist(KEYS + MISSING)
assert found == [1] * PAGES + [0, 0], found
prefix = found.index(0)
assert prefix == PAGES
kv[:] = 0; k_pool[:] = 0; v_pool[:] = 0
# Pages 0-3 into the page-major pool, pages 4-7 scattered into the K and V pools.
assert s.batch_get_into([KEYS[p] for p in FIRST], [addr(kv, p) for p in FIRST],
                        [2 * HALF] * 4) == [2 * HALF] * 4
assert s.batch_get_into_multi_buffers(
    [KEYS[p] for p in SECOND], [[addr(k_pool, p), addr(v_pool, p)] for p in SECOND],
    [[HALF, HALF] for _ in SECOND]) == [2 * HALF] * 4
for p in FIRST:
    assert np.array_equal(kv[p], page(p)), f"page {p} differs"
for p in SECOND:
    assert np.array_equal(k_pool[p], page(p)[:HALF]), f"K of page {p} differs"
    assert np.array_equal(v_pool[p], page(p)[HALF:]), f"V of page {p} differs"
assert not kv[SECOND.start:].any()  # nothing landed where it was not asked for
stats = s._client.stats()
print("loaded", stats["shm_bytes_read"], stats["tcp_bytes_read"], flush=True)
close()
"""

PAGE_BYTES = 64 * 1024
RANK_BYTES = 8 * PAGE_BYTES


def line(proc, prefix):
    try:
        return wait_for_line(proc, prefix, timeout=60)
    except (RuntimeError, TimeoutError):
        proc.kill()
        raise AssertionError(proc.communicate(timeout=10)[1].decode())


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()
    return out.decode()


@pytest.mark.parametrize("mode", ["embedded", "standalone"])
def test_tp_ranks_back_up_and_others_load_their_kv_pages(standalone, run_python, mode):
    writers = [run_python(WRITER, standalone.master, str(rank), mode) for rank in (0, 1)]
    for w in writers:
        fields = line(w, "backed").split()
        assert fields[1] == "4"  # the prefix check found request 1's pages
        if mode == "standalone":
            # All 8 pages written straight into the node's shared memory, none over TCP.
            assert fields[2:] == [str(RANK_BYTES), "0"], fields

    paths = ["shm", "tcp"] if mode == "embedded" else ["shm", "shm"]
    loaders = [run_python(LOADER, standalone.master, str(rank), mode, path)
               for rank, path in zip((0, 1), paths)]
    for loader, path in zip(loaders, paths):
        fields = finish(loader).split()
        assert fields[0] == "loaded"
        shm_read, tcp_read = int(fields[1]), int(fields[2])
        if path == "tcp":
            assert (shm_read, tcp_read) == (0, RANK_BYTES)
        elif mode == "standalone":
            assert (shm_read, tcp_read) == (RANK_BYTES, 0)
        else:
            assert shm_read + tcp_read == RANK_BYTES and tcp_read == 0

    for w in writers:
        w.stdin.write(b"done\n")
        w.stdin.flush()
        assert "closed" in finish(w)
