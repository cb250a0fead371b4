"""GPU memory as a source and destination of the Mooncake layer's zero-copy calls
(register_buffer, put_from, batch_put_from, get_into, batch_get_into and the multi-buffer forms),
on machines without a GPU:

* without CUDA (none at all, or a runtime that finds no GPU, as on this machine), memory the
  process cannot read is refused at registration with the reason CUDA is not there; never a
  crash;
* with tests/tools/sim_cudart.c standing in for libcudart: "device memory" the CPU cannot touch
  (a fault would kill the process), so every byte must go through the runtime's copies. This
  checks which bytes Granary moved through CUDA and from where (straight between a registered
  segment and the GPU on this host, through host memory over TCP), host and GPU parts in one
  call, a failed copy to the GPU failing its key alone; not a GPU: bench/gpu/ runs on one.

Each case runs in its own interpreter: the CUDA runtime is looked for once per process."""

import os
import subprocess
import sys
import textwrap

from conftest import BIN_DIR

SIM = os.path.join(BIN_DIR, "libgranary_sim_cudart.so")

PRELUDE = textwrap.dedent("""
    import ctypes, logging, mmap, sys
    import numpy as np
    from granary import _granary
    from granary.compat.mooncake import MooncakeDistributedStore
    logging.basicConfig(level=logging.ERROR, stream=sys.stdout, format="LOG %(message)s")
    import os
    st = MooncakeDistributedStore()
    assert st.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                     "global_segment_size": 0, "local_buffer_size": 0,
                     "master_server_addr": sys.argv[1],
                     "use_shared_memory": os.environ.get("TEST_USE_SHM", "1") == "1"}) == 0
""")


def run(script, master, cudart, extra_env=None):
    env = dict(os.environ)
    env["GRANARY_CUDART"] = cudart
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script), master, cudart],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


NO_CUDA_CASE = """
    status = _granary.cuda_status()
    print("REASON", status["reason"])
    assert not status["available"]
    # What a GPU allocation looks like to a process without CUDA's help: reserved address space
    # it cannot read (CUDA maps device memory PROT_NONE in the host's view).
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    gpu_like = libc.mmap(None, 1 << 20, 0, 0x22, -1, 0)  # PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS
    assert st.register_buffer(gpu_like, 1 << 20) == -600
    assert st.register_buffer(0x1000, 4096) == -600          # nothing mapped there
    host = np.zeros(1 << 16, dtype=np.uint8)
    # a range running off the end of a host buffer into unmapped space is refused too
    assert st.register_buffer(host.ctypes.data, 1 << 40) == -600
    assert st.batch_put_from(["g/x"], [gpu_like], [4096]) == [-600]   # not registered
    assert st.get_into("g/x", gpu_like, 4096) == -600
    # host memory still works as before
    host[:5] = np.frombuffer(b"hello", dtype=np.uint8)
    assert st.register_buffer(host.ctypes.data, host.nbytes) == 0
    assert st.put_from("g/h", host.ctypes.data, 5) == 0
    assert st.get("g/h") == b"hello"
    print("DONE")
"""


def test_without_cuda_memory_the_process_cannot_read_is_refused_with_the_reason(standalone):
    out = run(NO_CUDA_CASE, standalone.master, "none")
    assert "DONE" in out
    assert "REASON CUDA is turned off (GRANARY_CUDART=none)" in out
    assert "are not memory of this process; if they are GPU memory: CUDA is turned off" in out

    out = run(NO_CUDA_CASE, standalone.master, "/nonexistent/libcudart.so")
    assert "DONE" in out and "no CUDA runtime found" in out and "GRANARY_CUDART" in out


def test_host_memory_alone_never_brings_cuda_in(standalone):
    # A process that registers only host memory must not initialise CUDA (it would break CUDA in
    # the children it forks): the runtime is looked for only for memory the CPU cannot read.
    out = run("""
    host = np.zeros(1 << 16, dtype=np.uint8)
    assert st.register_buffer(host.ctypes.data, host.nbytes) == 0
    assert st.put_from("g/host-only", host.ctypes.data, 100) == 0
    assert st.get_into("g/host-only", host.ctypes.data + 1000, 100) == 100
    maps = open("/proc/self/maps").read()
    assert "sim_cudart" not in maps, "a host-only process loaded the CUDA runtime"
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    unreadable = libc.mmap(None, 1 << 16, 0, 0x22, -1, 0)
    assert st.register_buffer(unreadable, 1 << 16) == -600  # now CUDA is asked: not its memory
    assert "sim_cudart" in open("/proc/self/maps").read()
    print("DONE")
    """, standalone.master, SIM)
    assert "DONE" in out and "are neither memory of this process nor GPU memory" in out


