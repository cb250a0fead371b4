#!/usr/bin/env python3
"""Engine-shaped KV-cache benchmark: the KV pages of a Llama-shaped model stored and loaded
through granary.compat.mooncake from torch tensors, as an inference engine's Mooncake connector
does (vLLM, SGLang), in GB/s against memcpy measured in the same run.

    PYTHONPATH=build/python /usr/bin/python3 bench/engine_kv.py --standalone \
        [--layers 32 --kv-heads 8 --head-dim 128 --dtype bf16 --page-tokens 64] \
        [--prompt-tokens 4096] [--repeats 3] [--object-per-page] [--json out.json]
    ... --master 127.0.0.1:50051 [--segment-mib 2048]     # a running store instead
    ... --device cuda [--model-check]                     # the GPU paths; a real prefill
    ... --quick                                           # tiny shapes (the smoke test)

The KV cache is paged, one page of page_tokens tokens per layer being one contiguous block
[2, kv_heads, page_tokens, head_dim] (K and V of every head): the whole cache is the tensor
[layers, pages, 2, kv_heads, page_tokens, head_dim]. Each page of each layer is one object
f"{prefix}/L{layer}/P{page}" (4096 tokens, 64-token pages, 32 layers: 2048 objects of 256 KiB),
or with --object-per-page all layers of a page are one object f"{prefix}/P{page}" written and
read as `layers` parts (batch_put_from_multi_buffers / batch_get_into_multi_buffers).

A store is batch_is_exist on the keys (an engine checks first) then batch_put_from; a load is
batch_is_exist then batch_get_into into a second buffer, whose bytes are compared with the
first after every load. Every repeat writes fresh keys and removes them afterwards.

Paths: "host" (the cache in a registered host buffer, pinned when CUDA is available); with
--device cuda, "staged" (GPU -> pinned host -> store, and back) and "direct" (the GPU tensor's
own address registered with register_buffer and handed to the batch calls: a store that accepts
CUDA device pointers in registered ranges moves the bytes itself; a nonzero register_buffer
code reports "unavailable"). The limits are measured in the same run on the same byte count:
memcpy host->host (torch copy_ and numpy.copyto) and, on a GPU, pinned host<->GPU copies.

--model-check (needs transformers; bench/engine_model.py): a random-weight Llama with this KV
shape prefills --prompt-tokens random tokens (the recompute the store saves), its
past_key_values are stored and loaded back into fresh tensors, whose bytes must be identical
(the run fails otherwise). One decode step from the loaded cache is compared (torch.equal) with
one from the original cache and with one from the original's bytes rebuilt the same way, and
each decode is repeated: reported, not judged, since one decode step need not repeat bit for bit
(torch 2.11, transformers 5.17 on an H200). Prints prefill ms against load ms. Nothing is
downloaded.

Figures are decimal GB/s (1e9 bytes) from the best of --repeats; the JSON has every repeat and
each phase's time (exist, put, get, and the GPU copies of the staged path). The memcpy limit the
ratios use is the better of torch's copy_ (threaded) and numpy.copyto (one thread).
With --json FILE the file is rewritten after each path, so a run that dies part way leaves what
it measured ("complete": false).
"""

import argparse
import json
import os
import platform
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN_DIR = os.environ.get("GRANARY_BIN_DIR", os.path.join(REPO, "build", "bin"))

try:
    from granary.compat.mooncake import MooncakeDistributedStore
except ImportError:  # not on PYTHONPATH: the build tree's copy
    sys.path.insert(0, os.path.join(REPO, "build", "python"))
    try:
        from granary.compat.mooncake import MooncakeDistributedStore
    except ImportError as e:  # --limits-only still works; anything else says why not
        MooncakeDistributedStore = None
        IMPORT_ERROR = e

