"""granary.compat.mooncake - Mooncake Store's Python interface, served by Granary.

Code written for `mooncake.store` runs unchanged after one import change:

    from granary.compat.mooncake import MooncakeDistributedStore, ReplicateConfig

The methods keep Mooncake's conventions: writes and removes return 0 or a negative error code,
read-into calls return the bytes read or a negative code, `get` returns b"" on a miss, batch calls
return one entry per key, a put of an existing key returns 0 and keeps the old value. The error
codes are Mooncake's numbers. Every call releases the GIL.
"""

import enum
import logging
import socket

from .. import _granary
from ..errors import Error, error_for

_log = logging.getLogger("granary.compat.mooncake")

_OK = 0
_INTERNAL_ERROR = -1
_INVALID_PARAMS = -600
_RPC_FAIL = -900
_UNAVAILABLE = -1010

# Mooncake's setup() defaults.
_DEFAULT_SEGMENT = 16 * 1024 * 1024
_DEFAULT_BUFFER = 16 * 1024 * 1024
_DEFAULT_MASTER = "127.0.0.1:50051"


class SoftPinAction(enum.IntEnum):
    """What a put does to the object's soft pin: keep with_soft_pin's choice, force it on, or
    force it off."""
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ReplicateConfig:
    """How many replicas to keep and how to protect them from eviction."""

    def __init__(self, replica_num=1, with_soft_pin=False, with_hard_pin=False,
                 preferred_segment="", preferred_segments=None, soft_pin_ttl_ms=None,
                 soft_pin_action=SoftPinAction.PRESERVE):
        self.replica_num = replica_num
        self.with_soft_pin = with_soft_pin
        self.with_hard_pin = with_hard_pin
        self.preferred_segment = preferred_segment
        self.preferred_segments = list(preferred_segments or [])
        self.soft_pin_ttl_ms = soft_pin_ttl_ms
        self.soft_pin_action = soft_pin_action

    def _native(self):
        soft = self.with_soft_pin
        if self.soft_pin_action == SoftPinAction.ENABLE:
            soft = True
        elif self.soft_pin_action == SoftPinAction.DISABLE:
            soft = False
        preferred = ([self.preferred_segment] if self.preferred_segment else []) + [
            s for s in self.preferred_segments if s != self.preferred_segment]
        if int(self.replica_num) < 1:
            raise error_for(_INVALID_PARAMS, f"replica_num must be >= 1, not {self.replica_num}")
        return _granary.ReplicateConfig(
            replica_num=int(self.replica_num), with_soft_pin=bool(soft),
            with_hard_pin=bool(self.with_hard_pin), preferred_segments=preferred,
            soft_pin_ttl_ms=int(self.soft_pin_ttl_ms or 0))

    def __repr__(self):
        return (f"ReplicateConfig(replica_num={self.replica_num}, "
                f"with_soft_pin={self.with_soft_pin}, with_hard_pin={self.with_hard_pin}, "
                f"preferred_segments={self.preferred_segments})")


