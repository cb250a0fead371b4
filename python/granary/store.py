"""granary.store - `Store`, the native Python API of a Granary client.

Conventions: a miss (no such object, or one still being written) is `None` (or `KeyError` from
`store[key]` when there is no such object), never `b""`; every other failure
raises a `granary.Error` subclass carrying the code. Batch calls return one entry per key, in
order; if any key failed for a reason other than a miss they raise `granary.BatchError`, whose
`.results` still holds every key's outcome. Values may be any object with the buffer protocol
(bytes, bytearray, memoryview, NumPy arrays); `get_into` writes straight into the caller's memory.
Raw addresses (`put_from`, `get_into_addr`) must lie in a range declared with `register_buffer`.
Every call releases the GIL; batch calls move their objects in parallel.
"""

from . import _granary
from .errors import BatchError, Error, NotFound, NotReady, error_for

# A miss: no such object, or one still being written by someone else (not readable yet).
_MISSES = (-704, -703)


def _size(value):
    return _granary.parse_size(value) if isinstance(value, str) else int(value)


def _config(replicas, soft_pin, hard_pin, preferred_segments, soft_pin_ttl_ms, persistence):
    return _granary.ReplicateConfig(replica_num=replicas, with_soft_pin=soft_pin,
                                    with_hard_pin=hard_pin,
                                    preferred_segments=list(preferred_segments),
                                    soft_pin_ttl_ms=soft_pin_ttl_ms, persistence=persistence)


def _check_writes(keys, codes):
    """None if every key succeeded, else BatchError with each key's None or Error."""
    if all(c == 0 for c in codes):
        return None
    results = [None if c == 0 else error_for(c, f"key {k!r}") for k, c in zip(keys, codes)]
    first = next(r for r in results if r is not None)
    raise BatchError(first.code, f"{len(results) - results.count(None)} of {len(keys)} keys "
                     f"failed; first: {first}", results)


def _check_reads(keys, values, is_error):
    """Misses become None; any other failure raises BatchError (with every key's outcome)."""
    out, failed = [], None
    for key, v in zip(keys, values):
        if not is_error(v):
            out.append(v)
        elif v in _MISSES:
            out.append(None)
        else:
            out.append(error_for(v, f"key {key!r}"))
            failed = failed or out[-1]
    if failed is not None:
        raise BatchError(failed.code, f"some keys failed; first: {failed}", out)
    return out


def _is_code(v):
    return isinstance(v, int)


def _is_negative(v):
    return v < 0


