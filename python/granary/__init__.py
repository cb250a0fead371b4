"""Granary: a distributed, tiered KV-cache store for LLM inference.

    import granary
    with granary.Store("127.0.0.1:50051") as store:
        store.put("prefix/0", b"...")
        value = store.get("prefix/0")       # bytes, or None on a miss

`granary.Store` is the native API; `granary.compat.mooncake` offers Mooncake Store's
`MooncakeDistributedStore` for engines written against it.
"""

from . import _granary
from .errors import (AlreadyExists, BatchError, BufferTooSmall, Error, HasLease, InvalidArgument,
                     NoSpace, NotFound, NotReady, PermissionDenied, QuotaExceeded, TransferError,
                     Unauthenticated, Unavailable, error_for)
from ._granary import Buffer, MemPool, ReplicateConfig, parse_size, set_log_level
from .store import Store

__all__ = [
    "Store", "ReplicateConfig", "Buffer", "MemPool", "parse_size", "set_log_level",
    "Error", "NotFound", "AlreadyExists", "NotReady", "HasLease", "BufferTooSmall", "NoSpace",
    "InvalidArgument", "Unavailable", "Unauthenticated", "PermissionDenied", "QuotaExceeded",
    "TransferError", "BatchError",
    "error_for",
]
__version__ = "0.1.0"