def _size(value, name):
    if isinstance(value, str):
        return _granary.parse_size(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise error_for(_INVALID_PARAMS, f"{name} must be a byte count or a size string, "
                                         f"not {value!r}")
    return value


def _refuse(code, message):
    """setup's failures: an int as Mooncake returns, and the reason in the log."""
    _log.error("%s", message)
    return code


def _code(fn):
    """Runs fn(); an Error becomes its negative code (Mooncake's return convention)."""
    try:
        result = fn()
        return _OK if result is None else result
    except Error as e:
        return e.code
    except (TypeError, ValueError, BufferError, OverflowError):
        return _INVALID_PARAMS


def _codes(n, fn):
    """Like _code for a batch: a whole-call failure gives every key that code."""
    try:
        return list(fn())
    except Error as e:
        return [e.code] * n
    except (TypeError, ValueError, BufferError, OverflowError):
        return [_INVALID_PARAMS] * n


class MooncakeDistributedStore:
    """A Granary client with Mooncake Store's methods and return conventions."""

    def __init__(self):
        self._client = None
        self._pool = None
        self._hostname = ""
        self._closed = False

    # ---- setup ----
    def setup(self, local_hostname, metadata_server=None, global_segment_size=_DEFAULT_SEGMENT,
              local_buffer_size=_DEFAULT_BUFFER, protocol="tcp", device_name="",
              master_server_addr=_DEFAULT_MASTER):
        """Connects to the master; global_segment_size > 0 embeds a segment of that size in this
        process. Also setup(config_dict) with the same names as keys. `metadata_server` and
        `device_name` are accepted and ignored; `protocol` must be "tcp". Extra dict key:
        `use_shared_memory` (default True; False forces TCP even to same-host segments)."""
        use_shm = True
        if isinstance(local_hostname, dict):
            cfg = dict(local_hostname)
            local_hostname = cfg.pop("local_hostname", "")
            metadata_server = cfg.pop("metadata_server", None)
            global_segment_size = cfg.pop("global_segment_size", _DEFAULT_SEGMENT)
            local_buffer_size = cfg.pop("local_buffer_size", _DEFAULT_BUFFER)
            protocol = cfg.pop("protocol", "tcp")
            device_name = cfg.pop("device_name", cfg.pop("rdma_devices", ""))
            master_server_addr = cfg.pop("master_server_addr", cfg.pop("master_server_address",
                                                                       _DEFAULT_MASTER))
            use_shm = bool(cfg.pop("use_shared_memory", True))
            if cfg:
                return _refuse(_INVALID_PARAMS, f"unknown setup keys: {sorted(cfg)}")
        if self._client is not None:
            return _refuse(_UNAVAILABLE, "setup: this store is already set up")
        if str(protocol).lower() != "tcp":
            return _refuse(_INVALID_PARAMS, f"setup: protocol {protocol!r} is not supported; "
                           "Granary moves bytes over TCP or same-host shared memory (\"tcp\")")
        try:
            segment = _size(global_segment_size, "global_segment_size")
            buffer = _size(local_buffer_size, "local_buffer_size")
        except Error as e:
            return _refuse(e.code, f"setup: {e}")
        host, port = self._split_host(local_hostname)
        # "host:port" names the segment, as in Mooncake (preferred_segment targets it).
        name = str(local_hostname) if port and segment > 0 else ""
        code = self._connect(master_server_addr, segment, buffer, host, port, use_shm, name)
        if code == _OK:
            self._hostname = self._client.segment_name or str(local_hostname or host)
        return code

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """Attaches to a standalone node on this host (`granary-node --standalone`, whose master
        listens at server_address) without contributing memory; alloc_from_mem_pool hands out
        buffers from a pool of mem_pool_size bytes that the zero-copy calls accept."""
        if self._client is not None:
            return _refuse(_UNAVAILABLE, "setup_dummy: this store is already set up")
        try:
            pool = _size(mem_pool_size, "mem_pool_size")
            _size(local_buffer_size, "local_buffer_size")
        except Error as e:
            return _refuse(e.code, f"setup_dummy: {e}")
        code = self._connect(server_address, 0, pool, "127.0.0.1", 0, True, "")
        if code == _OK:
            self._hostname = socket.gethostname()
        return code

    def _connect(self, master, segment, pool_size, host, port, use_shm, segment_name):
        try:
            client = _granary.Client(master, segment_size=segment, segment_name=segment_name,
                                     data_host=host, data_port=port, use_shared_memory=use_shm)
        except Error as e:
            return _refuse(e.code, f"cannot connect to the master at {master}: {e}")
        try:
            client.health()
            if pool_size > 0:
                self._pool = _granary.MemPool(pool_size)
                client.register_buffer(self._pool.base, self._pool.size)
        except Error as e:
            client.close()
            self._pool = None
            return _refuse(e.code, f"master at {master}: {e}")
        self._client = client
        self._closed = False
        return _OK

    @staticmethod
    def _split_host(local_hostname):
        host, port = str(local_hostname or "127.0.0.1"), 0
        if host.count(":") == 1:
            host, _, p = host.partition(":")
            port = int(p) if p.isdigit() else 0
        if host in ("", "localhost"):
            host = "127.0.0.1"
        return host, port

    def _c(self):
        if self._client is None:
            raise error_for(_UNAVAILABLE, "the store is not set up (call setup first)")
        return self._client

    def close(self):
        if self._client is None:
            return _OK if self._closed else _UNAVAILABLE
        self._client.close()
        self._client = None
        self._closed = True
        return _OK

    def health_check(self):
        """0 healthy, 1 not set up or closed, 2 master unreachable."""
        if self._client is None:
            return 1
        try:
            self._client.health()
            return 0
        except Error:
            return 2

    def get_hostname(self):
        """The embedded segment's name (what preferred_segment names), else local_hostname."""
        return self._hostname

    # ---- memory for the zero-copy calls ----
    def register_buffer(self, buffer_ptr, size):
        return _code(lambda: self._c().register_buffer(buffer_ptr, size))

    def unregister_buffer(self, buffer_ptr):
        return _code(lambda: self._c().unregister_buffer(buffer_ptr))

    def alloc_from_mem_pool(self, size):
        """An address of `size` bytes from this client's pool (already registered), 0 if the
        pool is exhausted or there is none."""
        if self._pool is None or not isinstance(size, int) or size <= 0 or size > self._pool.size:
            return 0
        return self._pool.alloc(size)

    def free_to_mem_pool(self, buffer_ptr):
        """Gives a block from alloc_from_mem_pool back (a Granary addition)."""
        if self._pool is None:
            return _INVALID_PARAMS
        return _code(lambda: self._pool.free(buffer_ptr))

    # ---- writes ----
    @staticmethod
    def _cfg(config):
        return (config or ReplicateConfig())._native()

    def put(self, key, value, config=None):
        return _code(lambda: self._c().put(key, value, self._cfg(config)))

    def put_parts(self, key, *parts, config=None):
        return _code(lambda: self._c().put_parts(key, list(parts), self._cfg(config)))

    def put_batch(self, keys, values, config=None):
        """0 if every key was stored, else the first failed key's code."""
        keys = list(keys)
        codes = _codes(len(keys), lambda: self._c().batch_put(keys, list(values),
                                                              self._cfg(config)))
        return next((c for c in codes if c != 0), _OK)

    def put_from(self, key, buffer_ptr, size, config=None):
        return _code(lambda: self._c().put_addr(key, buffer_ptr, size, self._cfg(config)))

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_put_addr(
            keys, list(buffer_ptrs), list(sizes), self._cfg(config)))

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_put_addr_parts(
            keys, [list(p) for p in all_buffer_ptrs], [list(s) for s in all_sizes],
            self._cfg(config)))

    def upsert(self, key, value, config=None):
        return _code(lambda: self._c().put(key, value, self._cfg(config), upsert=True))

    def upsert_parts(self, key, *parts, config=None):
        return _code(lambda: self._c().put_parts(key, list(parts), self._cfg(config),
                                                 upsert=True))

    def upsert_batch(self, keys, values, config=None):
        keys = list(keys)
        codes = _codes(len(keys), lambda: self._c().batch_put(keys, list(values),
                                                              self._cfg(config), upsert=True))
        return next((c for c in codes if c != 0), _OK)

    def upsert_from(self, key, buffer_ptr, size, config=None):
        return _code(lambda: self._c().put_addr(key, buffer_ptr, size, self._cfg(config),
                                                upsert=True))

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_put_addr(
            keys, list(buffer_ptrs), list(sizes), self._cfg(config), upsert=True))

    # ---- reads ----
    def get(self, key):
        """The object's bytes; b"" on a miss or an error (Mooncake cannot tell them apart)."""
        try:
            return self._c().get(key)
        except Error:
            return b""

    def get_batch(self, keys):
        keys = list(keys)
        try:
            return [b"" if isinstance(v, int) else v for v in self._c().batch_get(keys)]
        except Error:
            return [b""] * len(keys)

    def get_buffer(self, key):
        """The object in a buffer-protocol object (.ptr(), .size()), or None."""
        try:
            return self._c().get_buffer(key)
        except Error:
            return None

    def batch_get_buffer(self, keys):
        keys = list(keys)
        try:
            return [None if isinstance(v, int) else v
                    for v in self._c().batch_get(keys, as_bytes=False)]
        except Error:
            return [None] * len(keys)

    def get_into(self, key, buffer_ptr, size):
        """Bytes read into the registered range, or a negative code (BUFFER_OVERFLOW, -10, if
        the object is larger than `size`: nothing is copied)."""
        return _code(lambda: self._c().get_into_addr(key, buffer_ptr, size))

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_get_into_addr(
            keys, list(buffer_ptrs), list(sizes)))

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes):
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_get_into_addr_parts(
            keys, [list(p) for p in all_buffer_ptrs], [list(s) for s in all_sizes]))

    # ---- queries ----
    def is_exist(self, key):
        """1 if stored, 0 if not, a negative code on error."""
        return _code(lambda: int(self._c().exist(key)))

    def batch_is_exist(self, keys):
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_exist(keys))

    def get_size(self, key):
        return _code(lambda: self._c().get_size(key))

    # ---- removal ----
    def remove(self, key, force=False):
        return _code(lambda: self._c().remove(key, force))

    def batch_remove(self, keys, force=False):
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_remove(keys, force))

    def remove_by_regex(self, pattern, force=False):
        """How many objects were removed, or a negative code."""
        return _code(lambda: self._c().remove_by_regex(pattern, force))

    def remove_all(self, force=False):
        return _code(lambda: self._c().remove_all(force))


__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction"]