class Store:
    """A connection to a Granary store.

    Store(master="127.0.0.1:50051", *, segment_size=0, ...) connects to the master: "HOST:PORT",
    or "etcd://HOST:PORT[;HOST:PORT...]" for the serving leader of an HA cluster of
    `granary-master --etcd` processes, found through those etcd endpoints and followed across
    failovers by the same Store; `cluster_id` names that cluster ("": $GRANARY_CLUSTER_ID, else
    "granary"). With `segment_size` > 0 (bytes, or a string like "4GB") this process also
    contributes that much memory as an embedded storage node, unmounted on close(). With
    `disk_dir` (an existing directory) that node also runs an SSD tier there, as granary-node
    --disk-dir does: `disk_size` (0: 80% of the free space), `disk_backend`, `disk_eviction`,
    `disk_io` and `offload_interval_ms` take granary-node's defaults when left out.
    `auth_token_file` names the file (mode 0600) holding the cluster's secret, for a master
    started with --auth-token-file ("": $GRANARY_AUTH_TOKEN_FILE, else none); a master that
    refuses it raises Unauthenticated. `tls_ca_file` (the CA that signed the master's
    certificate), `tls_cert_file` and `tls_key_file` (this client's, for a master that requires
    one) make every master call TLS ("": $GRANARY_TLS_CA, $GRANARY_TLS_CERT, $GRANARY_TLS_KEY;
    none: plain TCP). `location_cache_ms`: a repeat get of a key reads it again without asking
    the master while the cache lease its last get took lasts (at most this long; 0: every get
    asks; docs/control-path.md). `spin_wait_us`: how long a call waits awake for an answer from
    the master's fast port or a node's TCP port before it sleeps (-1: $GRANARY_SPIN_WAIT_US, else
    50; 0: never; docs/store.md). Use it as a context manager.
    """

    def __init__(self, master="127.0.0.1:50051", *, segment_size=0, segment_name="",
                 host="127.0.0.1", port=0, use_shared_memory=True, rpc_timeout_ms=10_000,
                 io_timeout_ms=30_000, connections_per_node=4, io_threads=4, disk_dir="",
                 disk_size=0, disk_backend="", disk_eviction="", disk_io="",
                 offload_interval_ms=0, cluster_id="", auth_token_file="", tls_ca_file="",
                 tls_cert_file="", tls_key_file="", location_cache_ms=2_000, spin_wait_us=-1):
        self._client = _granary.Client(
            master, segment_size=_size(segment_size), segment_name=segment_name, data_host=host,
            data_port=port, rpc_timeout_ms=rpc_timeout_ms, io_timeout_ms=io_timeout_ms,
            connections_per_node=connections_per_node, use_shared_memory=use_shared_memory,
            io_threads=io_threads, disk_dir=str(disk_dir), disk_size=_size(disk_size),
            disk_backend=disk_backend, disk_eviction=disk_eviction, disk_io=disk_io,
            offload_interval_ms=offload_interval_ms, cluster_id=cluster_id,
            auth_token_file=str(auth_token_file), tls_ca_file=str(tls_ca_file),
            tls_cert_file=str(tls_cert_file), tls_key_file=str(tls_key_file),
            location_cache_ms=location_cache_ms, spin_wait_us=spin_wait_us)
        self._default = _granary.ReplicateConfig()

    # ---- lifecycle ----
    def close(self):
        """Stops the embedded node (if any) and releases read locks; later calls raise."""
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def closed(self):
        return self._client.closed

    @property
    def client_id(self):
        return self._client.client_id

    @property
    def segment_name(self):
        """The embedded node's segment name ("" without one)."""
        return self._client.segment_name

    def _cfg(self, replicas=1, soft_pin=False, hard_pin=False, preferred_segments=(),
             soft_pin_ttl_ms=0, persistence="default"):
        if (replicas, soft_pin, hard_pin, preferred_segments, soft_pin_ttl_ms,
                persistence) == (1, False, False, (), 0, "default"):
            return self._default
        return _config(replicas, soft_pin, hard_pin, preferred_segments, soft_pin_ttl_ms,
                       persistence)

    # ---- writes (keyword options: replicas, soft_pin, hard_pin, preferred_segments,
    # soft_pin_ttl_ms, persistence: "default" (the master's --persistence), "eager", "lazy" or
    # "none"). put keeps an existing value (write-once); upsert replaces it. ----
    def put(self, key, value, **options):
        self._client.put(key, value, self._cfg(**options))

    def upsert(self, key, value, **options):
        self._client.put(key, value, self._cfg(**options), upsert=True)

    def put_parts(self, key, parts, **options):
        """Stores the concatenation of `parts` (buffers) as one object, without joining them."""
        self._client.put_parts(key, list(parts), self._cfg(**options))

    def put_from(self, key, address, size, **options):
        self._client.put_addr(key, address, size, self._cfg(**options))

    def upsert_from(self, key, address, size, **options):
        self._client.put_addr(key, address, size, self._cfg(**options), upsert=True)

    def put_many(self, keys, values, **options):
        keys = list(keys)
        _check_writes(keys, self._client.batch_put(keys, list(values), self._cfg(**options)))

    def upsert_many(self, keys, values, **options):
        keys = list(keys)
        _check_writes(keys, self._client.batch_put(keys, list(values), self._cfg(**options),
                                                   upsert=True))

    def put_parts_many(self, keys, part_lists, **options):
        keys = list(keys)
        _check_writes(keys, self._client.batch_put_parts(keys, [list(p) for p in part_lists],
                                                         self._cfg(**options)))

    def put_from_many(self, keys, addresses, sizes, **options):
        keys = list(keys)
        _check_writes(keys, self._client.batch_put_addr(keys, list(addresses), list(sizes),
                                                        self._cfg(**options)))

    def put_from_parts_many(self, keys, address_lists, size_lists, **options):
        keys = list(keys)
        _check_writes(keys, self._client.batch_put_addr_parts(
            keys, [list(a) for a in address_lists], [list(s) for s in size_lists],
            self._cfg(**options)))

    # ---- reads ----
    def get(self, key, default=None):
        """The object's bytes, or `default` on a miss (absent, or still being written)."""
        try:
            return self._client.get(key)
        except (NotFound, NotReady):
            return default

    def get_buffer(self, key):
        """The object in a fresh `granary.Buffer` (buffer protocol, .ptr(), .size()), or None."""
        try:
            return self._client.get_buffer(key)
        except (NotFound, NotReady):
            return None

    def get_into(self, key, buffer):
        """Copies the object into `buffer` (writable, contiguous) and returns its size; None on
        a miss; BufferTooSmall (nothing copied) if it does not fit."""
        try:
            return self._client.get_into(key, buffer)
        except (NotFound, NotReady):
            return None

    def get_into_addr(self, key, address, size):
        try:
            return self._client.get_into_addr(key, address, size)
        except (NotFound, NotReady):
            return None

    def get_many(self, keys):
        keys = list(keys)
        return _check_reads(keys, self._client.batch_get(keys), _is_code)

    def get_buffer_many(self, keys):
        keys = list(keys)
        return _check_reads(keys, self._client.batch_get(keys, as_bytes=False), _is_code)

    def get_into_many(self, keys, buffers):
        keys = list(keys)
        return _check_reads(keys, self._client.batch_get_into(keys, list(buffers)), _is_negative)

    def get_into_addr_many(self, keys, addresses, sizes):
        keys = list(keys)
        return _check_reads(keys, self._client.batch_get_into_addr(keys, list(addresses),
                                                                   list(sizes)), _is_negative)

    def get_into_addr_parts_many(self, keys, address_lists, size_lists):
        """Each object scattered over its list of (registered) ranges, filled in order."""
        keys = list(keys)
        return _check_reads(keys, self._client.batch_get_into_addr_parts(
            keys, [list(a) for a in address_lists], [list(s) for s in size_lists]), _is_negative)

    def __getitem__(self, key):
        return self._client.get(key)  # NotFound is a KeyError

    def __setitem__(self, key, value):
        self.upsert(key, value)

    def __delitem__(self, key):
        self._client.remove(key)

    def __contains__(self, key):
        return self._client.exist(key)

    # ---- queries ----
    def exist(self, key):
        return self._client.exist(key)

    def exist_many(self, keys):
        keys = list(keys)
        codes = self._client.batch_exist(keys)
        return [bool(c) for c in _check_reads(keys, codes, _is_negative)]

    def size(self, key):
        """The object's size in bytes, or None on a miss."""
        try:
            return self._client.get_size(key)
        except NotFound:
            return None

    def size_many(self, keys):
        keys = list(keys)
        return _check_reads(keys, self._client.batch_get_size(keys), _is_negative)

    def prefix_match(self, keys):
        """How many leading keys are stored: how much of a prompt's prefix is cached."""
        return self._client.prefix_match(list(keys))

    def stat(self, key):
        """The object's metadata (state, size, replicas, locks, pins), or None on a miss."""
        try:
            return self._client.stat(key)
        except NotFound:
            return None

    def replicate(self, key, replica_num):
        """Sets the object's number of memory replicas (1-64). Fewer: the surplus goes now.
        More: nodes copy it in the background; stat(key)["replicas"] shows them as they land.
        Raises NotFound for a missing key."""
        code = self._client.batch_replicate([key], replica_num)[0]
        if code != 0:
            raise error_for(code, f"key {key!r}")

    def replicate_many(self, keys, replica_num):
        """replicate() for each key; a list of True (set) or False (no such key)."""
        keys = list(keys)
        codes = self._client.batch_replicate(keys, replica_num)
        return [r is not None for r in _check_reads(keys, codes, lambda c: c != 0)]

    def drain(self, segment, drop=False):
        """Drains a segment (granary drain): no new placements, its objects get their replicas
        elsewhere, then it is unmounted. drop=True unmounts it now, copying nothing."""
        self._client.drain(segment, drop, False)

    def undrain(self, segment):
        self._client.drain(segment, False, True)

    def drains(self):
        """Every drain the master remembers, as dicts (segment, drop, done, start_unix_ms,
        remaining_objects, remaining_bytes): under way, or done (unmounted, its name refused)
        until undrain()."""
        return self._client.drains()

    def query(self, pattern, limit=0):
        """(key, size, replica_count) of the objects whose key matches the RE2 `pattern`."""
        return self._client.query_by_regex(pattern, limit)

    # ---- removal ----
    def remove(self, key, force=False):
        """True if removed, False if there was no such key. HasLease while someone reads it,
        unless force=True."""
        try:
            self._client.remove(key, force)
            return True
        except NotFound:
            return False

    def remove_many(self, keys, force=False):
        keys = list(keys)
        codes = self._client.batch_remove(keys, force)  # 0 removed, -704 absent, else an error
        return [r is not None for r in _check_reads(keys, codes, lambda c: c != 0)]

    def remove_regex(self, pattern, force=False):
        """Removes every object whose key matches the RE2 `pattern`; returns how many."""
        return self._client.remove_by_regex(pattern, force)

    def remove_all(self, force=False):
        return self._client.remove_all(force)

    # ---- the store and this client ----
    def segments(self):
        return self._client.segments()

    def ping(self):
        """Raises Unavailable if the master does not answer."""
        self._client.health()

    def healthy(self):
        try:
            self._client.health()
            return True
        except Error:
            return False

    def cluster_status(self):
        """Who leads the master cluster: a dict with ha, cluster_id, leader_id, leader_address,
        term, applied_seq, serving_alone and standbys (one dict each: id, address, connected,
        synchronous, acked_seq, lag). For a master running alone, ha is False and only
        applied_seq is meaningful. caller_role ("admin", "member" or "tenant") and
        caller_tenant say who the master took this Store for; tenants lists the tenants it may
        see (a tenant: itself), each a dict of name, bytes, objects and quota_bytes."""
        return self._client.cluster()

    def stats(self):
        """Bytes this client moved through shared memory and over TCP."""
        return self._client.stats()

    def register_buffer(self, address, size):
        """Declares [address, address + size) usable by the raw-address calls."""
        self._client.register_buffer(address, size)

    def unregister_buffer(self, address):
        self._client.unregister_buffer(address)

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return f"<granary.Store {self.client_id} {state}>"