def test_a_cuda_runtime_without_a_gpu_is_named_with_its_error(standalone):
    # This image ships CUDA's runtime and no driver: whichever libcudart the loader finds (or
    # none) must be reported, never used.
    out = run(NO_CUDA_CASE, standalone.master, "")
    assert "DONE" in out
    reason = [line for line in out.splitlines() if line.startswith("REASON")][0]
    assert ("found no usable GPU" in reason or "sees no GPU" in reason or
            "no CUDA runtime found" in reason), reason


SIM_PRELUDE = """
    sim = ctypes.CDLL(sys.argv[2])
    sim.sim_bytes_to_device.restype = ctypes.c_uint64
    sim.sim_bytes_to_host.restype = ctypes.c_uint64
    sim.sim_bytes_to_device_from_registered.restype = ctypes.c_uint64
    sim.sim_bytes_to_host_into_registered.restype = ctypes.c_uint64
    status = _granary.cuda_status()
    assert status["available"] and status["devices"] == 1, status
    assert status["library"] == sys.argv[2], status

    def device(n):
        p = ctypes.c_void_p()
        assert sim.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0
        return p.value

    def upload(dst, data):
        assert sim.cudaMemcpy(ctypes.c_void_p(dst), data, ctypes.c_size_t(len(data)), 1) == 0

    def download(src, n):
        out = ctypes.create_string_buffer(n)
        assert sim.cudaMemcpy(out, ctypes.c_void_p(src), ctypes.c_size_t(n), 2) == 0
        return out.raw

    def pattern(n, seed):
        return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed * 7919) % 251).astype(
            np.uint8).tobytes()
"""

