"""Real PyTorch tensors through the Mooncake layer (Debian's CPU torch): every tensor call with
fp32, fp16 and bf16, contiguous and not, up to 8 dims (the KV layout engines use has 5), the
version-1 header's bytes, legacy objects still read, damaged headers refused, TP shards."""

import ctypes
import struct

import numpy as np
import pytest
import torch

from granary.compat import tensors
from granary.compat.mooncake import MooncakeDistributedStore, ReplicateConfig

OK, INVALID_PARAMS = 0, -600
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def store(standalone):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "",
                   standalone.master) == OK
    yield s
    assert s.close() == OK


def kv(dtype, layers=2, heads=4, tokens=16, dim=8, seed=0):
    """A KV block as engines shape it: layers x K/V x heads x tokens x head dim."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(layers, 2, heads, tokens, dim, generator=g).to(dtype)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_five_dim_kv_tensors_round_trip_in_every_form(store, dtype):
    t = kv(dtype, seed=1)
    strided = kv(dtype, seed=2).transpose(2, 3)  # not contiguous: stored in its logical order
    assert not strided.is_contiguous()
    name = str(dtype).split(".")[1]
    assert store.put_tensor(f"t5/{name}/a", t) == OK
    assert same(store.get_tensor(f"t5/{name}/a"), t)
    assert store.batch_put_tensor([f"t5/{name}/b", f"t5/{name}/c"], [strided, t[1]]) == [OK, OK]
    got = store.batch_get_tensor([f"t5/{name}/b", f"t5/{name}/c", f"t5/{name}/none"])
    assert same(got[0], strided.contiguous()) and same(got[1], t[1]) and got[2] is None
    assert store.pub_tensor(f"t5/{name}/p", t, ReplicateConfig()) == OK
    assert store.batch_pub_tensor([f"t5/{name}/q"], [strided], ReplicateConfig()) == [OK]
    assert same(store.get_tensor(f"t5/{name}/q"), strided.contiguous())
    # upsert replaces, put keeps the first value
    assert store.upsert_tensor(f"t5/{name}/a", t * 2) == OK
    assert store.put_tensor(f"t5/{name}/a", t * 3) == OK
    assert same(store.get_tensor(f"t5/{name}/a"), t * 2)
    assert store.batch_upsert_tensor([f"t5/{name}/b"], [t]) == [OK]
    assert store.upsert_pub_tensor(f"t5/{name}/p", strided, ReplicateConfig()) == OK
    assert store.batch_upsert_pub_tensor([f"t5/{name}/q"], [t], ReplicateConfig()) == [OK]
    got = store.batch_get_tensor([f"t5/{name}/b", f"t5/{name}/p", f"t5/{name}/q"])
    assert same(got[0], t) and same(got[1], strided.contiguous()) and same(got[2], t)


def test_get_tensor_into_views_the_callers_registered_buffer(store):
    buf = torch.zeros(1 << 20, dtype=torch.uint8)
    base = buf.data_ptr()
    assert store.register_buffer(base, buf.numel()) == OK
    try:
        a, b = kv(torch.bfloat16, seed=3), kv(torch.float16, seed=4)[:, :, :2]
        assert store.batch_put_tensor(["ti/a", "ti/b"], [a, b]) == [OK, OK]
        got = store.batch_get_tensor_into(["ti/a", "ti/b", "ti/none"],
                                          [base, base + (512 << 10), base + (768 << 10)],
                                          [512 << 10, 256 << 10, 1024])
        assert same(got[0], a) and same(got[1], b.contiguous()) and got[2] is None
        assert got[0].data_ptr() == base + tensors.HEADER_SIZE  # a view, not a copy
        assert same(store.get_tensor_into("ti/a", base, 512 << 10), a)
        # too small a buffer: no tensor, no partial one
        assert store.get_tensor_into("ti/a", base, 1000) is None
        # the _from forms store a caller-serialized object as it is
        header, data = tensors.encode(torch, a)
        blob = header + data.tobytes()
        buf[:len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        assert store.put_tensor_from("ti/from", base, len(blob)) == OK
        assert same(store.get_tensor("ti/from"), a)
    finally:
        assert store.unregister_buffer(base) == OK


def test_the_version_1_header_says_what_mooncake_reads(store):
    t = torch.arange(2 * 3 * 4 * 5 * 6, dtype=torch.int64).reshape(2, 3, 4, 5, 6)
    assert store.put_tensor("th/a", t) == OK
    raw = store.get("th/a")
    assert len(raw) == 304 + t.numel() * 8
    assert struct.unpack_from("<IHHii", raw, 0) == (0x4D4F4F4E, 1, 304, 8, 5)
    assert struct.unpack_from("<IIQQ", raw, 16) == (0, 0, 304, t.numel() * 8)
    assert struct.unpack_from("<8q", raw, 40) == (2, 3, 4, 5, 6, -1, -1, -1)
    assert struct.unpack_from("<8q", raw, 104) == (2, 3, 4, 5, 6, -1, -1, -1)
    assert struct.unpack_from("<I", raw, 168) == (0,)
    assert raw[304:] == t.numpy().tobytes()


def test_up_to_eight_dims_and_scalars_nine_are_refused(store):
    eight = torch.arange(256, dtype=torch.float32).reshape(*([2] * 8))
    scalar = torch.tensor(7.5, dtype=torch.float16)
    empty = torch.empty(0, 3, dtype=torch.bfloat16)
    assert store.batch_put_tensor(["td/8", "td/0", "td/e"], [eight, scalar, empty]) == [OK] * 3
    got = store.batch_get_tensor(["td/8", "td/0", "td/e"])
    assert same(got[0], eight) and same(got[1], scalar) and same(got[2], empty)
    nine = torch.zeros(*([1] * 9))
    assert store.put_tensor("td/9", nine) == INVALID_PARAMS
    assert store.batch_put_tensor(["td/9", "td/ok"], [nine, eight]) == [INVALID_PARAMS, OK]
    assert store.is_exist("td/9") == 0
    assert store.put_tensor("td/c", torch.zeros(2, dtype=torch.complex64)) == INVALID_PARAMS


def legacy(t):
    shape = list(t.shape) + [-1] * (4 - t.dim())
    number = tensors.dtype_number(torch, t.dtype)
    return struct.pack("<ii4q", number, t.dim(), *shape) + t.contiguous().numpy().tobytes()


def test_objects_in_the_legacy_layout_are_still_read(store):
    a = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    b = torch.arange(6, dtype=torch.int16)
    assert store.put("tl/a", legacy(a)) == OK
    assert store.put("tl/b", legacy(b)) == OK
    got = store.batch_get_tensor(["tl/a", "tl/b"])
    assert same(got[0], a) and same(got[1], b)


def test_damaged_or_foreign_objects_are_not_tensors(store):
    t = kv(torch.float16, seed=5)
    header, data = tensors.encode(torch, t)
    good = header + data.tobytes()

    def patched(offset, fmt, value):
        b = bytearray(good)
        struct.pack_into(fmt, b, offset, value)
        return bytes(b)

    bad = {
        "truncated": good[:-2],
        "header only": good[:304],
        "short header": good[:100],
        "version": patched(4, "<H", 2),
        "ndim 9": patched(12, "<i", 9),
        "dtype": patched(8, "<i", 99),
        "data bytes": patched(32, "<Q", len(data) + 2),
        "data offset": patched(24, "<Q", 8),
        "local shape": patched(104 + 8 * 4, "<q", 9),  # disagrees with the bytes
        "global shape": patched(40 + 8 * 4, "<q", 9),  # a FULL tensor's must be its own
        "unused dim": patched(104 + 8 * 6, "<q", 3),
        "layout": patched(16, "<I", 7),
        "legacy ndim": struct.pack("<ii4q", 0, 5, 1, 1, 1, 1) + bytes(4),
        "legacy size": struct.pack("<ii4q", 0, 1, 3, -1, -1, -1) + bytes(8),
        "text": b"not a tensor at all, just some bytes of text",
    }
    for name, blob in bad.items():
        assert store.put(f"tx/{name}", blob) == OK, name
    got = store.batch_get_tensor([f"tx/{name}" for name in bad])
    assert [n for n, g in zip(bad, got) if g is not None] == []
    assert store.put("tx/good", good) == OK
    assert same(store.get_tensor("tx/good"), t)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tp_shards_carry_their_layout(store, dtype):
    t = kv(dtype, heads=8, seed=6)
    name = str(dtype).split(".")[1]
    assert store.put_tensor_with_tp(f"tp/{name}", t, tp_rank=0, tp_size=4, split_dim=2) == OK
    for rank in range(4):
        shard = store.get_tensor_with_tp(f"tp/{name}", rank, 4)
        assert same(shard, t.chunk(4, 2)[rank])
        raw = store.get(f"tp/{name}_tp_{rank}")
        arr = np.frombuffer(raw, dtype=np.uint8).copy()
        got, layout = tensors.decode(torch, arr, len(raw), with_layout=True)
        assert same(got, shard)
        assert layout.kind == tensors.SHARD and layout.global_shape == tuple(t.shape)
        assert [(a.kind, a.rank, a.count, a.split_dim) for a in layout.axes] == \
            [("tp", rank, 4, 2)]
    got = store.batch_get_tensor_with_tp([f"tp/{name}"], 3, 4)
    assert same(got[0], t.chunk(4, 2)[3])
    # the _from form parses a full tensor from the caller's buffer and splits it
    header, data = tensors.encode(torch, t)
    blob = bytearray(header + data.tobytes())
    cbuf = (ctypes.c_uint8 * len(blob)).from_buffer(blob)
    base = ctypes.addressof(cbuf)
    assert store.register_buffer(base, len(blob)) == OK
    try:
        assert store.put_tensor_with_tp_from(f"tpf/{name}", base, len(blob), 0, 2, 4) == OK
    finally:
        assert store.unregister_buffer(base) == OK
    assert same(store.get_tensor_with_tp(f"tpf/{name}", 1, 2), t.chunk(2, 4)[1])


def test_a_tensor_on_another_device_is_copied_to_host_first(store):
    # A meta tensor has no bytes anywhere: refused with a code, never a crash.
    meta = torch.empty(4, 4, device="meta")
    assert store.put_tensor("tm/meta", meta) == INVALID_PARAMS
    assert store.is_exist("tm/meta") == 0
