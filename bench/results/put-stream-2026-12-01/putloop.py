import sys, time, numpy as np
from granary.compat.mooncake import MooncakeDistributedStore
master, tag, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
s = MooncakeDistributedStore()
assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master) == 0
s._client  # noqa
size = 4 << 20
src = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
assert s.register_buffer(src.ctypes.data, src.nbytes) == 0
deadline = time.monotonic() + 30
while s._client.stats()["shm_bytes_warm_pending"] > 0 and time.monotonic() < deadline: time.sleep(0.05)
lat = []
end = time.perf_counter() + seconds
i = 0
while time.perf_counter() < end:
    key = f"pl/{tag}/{i % 200}"
    if i % 200 == 0 and i: s.remove_by_regex("^pl/", force=True)
    t0 = time.perf_counter()
    assert s.put_from(key, src.ctypes.data, size) == 0
    lat.append((time.perf_counter() - t0) * 1e6)
    i += 1
s.remove_by_regex("^pl/", force=True)
lat.sort()
dst = np.empty(1 << 22, dtype=np.uint8); b = np.ones(1 << 22, dtype=np.uint8)
t = []
for _ in range(200):
    t0 = time.perf_counter(); np.copyto(dst, b); t.append((time.perf_counter() - t0) * 1e6)
t.sort()
print(f"{tag}: put_from p50 {lat[len(lat)//2]:.0f} us p90 {lat[len(lat)*9//10]:.0f} n={len(lat)}; numpy copyto p50 {t[100]:.0f}")
