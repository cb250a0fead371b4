"""granary.compat.tensors - the bytes of one tensor object, as Mooncake's tensor calls store it.

An object is a header, then the tensor's raw bytes in C order. Two headers exist:

* version 1 (what `encode` writes): 304 bytes, little-endian.
    offset   0  u32  magic 0x4d4f4f4e ("MOON" read as a little-endian u32)
             4  u16  version (1)          6  u16  header size (304)
             8  i32  dtype                12  i32  ndim (0-8)
            16  u32  layout kind (0 FULL, 1 SHARD)     20  u32  flags (0)
            24  u64  data offset          32  u64  data bytes
            40  i64 x 8  global shape     104  i64 x 8  local shape (unused dims -1)
           168  u32  axis count (0-4)     172  u32  reserved
           176  4 axes of 32 bytes: i32 kind (0 DP, 1 TP, 2 EP, 3 PP), i32 axis index,
                i32 shard rank, i32 shard count, i32 split dim (-1: none), i32 reserved,
                i64 extent of the split dim in this shard
  The tensor's shape is the local shape; a SHARD's global shape is the whole tensor's.
* legacy (read only): i32 dtype, i32 ndim (0-4), i64 x 4 shape, then the bytes.

The two cannot be confused: a legacy object starts with a dtype number (0-14), never the magic.
Decoding never trusts a size it read: the header's sizes must agree with each other and with the
object's length, else the object is not a tensor (None). Needs torch only for the tensor itself.
"""

import struct

MAGIC = 0x4D4F4F4E
VERSION = 1
MAX_DIMS = 8
MAX_AXES = 4
FULL, SHARD = 0, 1
AXIS_KINDS = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}

_HEAD = struct.Struct("<IHHiiIIQQ")       # 40 bytes
_SHAPES = struct.Struct(f"<{2 * MAX_DIMS}q")  # global, local: 128 bytes
_AXES_HEAD = struct.Struct("<II")
_AXIS = struct.Struct("<iiiiiiq")         # 32 bytes
HEADER_SIZE = _HEAD.size + _SHAPES.size + _AXES_HEAD.size + MAX_AXES * _AXIS.size  # 304
_LEGACY = struct.Struct("<ii4q")          # 40 bytes
_LEGACY_DIMS = 4

# index = Mooncake's dtype number
DTYPES = ["float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
          "uint64", "bool", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]


class Axis:
    """One way a tensor was split: kind ("dp", "tp", "ep", "pp"), this shard's rank among
    `count`, and the dimension split (-1 for none)."""

    def __init__(self, kind, rank, count, split_dim=-1):
        if kind not in AXIS_KINDS:
            raise ValueError(f"unknown parallel axis kind {kind!r}")
        self.kind, self.rank, self.count, self.split_dim = kind, rank, count, split_dim

    def __repr__(self):
        return f"Axis({self.kind!r}, {self.rank}, {self.count}, {self.split_dim})"


class Layout:
    """What a decoded header says beyond the tensor: FULL or SHARD, the global shape, the axes."""

    def __init__(self, kind, global_shape, axes):
        self.kind, self.global_shape, self.axes = kind, tuple(global_shape), list(axes)


def dtype_number(torch, dtype):
    for i, name in enumerate(DTYPES):
        if getattr(torch, name, None) == dtype:
            return i
    return -1