SIM_CASE = """
    # Objects of 4 KiB to 1.5 MiB, one batch
    sizes = [4096, 100000, 300000, 1500000, 65536, 262144]
    total = sum(sizes)
    src, dst = device(total), device(total + 4096)
    assert st.register_buffer(src, total) == 0
    assert st.register_buffer(dst, total + 4096) == 0
    blobs = [pattern(n, i) for i, n in enumerate(sizes)]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    upload(src, b"".join(blobs))
    tag = "shm" if os.environ.get("TEST_USE_SHM", "1") == "1" else "tcp"
    keys = [f"gpu/{tag}/{i}" for i in range(len(sizes))]
    uploaded = sim.sim_bytes_to_device()  # the test's own upload
    assert st.batch_put_from(keys, [src + o for o in offsets], sizes) == [0] * len(sizes)
    assert sim.sim_bytes_to_host() == total, (sim.sim_bytes_to_host(), total)  # all via the runtime
    shm = os.environ.get("TEST_USE_SHM", "1") == "1"
    # over shared memory, straight into the registered segment; over TCP, through host memory
    assert sim.sim_bytes_to_host_into_registered() == (total if shm else 0)
    for k, b in zip(keys, blobs):
        assert st.get(k) == b, k              # and the store holds exactly those bytes
    # Read back into other GPU memory, with a miss in the middle
    got = st.batch_get_into(keys[:3] + [f"gpu/{tag}/none"] + keys[3:],
                            [dst + o for o in offsets[:3]] + [dst] + [dst + o for o in offsets[3:]],
                            sizes[:3] + [4096] + sizes[3:])
    assert got == sizes[:3] + [-704] + sizes[3:], got
    assert sim.sim_bytes_to_device() - uploaded == total
    # over shared memory, the GPU copied them straight out of the registered segment
    assert sim.sim_bytes_to_device_from_registered() == (total if shm else 0)
    assert sim.sim_registered_live() == (1 if shm else 0)
    assert download(dst, total) == b"".join(blobs)
    # single-object forms
    assert st.put_from(f"gpu/{tag}/one", src + offsets[2], sizes[2]) == 0
    assert st.get_into(f"gpu/{tag}/one", dst + 4096, sizes[2]) == sizes[2]
    assert download(dst + 4096, sizes[2]) == blobs[2]
    # a buffer too small for the object: its error, and the GPU memory past it untouched
    upload(dst, b"\\xee" * 8192)
    assert st.get_into(f"gpu/{tag}/one", dst, 4096) < 0
    assert download(dst, 8192) == b"\\xee" * 8192
    # host and GPU parts in one object, both directions
    host = np.frombuffer(bytearray(pattern(70000, 9)), dtype=np.uint8)
    assert st.register_buffer(host.ctypes.data, host.nbytes) == 0
    parts = [[src, host.ctypes.data, src + 5000], [host.ctypes.data + 100]]
    lens = [[5000, 70000, 20000], [500]]
    assert st.batch_put_from_multi_buffers([f"gpu/{tag}/m0", f"gpu/{tag}/m1"], parts,
                                           lens) == [0, 0]
    expect0 = (b"".join(blobs))[:5000] + host.tobytes() + (b"".join(blobs))[5000:25000]
    assert st.get(f"gpu/{tag}/m0") == expect0
    assert st.get(f"gpu/{tag}/m1") == host.tobytes()[100:600]
    back = np.zeros(70000, dtype=np.uint8)
    assert st.register_buffer(back.ctypes.data, back.nbytes) == 0
    assert st.batch_get_into_multi_buffers(
        [f"gpu/{tag}/m0"], [[dst, back.ctypes.data, dst + 5000]], [lens[0]], True) == [95000]
    assert download(dst, 5000) + back.tobytes() + download(dst + 5000, 20000) == expect0
    # a copy onto the GPU that keeps failing fails its key only, and says so; a batch's copies
    # share one wait, so a failed one is tried once more on its own
    sim.sim_fail_copies_to_device_at.argtypes = [ctypes.c_void_p, ctypes.c_int]
    upload(dst, bytes(sizes[0]))
    sim.sim_fail_copies_to_device_at(dst + 8192, 2)
    got = st.batch_get_into(keys[:2], [dst, dst + 8192], sizes[:2])
    assert got[0] == sizes[0] and got[1] < 0, got
    assert download(dst, sizes[0]) == blobs[0]
    if os.environ.get("TEST_USE_SHM", "1") == "1":
        # failing once, it is tried again and arrives (TCP's copies are not batched: one try)
        upload(dst + 8192, bytes(sizes[1]))
        sim.sim_fail_copies_to_device_at(dst + 8192, 1)
        got = st.batch_get_into(keys[:2], [dst, dst + 8192], sizes[:2])
        assert got == sizes[:2], got
        assert download(dst + 8192, sizes[1]) == blobs[1]
    sim.sim_fail_copies_to_device(0)
    # calls that take host memory only refuse GPU ranges with a code, never touch them
    r = st.get_into_ranges([dst], [[keys[0]]], [[0]], [[0]], [[16]])
    assert r == [[[-600]]], r
    # no pinned staging buffer anywhere: segments are registered, other paths use host memory
    assert sim.sim_pinned_live() == 0, sim.sim_pinned_live()
    # a closed client's segment mappings are unregistered, each before it is unmapped
    import gc
    assert st.close() == 0
    del st
    gc.collect()
    assert sim.sim_registered_live() == 0, sim.sim_registered_live()
    assert sim.sim_unregistered_unmapped() == 0
    print("DONE")
"""


def test_gpu_ranges_move_only_through_the_cuda_runtime(standalone):
    # through this host's shared memory
    assert os.path.exists(SIM), SIM
    out = run(SIM_PRELUDE + SIM_CASE, standalone.master, SIM)
    assert "DONE" in out


def test_gpu_ranges_over_tcp_too(standalone):
    # The same through a client that may not use this host's shared memory: the staged bytes
    # then cross TCP (the node's data port), with the same promises.
    out = run(SIM_PRELUDE + SIM_CASE, standalone.master, SIM, {"TEST_USE_SHM": "0"})
    assert "DONE" in out