# The model check and the helpers it shares with this file (bench/engine_model.py, beside it).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_model import model_check, ratio, same_bytes, sync  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MiB = 1 << 20


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def human(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


# ---------------------------------------------------------------- a standalone store, if asked

def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_PORTS_TAKEN = set()


def free_port():
    """A loopback port nothing listens on, below the kernel's ephemeral range (so that no
    outgoing connection takes it before the server binds it); not handed out twice."""
    low = _ephemeral_low()
    tries = [random.randrange(10000, low) for _ in range(500)] if low - 10000 >= 2000 else []
    for port in tries + [0] * 50:
        if port in _PORTS_TAKEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _PORTS_TAKEN:
            _PORTS_TAKEN.add(port)
            return port
    raise RuntimeError("no free loopback port")


class StandaloneNode:
    """granary-node --standalone (a master in the same process) on free loopback ports, ready
    once it prints its ready line; stop() sends SIGTERM (it removes its shared memory)."""

    READY = "granary-node ready"

    def __init__(self, segment_bytes, timeout=60.0, prefault=False):
        binary = os.path.join(BIN_DIR, "granary-node")
        if not os.access(binary, os.X_OK):
            raise RuntimeError(f"{binary} not found (set GRANARY_BIN_DIR)")
        port = free_port()
        self.master = f"127.0.0.1:{port}"
        args = [binary, "--standalone", "--master-port", str(port), "--http-port",
                str(free_port()), "--segment-size", f"{segment_bytes // MiB}MiB",
                "--log-level", "warn", f"--prefault={'true' if prefault else 'false'}"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        # Nobody reads its stdout from here on: drain it so that it never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        pending = b""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"granary-node exited with {self.proc.returncode} before "
                                   "it was ready")
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if not ready:
                continue
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                continue
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if any(line.decode(errors="replace").startswith(self.READY) for line in lines):
                return
        raise TimeoutError(f"granary-node not ready within {timeout:.0f}s")

    def _drain(self):
        try:
            while os.read(self.proc.stdout.fileno(), 65536):
                pass
        except (OSError, ValueError):
            pass

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# ---------------------------------------------------------------- the paged layout

class Layout:
    """The paged KV cache [layers, pages, 2, kv_heads, page_tokens, head_dim] and its objects."""

    def __init__(self, args):
        self.layers, self.heads, self.head_dim = args.layers, args.kv_heads, args.head_dim
        self.dtype = DTYPES[args.dtype]
        self.itemsize = torch.tensor([], dtype=self.dtype).element_size()
        self.page_tokens, self.tokens = args.page_tokens, args.prompt_tokens
        self.pages = self.tokens // self.page_tokens
        self.page_bytes = 2 * self.heads * self.page_tokens * self.head_dim * self.itemsize
        self.total = self.layers * self.pages * self.page_bytes
        self.object_per_page = args.object_per_page
        self.shape = (self.layers, self.pages, 2, self.heads, self.page_tokens, self.head_dim)

    def offset(self, layer, page):
        return (layer * self.pages + page) * self.page_bytes

    def objects(self, prefix):
        """[(key, [offsets], [sizes])]: one part per object, or `layers` parts per page."""
        if self.object_per_page:
            return [(f"{prefix}/P{p}", [self.offset(l, p) for l in range(self.layers)],
                     [self.page_bytes] * self.layers) for p in range(self.pages)]
        return [(f"{prefix}/L{l}/P{p}", [self.offset(l, p)], [self.page_bytes])
                for l in range(self.layers) for p in range(self.pages)]

    @property
    def object_bytes(self):
        return self.page_bytes * (self.layers if self.object_per_page else 1)

    @property
    def object_count(self):
        return self.pages * (1 if self.object_per_page else self.layers)

    def pack(self, pairs):
        """Per-layer (K, V) of shape [1, heads, tokens, head_dim] (a model's cache) -> the paged
        cache tensor, on the same device."""
        out = torch.empty(self.shape, dtype=self.dtype, device=pairs[0][0].device)
        for layer, (k, v) in enumerate(pairs):
            kv = torch.stack((k[0], v[0]))  # [2, heads, tokens, head_dim]
            kv = kv.view(2, self.heads, self.pages, self.page_tokens, self.head_dim)
            out[layer].copy_(kv.permute(2, 0, 1, 3, 4))
        return out

    def unpack(self, paged):
        """The paged cache -> fresh per-layer (K, V) tensors [1, heads, tokens, head_dim]."""
        pairs = []
        for layer in range(self.layers):
            kv = paged[layer].permute(1, 2, 0, 3, 4).reshape(2, self.heads, self.tokens,
                                                             self.head_dim)
            pairs.append((kv[0].unsqueeze(0).contiguous(), kv[1].unsqueeze(0).contiguous()))
        return pairs


def random_bytes(nbytes, device, seed):
    """nbytes of random data as a uint8 tensor (int64 random_ is the fast generator on CPU)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    words = torch.empty((nbytes + 7) // 8, dtype=torch.int64, device=device)
    words.random_(generator=gen)
    return words.view(torch.uint8)[:nbytes]


# ---------------------------------------------------------------- store and load

class KvStore:
    """Engine-style calls on one MooncakeDistributedStore: exist check, then the batch call."""

    def __init__(self, store, layout, batch):
        self.store, self.layout = store, layout
        self.batch = batch if batch > 0 else max(1, layout.object_count)

    def _chunks(self, objects):
        for i in range(0, len(objects), self.batch):
            yield objects[i:i + self.batch]

    def exist(self, objects, want):
        """batch_is_exist over every key; each must answer `want` (1 or 0)."""
        for chunk in self._chunks(objects):
            codes = self.store.batch_is_exist([o[0] for o in chunk])
            bad = [(o[0], c) for o, c in zip(chunk, codes) if c != want]
            if bad:
                raise RuntimeError(f"batch_is_exist: {len(bad)} keys not {want}, first "
                                   f"{bad[0]}")

    def put(self, objects, base):
        lay = self.layout
        for chunk in self._chunks(objects):
            keys = [o[0] for o in chunk]
            if lay.object_per_page:
                codes = self.store.batch_put_from_multi_buffers(
                    keys, [[base + off for off in o[1]] for o in chunk], [o[2] for o in chunk])
            else:
                codes = self.store.batch_put_from(keys, [base + o[1][0] for o in chunk],
                                                  [o[2][0] for o in chunk])
            bad = [(k, c) for k, c in zip(keys, codes) if c != 0]
            if bad or len(codes) != len(keys):
                raise RuntimeError(f"put: {len(bad)} of {len(keys)} keys failed, first "
                                   f"{bad[:1]}")

    def get(self, objects, base):
        lay = self.layout
        for chunk in self._chunks(objects):
            keys = [o[0] for o in chunk]
            if lay.object_per_page:
                got = self.store.batch_get_into_multi_buffers(
                    keys, [[base + off for off in o[1]] for o in chunk], [o[2] for o in chunk],
                    True)
            else:
                got = self.store.batch_get_into(keys, [base + o[1][0] for o in chunk],
                                                [o[2][0] for o in chunk])
            want = [sum(o[2]) for o in chunk]
            bad = [(k, g, w) for k, g, w in zip(keys, got, want) if g != w]
            if bad or len(got) != len(keys):
                raise RuntimeError(f"get_into: {len(bad)} of {len(keys)} keys failed, first "
                                   f"(key, got, want) {bad[:1]}")

    def remove(self, objects):
        for chunk in self._chunks(objects):
            codes = self.store.batch_remove([o[0] for o in chunk], force=True)
            bad = [c for c in codes if c != 0]
            if bad:
                raise RuntimeError(f"batch_remove: {len(bad)} keys failed, first {bad[0]}")


def run_path(name, kv, layout, repeats, prefix, store_fn, load_fn, check_fn, clear_fn, device):
    """Repeats store then load on fresh keys; store_fn/load_fn(objects) -> dict of phase
    seconds (their sum is the operation's time), check_fn() -> bytes equal."""
    result = {"available": True, "store_ms": [], "load_ms": [], "verified": True}
    for rep in range(repeats):
        objects = layout.objects(f"{prefix}/{name}{rep}")
        try:
            sync(device)
            phases = store_fn(objects)
            for phase, seconds in phases.items():
                result.setdefault(f"store_{phase}_ms", []).append(seconds * 1e3)
            result["store_ms"].append(sum(phases.values()) * 1e3)
            clear_fn()
            sync(device)
            phases = load_fn(objects)
            for phase, seconds in phases.items():
                result.setdefault(f"load_{phase}_ms", []).append(seconds * 1e3)
            result["load_ms"].append(sum(phases.values()) * 1e3)
            if not check_fn():
                result["verified"] = False
        finally:
            try:
                kv.remove(objects)
            except RuntimeError:
                pass  # after a failed put some keys are not there: what failed is reported
    result["store_best_ms"] = min(result["store_ms"])
    result["load_best_ms"] = min(result["load_ms"])
    result["store_gbps"] = gbps(layout.total, result["store_best_ms"] / 1e3)
    result["load_gbps"] = gbps(layout.total, result["load_best_ms"] / 1e3)
    return result


def timed(fn, device=None):
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def zero_copy_path(name, kv, layout, repeats, prefix, src, dst, device):
    """src and dst are registered (host or device) uint8 tensors of layout.total bytes."""
    src_base, dst_base = src.data_ptr(), dst.data_ptr()

    def store_fn(objects):
        return {"exist": timed(lambda: kv.exist(objects, 0), device),
                "put": timed(lambda: kv.put(objects, src_base), device)}

    def load_fn(objects):
        return {"exist": timed(lambda: kv.exist(objects, 1), device),
                "get": timed(lambda: kv.get(objects, dst_base), device)}

    return run_path(name, kv, layout, repeats, prefix, store_fn, load_fn,
                    lambda: same_bytes(src, dst), dst.zero_, device)


def staged_path(kv, layout, repeats, prefix, gpu_src, gpu_dst, pin_src, pin_dst):
    """GPU -> pinned host (copy_ non_blocking, synchronize) -> batch_put_from, and back."""

    def store_fn(objects):
        return {"d2h": timed(lambda: pin_src.copy_(gpu_src, non_blocking=True), "cuda"),
                "exist": timed(lambda: kv.exist(objects, 0)),
                "put": timed(lambda: kv.put(objects, pin_src.data_ptr()))}

    def load_fn(objects):
        return {"exist": timed(lambda: kv.exist(objects, 1)),
                "get": timed(lambda: kv.get(objects, pin_dst.data_ptr())),
                "h2d": timed(lambda: gpu_dst.copy_(pin_dst, non_blocking=True), "cuda")}

    def clear():
        pin_dst.zero_()
        gpu_dst.zero_()

    return run_path("staged", kv, layout, repeats, prefix, store_fn, load_fn,
                    lambda: same_bytes(gpu_src, gpu_dst), clear, "cuda")


# ---------------------------------------------------------------- limits

def best_time(fn, repeats, device=None):
    return min(timed(fn, device) for _ in range(repeats))


def measure_limits(src, dst, repeats, gpu=None, pinned=None):
    """memcpy host->host (torch, numpy) on src/dst; host<->GPU between pinned and gpu."""
    n = src.numel()
    out = {"memcpy_torch_gbps": gbps(n, best_time(lambda: dst.copy_(src), repeats))}
    a, b = src.numpy(), dst.numpy()
    out["memcpy_numpy_gbps"] = gbps(n, best_time(lambda: np.copyto(b, a), repeats))
    out["memcpy_gbps"] = max(out["memcpy_torch_gbps"], out["memcpy_numpy_gbps"])
    out["h2d_gbps"] = out["d2h_gbps"] = None
    if gpu is not None:
        out["h2d_gbps"] = gbps(n, best_time(lambda: gpu.copy_(pinned, non_blocking=True),
                                            repeats, "cuda"))
        out["d2h_gbps"] = gbps(n, best_time(lambda: pinned.copy_(gpu, non_blocking=True),
                                            repeats, "cuda"))
    dst.zero_()
    return out


def add_ratios(result, limits, gpu):
    if not result or not result.get("available") or "store_gbps" not in result:
        return
    result["store_vs_memcpy"] = ratio(result["store_gbps"], limits["memcpy_gbps"])
    result["load_vs_memcpy"] = ratio(result["load_gbps"], limits["memcpy_gbps"])
    if gpu:
        result["store_vs_d2h"] = ratio(result["store_gbps"], limits["d2h_gbps"])
        result["load_vs_h2d"] = ratio(result["load_gbps"], limits["h2d_gbps"])


# ---------------------------------------------------------------- main

def machine_facts(cuda):
    facts = {"python": platform.python_version(), "torch": torch.__version__,
             "numpy": np.__version__, "cpu_count": os.cpu_count(),
             "torch_threads": torch.get_num_threads(), "cuda_available": cuda,
             "cuda_version": torch.version.cuda, "gpu_name": None, "granary_cuda": None}
    if cuda:
        facts["gpu_name"] = torch.cuda.get_device_name(0)
    # What the store's CUDA lookup found (a build without GPU support has no cuda_status).
    # It looks once per process: torch has initialised CUDA by now, so its libcudart counts.
    try:
        from granary import _granary
        status = getattr(_granary, "cuda_status", None)
        facts["granary_cuda"] = dict(status()) if status else "no cuda_status in this build"
    except Exception as e:  # noqa: BLE001 - a fact, not a failure
        facts["granary_cuda"] = f"cuda_status failed: {e!r}"
    return facts


def host_buffer(nbytes, pinned):
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    buf.fill_(1)  # touched once: page faults are not the benchmark's
    return buf


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--page-tokens", type=int, default=64, help="tokens per page (engines: "
                   "16-256)")
    p.add_argument("--prompt-tokens", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--object-per-page", action="store_true", help="all layers of a page in one "
                   "object (multi-buffer calls) instead of one object per page per layer")
    p.add_argument("--batch", type=int, default=0, help="objects per batch call (0: all)")
    p.add_argument("--paths", default="host,staged,direct", help="which paths to run, of "
                   "host, staged, direct (the last two with --device cuda); none: only the "
                   "limits and --model-check")
    p.add_argument("--limits-only", action="store_true", help="measure the limits on the "
                   "KV's byte count and stop (no store needed)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: the KV on the GPU, the staged and direct paths")
    p.add_argument("--model-check", action="store_true",
                   help="a random-weight Llama's real cache through the store (transformers)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--master", help="HOST:PORT of a running store")
    where.add_argument("--standalone", action="store_true",
                       help="start granary-node --standalone from $GRANARY_BIN_DIR for the run")
    p.add_argument("--segment-mib", type=int, default=2048, help="with --master: the segment "
                   "this client contributes (0: none, the store's nodes hold the objects)")
    p.add_argument("--node-segment-mib", type=int, default=0, help="with --standalone: the "
                   "node's segment (0: 1.5x the KV bytes + 64 MiB)")
    p.add_argument("--quick", action="store_true", help="layers 2, kv-heads 2, head-dim 64, "
                   "prompt 256, page 64, repeats 1")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.kv_heads, args.head_dim = 2, 2, 64
        args.prompt_tokens, args.page_tokens, args.repeats = 256, 64, 1
    args.paths = set() if args.paths == "none" else set(filter(None, args.paths.split(",")))
    if args.paths - {"host", "staged", "direct"}:
        p.error(f"--paths: unknown {sorted(args.paths - {'host', 'staged', 'direct'})}")
    if not args.master and not args.standalone and not args.limits_only:
        p.error("give --master HOST:PORT or --standalone")
    if min(args.layers, args.kv_heads, args.head_dim, args.page_tokens, args.repeats) < 1:
        p.error("shapes and --repeats must be positive")
    if args.prompt_tokens < args.page_tokens or args.prompt_tokens % args.page_tokens:
        p.error("--prompt-tokens must be a positive multiple of --page-tokens")
    return args


class Report:
    """The JSON document, rewritten after each path when --json is given."""

    def __init__(self, path, doc):
        self.path, self.doc = path, doc

    def save(self):
        if self.path:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.doc, f, indent=1)
            os.replace(tmp, self.path)


def fmt(value, spec=".2f"):
    return "-" if value is None else format(value, spec)


def print_table(doc):
    prm, lim = doc["params"], doc["limits"]
    print(f"engine_kv: {prm['layers']} layers x {prm['kv_heads']} kv heads x "
          f"{prm['head_dim']} head dim, {prm['dtype']}; {prm['prompt_tokens']} tokens in "
          f"{prm['page_tokens']}-token pages")
    print(f"  {prm['layout']}: {prm['objects']} objects of {human(prm['object_bytes'])} "
          f"({human(prm['total_bytes'])} in all), {prm['batch']} per call, best of "
          f"{prm['repeats']}")
    print(f"limits GB/s: memcpy torch {fmt(lim['memcpy_torch_gbps'])}, numpy "
          f"{fmt(lim['memcpy_numpy_gbps'])}; H2D {fmt(lim['h2d_gbps'])}, D2H "
          f"{fmt(lim['d2h_gbps'])}")
    print(f"{'path':12} {'store GB/s':>10} {'load GB/s':>10} {'st/memcpy':>9} "
          f"{'ld/memcpy':>9} {'st/D2H':>7} {'ld/H2D':>7}  verified")
    gpu = doc["gpu"]
    rows = [("host", doc["host"])]
    if gpu["available"]:
        rows += [("gpu staged", gpu["staged"]), ("gpu direct", gpu["direct"])]
    for name, r in rows:
        if not r or not r.get("available"):
            print(f"{name:12} unavailable: {(r or {}).get('reason')}")
            continue
        if "store_gbps" not in r:
            print(f"{name:12} failed: {r.get('error')}")
            continue
        print(f"{name:12} {r['store_gbps']:>10.2f} {r['load_gbps']:>10.2f} "
              f"{fmt(r.get('store_vs_memcpy')):>9} {fmt(r.get('load_vs_memcpy')):>9} "
              f"{fmt(r.get('store_vs_d2h')):>7} {fmt(r.get('load_vs_h2d')):>7}  "
              f"{'yes' if r['verified'] else 'NO'}")
    if not gpu["available"]:
        print(f"gpu: {gpu['reason']}")
    mc = doc.get("model_check")
    if mc is not None:
        if not mc.get("available"):
            print(f"model check: unavailable: {mc.get('reason') or mc.get('error')}")
        elif "logits_equal" in mc:
            print(f"model check ({mc['transformers']}, {mc['device']}, {mc['cache_kind']}): "
                  f"prefill {mc['prefill_ms']:.1f} ms, store {mc['store_ms']:.1f} ms, load "
                  f"{mc['load_ms']:.1f} ms ({fmt(mc['prefill_over_load'], '.1f')}x faster "
                  f"than recompute); next-token logits identical: "
                  f"{'yes' if mc['logits_equal'] else 'NO'}")
            print(f"  loaded = rebuilt original: {mc.get('logits_equal_rebuilt')}, original "
                  f"decode repeatable: {mc.get('reference_repeatable')}, rebuilt repeatable: "
                  f"{mc.get('rebuilt_repeatable')}, max |diff| {mc.get('logits_max_abs_diff')}, "
                  f"strides {mc.get('cache_strides')}")
        else:
            print(f"model check failed: {mc.get('error')}")


def limits_only(args, layout, doc, report, gpu, pinned):
    src = host_buffer(layout.total, pinned)
    dst = host_buffer(layout.total, pinned)
    gpu_buf = torch.zeros(layout.total, dtype=torch.uint8, device="cuda") if gpu else None
    doc["limits"] = measure_limits(src, dst, max(2, args.repeats), gpu_buf, dst)
    doc["ok"] = doc["complete"] = True
    report.save()
    lim = doc["limits"]
    print(f"limits on {human(layout.total)}, GB/s: memcpy torch {fmt(lim['memcpy_torch_gbps'])}, "
          f"numpy {fmt(lim['memcpy_numpy_gbps'])}; H2D {fmt(lim['h2d_gbps'])}, D2H "
          f"{fmt(lim['d2h_gbps'])}")
    return 0


def main(argv=None):
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: clean up on the way
    layout = Layout(args)
    want_gpu = args.device == "cuda"
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.init()  # before the store first looks for a CUDA runtime: torch's is found
    gpu = want_gpu and cuda
    pinned = cuda
    doc = {"suite": "engine_kv", "complete": False, "ok": False,
           "params": {"layers": args.layers, "kv_heads": args.kv_heads,
                      "head_dim": args.head_dim, "dtype": args.dtype,
                      "dtype_bytes": layout.itemsize, "page_tokens": args.page_tokens,
                      "prompt_tokens": args.prompt_tokens, "pages": layout.pages,
                      "repeats": args.repeats,
                      "layout": "object-per-page" if args.object_per_page else "per-layer-page",
                      "objects": layout.object_count, "object_bytes": layout.object_bytes,
                      "parts_per_object": args.layers if args.object_per_page else 1,
                      "page_bytes": layout.page_bytes, "total_bytes": layout.total,
                      "batch": KvStore(None, layout, args.batch).batch, "device": args.device,
                      "standalone": args.standalone, "master": args.master,
                      "segment_mib": 0 if args.standalone else args.segment_mib,
                      "node_segment_mib": None, "quick": args.quick,
                      "paths": sorted(args.paths), "limits_only": args.limits_only},
           "machine": machine_facts(cuda), "limits": None, "host": None,
           "gpu": {"available": False, "reason": None, "staged": None, "direct": None},
           "model_check": None}
    if not want_gpu:
        doc["gpu"]["reason"] = "not requested (--device cpu)"
    elif not cuda:
        doc["gpu"]["reason"] = "CUDA is not available to torch"
    report = Report(args.json, doc)
    report.save()
    if args.limits_only:
        return limits_only(args, layout, doc, report, gpu, pinned)

    node = store = None
    registered = []
    failed = False
    try:
        if args.standalone:
            seg = args.node_segment_mib * MiB or (layout.total * 3 // 2 + 64 * MiB)
            seg = (seg + MiB - 1) // MiB * MiB
            doc["params"]["node_segment_mib"] = seg // MiB
            node = StandaloneNode(seg)
            master = node.master
            doc["params"]["master"] = master
            client_segment = 0
        else:
            master = args.master
            client_segment = args.segment_mib * MiB
            if 0 < client_segment < layout.total:
                print(f"warning: --segment-mib {args.segment_mib} is smaller than the KV "
                      f"({human(layout.total)})", file=sys.stderr)
        if MooncakeDistributedStore is None:
            raise RuntimeError(f"granary does not import: {IMPORT_ERROR}")
        store = MooncakeDistributedStore()
        code = store.setup("127.0.0.1", "P2PHANDSHAKE", client_segment, 0, "tcp", "", master)
        if code != 0:
            raise RuntimeError(f"setup against {master} returned {code}")
        kv = KvStore(store, layout, args.batch)
        prefix = f"ekv{os.getpid()}x{uuid.uuid4().hex[:8]}"

        def register(ptr, size):
            code = store.register_buffer(ptr, size)
            if code == 0:
                registered.append(ptr)
            return code

        # Host buffers: the host path's cache and its load target; the pinned staging on GPUs.
        src = host_buffer(layout.total, pinned)
        dst = host_buffer(layout.total, pinned)
        gpu_src = gpu_dst = None
        if gpu:
            gpu_src = random_bytes(layout.total, "cuda", 7)
            gpu_dst = torch.zeros(layout.total, dtype=torch.uint8, device="cuda")
            src.copy_(gpu_src)  # the host path stores these same bytes
        else:
            src.copy_(random_bytes(layout.total, "cpu", 7))
        limit_repeats = max(2, args.repeats)
        doc["limits"] = measure_limits(src, dst, limit_repeats, gpu_dst, dst)
        if gpu:  # measure_limits wrote over dst and gpu_dst only
            gpu_dst.zero_()
        report.save()

        for buf in (src, dst):
            code = register(buf.data_ptr(), layout.total)
            if code != 0:
                raise RuntimeError(f"register_buffer of a host buffer returned {code}")
        if "host" in args.paths:
            doc["host"] = zero_copy_path("host", kv, layout, args.repeats, prefix, src, dst,
                                         None)
            doc["host"]["pinned"] = pinned
            add_ratios(doc["host"], doc["limits"], gpu)
            failed |= not doc["host"]["verified"]
        else:
            doc["host"] = {"available": False, "reason": "not in --paths"}
        report.save()

        if gpu:
            doc["gpu"]["available"] = True
            doc["gpu"]["name"] = torch.cuda.get_device_name(0)
            if "staged" in args.paths:
                doc["gpu"]["staged"] = staged_path(kv, layout, args.repeats, prefix, gpu_src,
                                                   gpu_dst, src, dst)
                add_ratios(doc["gpu"]["staged"], doc["limits"], True)
                failed |= not doc["gpu"]["staged"]["verified"]
            else:
                doc["gpu"]["staged"] = {"available": False, "reason": "not in --paths"}
            report.save()

            # Direct: the device tensors' own addresses (the run may end here if the store
            # reads a device pointer as host memory: the JSON has everything before it).
            codes = ([register(t.data_ptr(), layout.total) for t in (gpu_src, gpu_dst)]
                     if "direct" in args.paths else [])
            bad = next((c for c in codes if c != 0), 0)
            if "direct" not in args.paths:
                doc["gpu"]["direct"] = {"available": False, "reason": "not in --paths"}
            elif bad:
                doc["gpu"]["direct"] = {"available": False, "register_code": bad,
                                        "reason": f"register_buffer of a device pointer "
                                                  f"returned {bad}"}
            else:
                doc["gpu"]["direct"] = {"available": True, "register_code": 0,
                                        "error": "did not finish"}
                report.save()
                try:
                    doc["gpu"]["direct"] = zero_copy_path("direct", kv, layout, args.repeats,
                                                          prefix, gpu_src, gpu_dst, "cuda")
                    doc["gpu"]["direct"]["register_code"] = 0
                    add_ratios(doc["gpu"]["direct"], doc["limits"], True)
                    failed |= not doc["gpu"]["direct"]["verified"]
                except RuntimeError as e:
                    doc["gpu"]["direct"] = {"available": True, "register_code": 0,
                                            "verified": False, "error": str(e)}
                    failed = True
            report.save()
            for t in (gpu_src, gpu_dst):  # unregistered before torch may reuse the memory
                if t.data_ptr() in registered:
                    store.unregister_buffer(t.data_ptr())
                    registered.remove(t.data_ptr())
            del gpu_src, gpu_dst
            torch.cuda.empty_cache()

        if args.model_check:
            doc["model_check"] = {"available": False, "error": "did not finish"}
            report.save()
            try:
                doc["model_check"] = model_check(args, layout, kv, prefix, src, dst,
                                                 "cuda" if cuda else "cpu")
            except Exception as e:  # noqa: BLE001 - reported with what was measured
                doc["model_check"] = {"available": True, "error": repr(e)}
                failed = True
            mc = doc["model_check"]
            if mc.get("available") and not mc.get("kv_equal"):  # the store's part
                failed = True
        doc["ok"] = not failed
        doc["complete"] = True
        report.save()
    finally:
        if store is not None:
            for ptr in registered:
                store.unregister_buffer(ptr)
            store.close()
        if node is not None:
            node.stop()
    print_table(doc)
    if args.json:
        print(f"wrote {args.json}")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