def encode(torch, tensor, global_shape=None, axes=()):
    """(header bytes, the tensor's bytes as a uint8 numpy array) for a version-1 object.

    The bytes are the tensor's own memory when it is a contiguous CPU tensor, else one copy (a
    GPU tensor comes to host memory; a strided view is made contiguous). With `axes`, the object
    is a SHARD of a tensor of `global_shape`. Raises ValueError for what cannot be stored."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"not a torch.Tensor: {type(tensor).__name__}")
    number = dtype_number(torch, tensor.dtype)
    if number < 0:
        raise ValueError(f"dtype {tensor.dtype} has no Mooncake number")
    local = list(tensor.shape)
    if len(local) > MAX_DIMS:
        raise ValueError(f"{len(local)} dims: at most {MAX_DIMS}")
    axes = list(axes)
    if len(axes) > MAX_AXES:
        raise ValueError(f"{len(axes)} parallel axes: at most {MAX_AXES}")
    whole = local if global_shape is None else list(global_shape)
    if len(whole) != len(local):
        raise ValueError(f"global shape {whole} and shard shape {local} differ in dims")
    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    data = data.contiguous().reshape(-1).view(torch.uint8).numpy()
    pad = [-1] * (MAX_DIMS - len(local))
    head = _HEAD.pack(MAGIC, VERSION, HEADER_SIZE, number, len(local), SHARD if axes else FULL,
                      0, HEADER_SIZE, data.nbytes)
    axis_bytes = b"".join(
        _AXIS.pack(AXIS_KINDS[a.kind], i, a.rank, a.count, a.split_dim, 0,
                   local[a.split_dim] if 0 <= a.split_dim < len(local) else -1)
        for i, a in enumerate(axes))
    axis_bytes += bytes(_AXIS.size * (MAX_AXES - len(axes)))
    header = (head + _SHAPES.pack(*(whole + pad), *(local + pad)) +
              _AXES_HEAD.pack(len(axes), 0) + axis_bytes)
    assert len(header) == HEADER_SIZE
    return header, data


def _element_size(torch, dtype):
    return torch.empty((), dtype=dtype).element_size()


def _count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def decode_header(torch, raw, length):
    """(torch dtype, local shape, data offset, data bytes, Layout) for an object of `length`
    bytes whose start is `raw` (at least its header's bytes, or all of a shorter object), or None
    when it is neither a valid version-1 nor a legacy tensor object."""
    if len(raw) < min(length, HEADER_SIZE):
        return None
    if length >= _HEAD.size and struct.unpack_from("<I", raw, 0)[0] == MAGIC:
        if length < HEADER_SIZE:
            return None
        (_, version, header_size, number, ndim, kind, _, offset, nbytes) = \
            _HEAD.unpack_from(raw, 0)
        if version != VERSION or header_size < HEADER_SIZE or not 0 <= ndim <= MAX_DIMS:
            return None
        if kind not in (FULL, SHARD) or offset < header_size or offset + nbytes > length:
            return None
        dims = _SHAPES.unpack_from(raw, _HEAD.size)
        whole, local = list(dims[:MAX_DIMS]), list(dims[MAX_DIMS:])
        if any(d != -1 for d in whole[ndim:] + local[ndim:]):
            return None
        whole, local = whole[:ndim], local[:ndim]
        if any(d < 0 for d in whole + local):
            return None
        count, _ = _AXES_HEAD.unpack_from(raw, _HEAD.size + _SHAPES.size)
        if count > MAX_AXES or (kind == FULL) != (count == 0):
            return None
        if kind == FULL and whole != local:
            return None
        axes = []
        names = {v: k for k, v in AXIS_KINDS.items()}
        for i in range(count):
            k, _, rank, shards, split, _, _ = _AXIS.unpack_from(
                raw, _HEAD.size + _SHAPES.size + _AXES_HEAD.size + i * _AXIS.size)
            if k not in names or not 0 <= rank < shards or not -1 <= split < ndim:
                return None
            axes.append(Axis(names[k], rank, shards, split))
        layout = Layout(kind, whole, axes)
    elif length >= _LEGACY.size:
        number, ndim, *shape = _LEGACY.unpack_from(raw, 0)
        if not 0 <= ndim <= _LEGACY_DIMS:
            return None
        local = shape[:ndim]
        if any(d < 0 for d in local):
            return None
        offset, nbytes = _LEGACY.size, length - _LEGACY.size
        layout = Layout(FULL, local, [])
    else:
        return None
    if not 0 <= number < len(DTYPES):
        return None
    dtype = getattr(torch, DTYPES[number], None)
    if dtype is None:
        return None
    if _count(local) * _element_size(torch, dtype) != nbytes:
        return None
    return dtype, local, offset, nbytes, layout


def decode(torch, buffer, length, with_layout=False):
    """The tensor in the first `length` bytes of a buffer (viewing it, no copy), or None when
    they are not a tensor object. With with_layout, (tensor, Layout)."""
    import numpy as np
    raw = np.frombuffer(buffer, dtype=np.uint8, count=length)
    parsed = decode_header(torch, raw[:HEADER_SIZE].tobytes(), length)
    if parsed is None:
        return (None, None) if with_layout else None
    dtype, local, offset, nbytes, layout = parsed
    data = torch.from_numpy(raw[offset:offset + nbytes])
    tensor = data.view(dtype).reshape(local) if nbytes else torch.empty(local, dtype=dtype)
    return (tensor, layout) if with_layout else tensor
