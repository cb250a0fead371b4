"""Batch calls of many small objects through the Mooncake layer, from Python: the per-key cost of
`batch_put_from`, `batch_is_exist` and `batch_get_into` (docs/benchmarks.md, "Batch calls of
8,192 keys"). Each put batch writes new keys; the gets read the last batch put.

    PYTHONPATH=build/python python3 bench/batch_calls.py --master 127.0.0.1:PORT \\
        [--keys 8192] [--size 1024] [--loops 20]
"""

import argparse
import time

import numpy as np

from granary.compat.mooncake import MooncakeDistributedStore


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--master", required=True)
    p.add_argument("--keys", type=int, default=8192)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--loops", type=int, default=20)
    args = p.parse_args()
    store = MooncakeDistributedStore()
    assert store.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                        "global_segment_size": 0, "local_buffer_size": 0,
                        "master_server_addr": args.master}) == 0
    n, size = args.keys, args.size
    buf = np.full(n * size, 7, dtype=np.uint8)
    assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    ptrs = [buf.ctypes.data + i * size for i in range(n)]
    sizes = [size] * n
    put = exist = get = 0.0
    for loop in range(args.loops):
        keys = [f"batchcalls/{loop}/{i}" for i in range(n)]
        t0 = time.perf_counter()
        assert all(r == 0 for r in store.batch_put_from(keys, ptrs, sizes))
        t1 = time.perf_counter()
        assert all(r == 1 for r in store.batch_is_exist(keys))
        t2 = time.perf_counter()
        assert all(r == size for r in store.batch_get_into(keys, ptrs, sizes))
        t3 = time.perf_counter()
        put, exist, get = put + t1 - t0, exist + t2 - t1, get + t3 - t2
    store.remove_by_regex("^batchcalls/", force=True)
    ms = 1e3 / args.loops
    print(f"{n} keys x {size} B, {args.loops} loops: batch_put_from {put * ms:.2f} ms, "
          f"batch_is_exist {exist * ms:.2f} ms, batch_get_into {get * ms:.2f} ms per call "
          f"({put * ms * 1e3 / n:.2f} / {exist * ms * 1e3 / n:.2f} / {get * ms * 1e3 / n:.2f} us per key)")


if __name__ == "__main__":
    main()
