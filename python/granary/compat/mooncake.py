"""granary.compat.mooncake - Mooncake Store's Python interface, served by Granary.

Code written for `mooncake.store` runs unchanged after one import change:

    from granary.compat.mooncake import MooncakeDistributedStore, ReplicateConfig

The methods keep Mooncake's conventions: writes and removes return 0 or a negative error code,
read-into calls return the bytes read or a negative code, `get` returns b"" on a miss, batch calls
return one entry per key, a put of an existing key returns 0 and keeps the old value. The error
codes are Mooncake's numbers. Every call releases the GIL. docs/python.md lists every method of
Mooncake's Python API reference with what Granary does for it.
"""

import enum
import logging
import operator
import os
import random
import socket
import uuid

from .. import _granary
from . import tensors as _tensors
from ..errors import Error, error_for

_log = logging.getLogger("granary.compat.mooncake")

_OK = 0
_INTERNAL_ERROR = -1
_BUFFER_OVERFLOW = -10
_INVALID_PARAMS = -600
_TRANSFER_FAIL = -800
_RPC_FAIL = -900
_UNAVAILABLE = -1010
_PERMISSION_DENIED = -1101

# Mooncake's setup() defaults.
_DEFAULT_SEGMENT = 16 * 1024 * 1024
_DEFAULT_BUFFER = 16 * 1024 * 1024
_DEFAULT_MASTER = "127.0.0.1:50051"
_DEFAULT_MASTER_PORT = 50051
_DEFAULT_CLUSTER = "granary"  # the HA cluster of an etcd:// master, as granary-node's default
_DEFAULT_TENANT = "default"
# The range Mooncake picks a client's port from when local_hostname names none.
_PORT_RANGE = (12300, 14300)
_PORT_ATTEMPTS = 32
_UINT64_MAX = 2**64 - 1
# Memory get_into_ranges may hold for whole objects at once; a larger call reads in rounds.
_RANGE_SCRATCH_BUDGET = 256 << 20


class SoftPinAction(enum.IntEnum):
    """What a put does to the object's soft pin: keep with_soft_pin's choice, force it on, or
    force it off."""
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


def _truthy(value):
    """Mooncake's config dicts carry flags as strings ("true", "0") as often as bools."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class ReplicateConfig:
    """How many replicas to keep, where, and how to protect them from eviction.

    `soft_pin_ttl_ms` is None (the master's default) or a millisecond count that fits in 64
    unsigned bits; anything else raises TypeError, as Mooncake's binding does. It applies only
    with `soft_pin_action = SoftPinAction.ENABLE` (a write whose config sets it otherwise returns
    -600); 0 then pins nothing. `group_ids` (None, or one string per key of a write) is checked
    and otherwise ignored: Granary keeps no object groups. `prefer_alloc_in_same_node` prefers
    this client's own segment, when it embeds one."""

    # Class-level defaults too, so that hasattr(ReplicateConfig, "group_ids") holds as with
    # Mooncake's binding (SGLang probes the class for group support).
    replica_num = 1
    with_soft_pin = False
    with_hard_pin = False
    preferred_segment = ""
    soft_pin_action = SoftPinAction.PRESERVE
    group_ids = None
    prefer_alloc_in_same_node = False

    def __init__(self, replica_num=1, with_soft_pin=False, with_hard_pin=False,
                 preferred_segment="", preferred_segments=None, soft_pin_ttl_ms=None,
                 soft_pin_action=SoftPinAction.PRESERVE, group_ids=None,
                 prefer_alloc_in_same_node=False):
        self.replica_num = replica_num
        self.with_soft_pin = with_soft_pin
        self.with_hard_pin = with_hard_pin
        self.preferred_segment = preferred_segment
        self.preferred_segments = list(preferred_segments or [])
        self.soft_pin_ttl_ms = soft_pin_ttl_ms
        self.soft_pin_action = soft_pin_action
        self.group_ids = group_ids
        self.prefer_alloc_in_same_node = prefer_alloc_in_same_node

    @property
    def soft_pin_ttl_ms(self):
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, value):
        if value is not None and (not isinstance(value, int) or not 0 <= value <= _UINT64_MAX):
            raise TypeError(f"soft_pin_ttl_ms must be None or an integer in [0, 2**64 - 1], "
                            f"not {value!r}")
        self._soft_pin_ttl_ms = value

    def _native(self, key_count, own_segment=""):
        """The native config for a write of key_count keys; raises INVALID_PARAMS."""
        try:
            replicas = operator.index(self.replica_num)
        except TypeError:
            replicas = 0
        if replicas < 1:
            raise error_for(_INVALID_PARAMS, f"replica_num must be >= 1, not {self.replica_num}")
        action = SoftPinAction(self.soft_pin_action)
        ttl = self._soft_pin_ttl_ms
        if ttl is not None and action != SoftPinAction.ENABLE:
            raise error_for(_INVALID_PARAMS, "soft_pin_ttl_ms is set but soft_pin_action is not "
                                             "SoftPinAction.ENABLE")
        soft = bool(self.with_soft_pin)
        if action == SoftPinAction.ENABLE:
            soft = ttl != 0  # a zero TTL pins nothing, as in Mooncake
        elif action == SoftPinAction.DISABLE:
            soft = False
        if self.group_ids is not None:
            groups = self.group_ids
            if (isinstance(groups, (str, bytes)) or not hasattr(groups, "__len__")
                    or not all(isinstance(g, str) for g in groups)):
                raise error_for(_INVALID_PARAMS, "group_ids must be a list of strings")
            if len(groups) != key_count:
                raise error_for(_INVALID_PARAMS, f"group_ids has {len(groups)} entries for "
                                                 f"{key_count} keys")
        preferred = [self.preferred_segment] if self.preferred_segment else []
        preferred += [s for s in self.preferred_segments if s not in preferred]
        if own_segment and _truthy(self.prefer_alloc_in_same_node) and own_segment not in preferred:
            preferred.append(own_segment)
        return _granary.ReplicateConfig(
            replica_num=replicas, with_soft_pin=soft,
            with_hard_pin=bool(self.with_hard_pin), preferred_segments=preferred,
            soft_pin_ttl_ms=ttl or 0)

    def __repr__(self):
        return (f"ReplicateConfig(replica_num={self.replica_num}, "
                f"with_soft_pin={self.with_soft_pin}, with_hard_pin={self.with_hard_pin}, "
                f"preferred_segment={self.preferred_segment!r}, "
                f"preferred_segments={self.preferred_segments}, "
                f"soft_pin_ttl_ms={self.soft_pin_ttl_ms}, "
                f"soft_pin_action={SoftPinAction(self.soft_pin_action).name}, "
                f"group_ids={self.group_ids}, "
                f"prefer_alloc_in_same_node={self.prefer_alloc_in_same_node})")

    __str__ = __repr__


class MooncakeHostMemAllocator:
    """Host memory for the zero-copy calls of a `setup_dummy` client (SGLang's standalone mode
    allocates its host KV pool here, before `setup_dummy`).

    A `setup_dummy` client maps the standalone node's shared-memory segment itself, so its
    zero-copy calls copy between this memory and the segment with one memcpy, no staging and no
    hop through another process. Each block is page-aligned shared memory, committed on first
    touch. Register it with `register_buffer` before zero-copy calls, as with Mooncake."""

    def alloc(self, size):
        """The block's address, or 0 on failure."""
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            return 0
        return _granary.host_alloc(size)

    def free(self, ptr):
        """0, or -600 for an address alloc did not return."""
        try:
            _granary.host_free(ptr)
            return _OK
        except Error as e:
            return e.code
        except (TypeError, OverflowError):
            return _INVALID_PARAMS


def bind_to_numa_node(node):
    """Pins the calling thread to the CPUs of NUMA node `node` (Linux). Unlike Mooncake, the
    memory allocation policy is left alone: Granary does not link libnuma."""
    path = f"/sys/devices/system/node/node{int(node)}/cpulist"
    try:
        with open(path) as f:
            spec = f.read().strip()
    except OSError:
        _log.warning("bind_to_numa_node: no NUMA node %s on this host (%s)", node, path)
        return
    cpus = set()
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    try:
        os.sched_setaffinity(0, cpus)
    except (OSError, ValueError) as e:
        _log.warning("bind_to_numa_node(%s): cannot run on CPUs %s: %s", node, spec, e)


def _size(value, name):
    if isinstance(value, str):
        return _granary.parse_size(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise error_for(_INVALID_PARAMS, f"{name} must be a byte count or a size string, "
                                         f"not {value!r}")
    return value


_ETCD_SCHEME = "etcd://"
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._")


def _port_ok(text):
    return text.isdigit() and len(text) <= 5 and 0 < int(text) < 65536


def _etcd_address(text):
    """"etcd://HOST:PORT[;HOST:PORT...]" checked entry by entry (blanks and empty entries
    ignored, "[v6]:PORT" for IPv6) and rebuilt; raises INVALID_PARAMS naming the bad entry."""
    entries = []
    for raw in text[len(_ETCD_SCHEME):].replace(",", ";").split(";"):
        entry = raw.strip()
        if not entry:
            continue
        why = None
        if entry.startswith("["):
            v6, sep, port = entry[1:].partition("]:")
            if not sep or not v6 or not _port_ok(port):
                why = "is not [IPv6]:PORT with a port in 1-65535"
            else:
                try:
                    socket.inet_pton(socket.AF_INET6, v6)
                except OSError:
                    why = "has a bad IPv6 address"
        else:
            host, _, port = entry.partition(":")
            if entry.count(":") != 1 or not host or not set(host) <= _HOST_CHARS:
                why = "is not HOST:PORT (IPv6 addresses in [])"
            elif not _port_ok(port):
                why = "has a bad port (1-65535)"
        if why:
            raise error_for(_INVALID_PARAMS, f"master address {text!r}: etcd endpoint "
                            f"{entry!r} {why}; expected etcd://HOST:PORT[;HOST:PORT...]")
        entries.append(entry)
    if not entries:
        raise error_for(_INVALID_PARAMS, f"master address {text!r}: no etcd endpoint; expected "
                        "etcd://HOST:PORT[;HOST:PORT...]")
    return _ETCD_SCHEME + ";".join(entries)


def _master_address(addr):
    """The master address in Mooncake's master_server_addr forms: "HOST:PORT", "HOST" (port
    50051), or "etcd://HOST:PORT[;HOST:PORT...]" (the serving leader of Granary's HA masters,
    found through those etcd endpoints). Raises INVALID_PARAMS."""
    text = str(addr if addr is not None else "").strip()
    if text.startswith(_ETCD_SCHEME):
        return _etcd_address(text)
    if not text or "://" in text or ";" in text or "," in text:
        raise error_for(_INVALID_PARAMS, f"master address {text!r}: expected HOST:PORT (or "
                        "HOST, for port 50051, or etcd://HOST:PORT[;HOST:PORT...])")
    if text.startswith("["):  # [v6]:port or [v6]
        return text if "]:" in text else f"{text}:{_DEFAULT_MASTER_PORT}"
    if text.count(":") == 0:
        return f"{text}:{_DEFAULT_MASTER_PORT}"
    if text.count(":") == 1:
        port = text.rpartition(":")[2]
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise error_for(_INVALID_PARAMS, f"master address {text!r}: bad port")
        return text
    return f"[{text}]:{_DEFAULT_MASTER_PORT}"  # a bare IPv6 address


def _cluster_id(value):
    """The HA cluster an etcd:// master address names: `value` (setup's "cluster_id" key), else
    $GRANARY_CLUSTER_ID, else "granary". Raises INVALID_PARAMS for one with a '/'."""
    cluster = str(value).strip() if value is not None else ""
    cluster = cluster or os.environ.get("GRANARY_CLUSTER_ID", "").strip() or _DEFAULT_CLUSTER
    if "/" in cluster:
        raise error_for(_INVALID_PARAMS, f"cluster_id {cluster!r} must not contain '/'")
    return cluster


def _split_host(local_hostname):
    """(label, bind host, port or 0) from Mooncake's local_hostname: "host", "host:port",
    "[v6]:port". The label is the host as given; the data server binds 127.0.0.1 for
    "localhost"."""
    text = str(local_hostname or "").strip() or "127.0.0.1"
    port = 0
    if text.startswith("[") and "]" in text:
        label, _, rest = text.partition("]")
        label += "]"
        bind = label[1:-1]
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
    elif text.count(":") == 1:
        label, _, p = text.partition(":")
        bind = label
        if not p.isdigit():
            raise error_for(_INVALID_PARAMS, f"local_hostname {text!r}: bad port")
        port = int(p)
    else:
        label = bind = text
    if not 0 <= port < 65536:
        raise error_for(_INVALID_PARAMS, f"local_hostname {text!r}: bad port")
    if bind in ("", "localhost"):
        bind = "127.0.0.1"
    return label, bind, port


def _port_free(host, port):
    """Whether host:port can be bound right now (the embedded node binds it next)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return True  # let the real bind report it
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the data server does
        try:
            s.bind(sockaddr)
            return True
        except OSError:
            return False


def _candidate_ports(host):
    ports = random.Random().sample(range(_PORT_RANGE[0], _PORT_RANGE[1] + 1), _PORT_ATTEMPTS)
    return [p for p in ports if _port_free(host, p)]


def _nbytes(value):
    with memoryview(value) as view:
        return view.nbytes


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


def _unsupported(name, result):
    _log.error("%s is not supported by Granary (see docs/python.md)", name)
    return result


# ---- tensors: the object format lives in tensors.py ----

def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def _tensor_parts(torch, tensor, global_shape=None, axes=()):
    """(header, uint8 view of the bytes) for a tensor; raises INVALID_PARAMS."""
    try:
        return _tensors.encode(torch, tensor, global_shape, axes)
    except (TypeError, ValueError, RuntimeError) as e:  # RuntimeError: torch cannot copy it
        raise error_for(_INVALID_PARAMS, f"unsupported tensor: {e}")


class MooncakeDistributedStore:
    """A Granary client with Mooncake Store's methods and return conventions."""

    def __init__(self):
        self._client = None
        self._pool = None
        self._hostname = ""
        self._segment = ""
        self._buffer_limit = 0
        self._auth_token_file = ""  # "": $GRANARY_AUTH_TOKEN_FILE, read by the client library
        self._tls = ("", "", "")  # ca, cert, key; "": $GRANARY_TLS_*, read by the client library

    # ---- setup ----
    def setup(self, local_hostname, metadata_server=None, global_segment_size=_DEFAULT_SEGMENT,
              local_buffer_size=_DEFAULT_BUFFER, protocol="tcp", rdma_devices="",
              master_server_addr=_DEFAULT_MASTER, engine=None, *, enable_ssd_offload=False,
              ssd_offload_path="", tenant_id=_DEFAULT_TENANT, enable_client_http_server=False,
              client_http_port=0, device_name=None):
        """Connects to the master; global_segment_size > 0 embeds a segment of that size in this
        process, named "host:port" after local_hostname (the port picked in 12300-14300 when
        none is given). Also setup(config_dict) with the same names as keys. `metadata_server`,
        `rdma_devices` and `engine` are accepted and ignored; `protocol` must be "tcp".
        `master_server_addr` is "HOST:PORT", "HOST" (port 50051) or
        "etcd://HOST:PORT[;HOST:PORT...]": the serving leader of Granary's HA masters, followed
        across failovers. Extra dict keys: `use_shared_memory` (default True; False forces TCP
        even to same-host segments) and `cluster_id`, the HA cluster an etcd:// address names
        (default $GRANARY_CLUSTER_ID, else "granary"), and `auth_token_file`, the file holding
        the cluster's secret for a master started with --auth-token-file (default
        $GRANARY_AUTH_TOKEN_FILE, else none; docs/security.md), and `tls_ca_file`,
        `tls_cert_file`, `tls_key_file` for a master serving TLS (default $GRANARY_TLS_CA,
        $GRANARY_TLS_CERT, $GRANARY_TLS_KEY; none: plain TCP).
        enable_ssd_offload=True runs the embedded segment's SSD tier in ssd_offload_path (an
        existing, writable directory; granary-node's --disk-* defaults: 80% of its free space);
        the master's --persistence decides what goes there. Without a path or a segment, or with
        a path the tier cannot use, setup returns -600."""
        use_shm = True
        cluster_id = None
        auth_token_file = ""
        tls = ("", "", "")
        if isinstance(local_hostname, dict):
            cfg = dict(local_hostname)
            local_hostname = cfg.pop("local_hostname", "")
            metadata_server = cfg.pop("metadata_server", None)
            global_segment_size = cfg.pop("global_segment_size", _DEFAULT_SEGMENT)
            local_buffer_size = cfg.pop("local_buffer_size", _DEFAULT_BUFFER)
            protocol = cfg.pop("protocol", "tcp")
            rdma_devices = cfg.pop("rdma_devices", cfg.pop("device_name", ""))
            master_server_addr = cfg.pop("master_server_addr",
                                         cfg.pop("master_server_address", _DEFAULT_MASTER))
            engine = cfg.pop("engine", None)
            enable_ssd_offload = _truthy(cfg.pop("enable_ssd_offload", False))
            ssd_offload_path = cfg.pop("ssd_offload_path", "")
            tenant_id = cfg.pop("tenant_id", _DEFAULT_TENANT)
            enable_client_http_server = _truthy(cfg.pop("enable_client_http_server", False))
            client_http_port = cfg.pop("client_http_port", 0)
            use_shm = _truthy(cfg.pop("use_shared_memory", True))
            cluster_id = cfg.pop("cluster_id", None)
            auth_token_file = os.fspath(cfg.pop("auth_token_file", "") or "")
            tls = tuple(os.fspath(cfg.pop(k, "") or "")
                        for k in ("tls_ca_file", "tls_cert_file", "tls_key_file"))
            for key in ("enable_egm_store_pool", "egm_numa_nodes"):
                if _truthy(cfg.pop(key, False)) and key == "enable_egm_store_pool":
                    return _refuse(_INVALID_PARAMS, "setup: enable_egm_store_pool needs the "
                                   "nvlink protocol, which Granary does not have")
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
            master = _master_address(master_server_addr)
            cluster = _cluster_id(cluster_id) if master.startswith(_ETCD_SCHEME) else ""
            label, bind_host, port = _split_host(local_hostname)
        except Error as e:
            return _refuse(e.code, f"setup: {e}")
        tenant = None if tenant_id in (None, "", _DEFAULT_TENANT) else str(tenant_id)
        if tenant is not None and segment > 0:
            return _refuse(_INVALID_PARAMS, f"setup: tenant_id {tenant!r} with "
                           "global_segment_size > 0: a tenant contributes no segment (other "
                           "tenants' objects would be placed in memory it can read); pass "
                           "global_segment_size=0")
        if engine is not None:
            _log.info("setup: the transfer engine passed is not used; Granary moves bytes over "
                      "its own TCP and shared-memory paths")
        disk_dir = ""
        if not isinstance(ssd_offload_path, (str, os.PathLike)):
            return _refuse(_INVALID_PARAMS, f"setup: ssd_offload_path must be a path, not "
                           f"{ssd_offload_path!r}")
        if _truthy(enable_ssd_offload):
            disk_dir = os.fspath(ssd_offload_path)
            if not disk_dir:
                # Mooncake may fall back to its environment; Granary reads none for this.
                return _refuse(_INVALID_PARAMS, "setup: enable_ssd_offload needs "
                               "ssd_offload_path, the directory of the SSD tier")
            if segment == 0:
                return _refuse(_INVALID_PARAMS, "setup: enable_ssd_offload needs "
                               "global_segment_size > 0: the SSD tier offloads the embedded "
                               "segment's objects")
        elif ssd_offload_path:
            _log.warning("setup: ssd_offload_path %r is ignored without enable_ssd_offload",
                         ssd_offload_path)
        if enable_client_http_server:
            _log.warning("setup: enable_client_http_server is ignored (client_http_port %s): "
                         "Granary's metrics are served by the master's HTTP port",
                         client_http_port)
        self._auth_token_file = auth_token_file
        self._tls = tls
        code = self._setup_segment((master, cluster), segment, buffer, label, bind_host, port,
                                   use_shm, disk_dir)
        if code == _OK and tenant is not None:
            code = self._check_tenant(tenant)
        if code == _OK:
            self._buffer_limit = buffer
        return code

    def _check_tenant(self, tenant):
        """A tenant_id is a namespace of Granary's only if the secret presented is that
        tenant's token (the master decides the namespace from the token, not from the name)."""
        try:
            caller = self._client.cluster().get("caller_tenant", "")
        except Error as e:
            self.close()
            return _refuse(e.code, f"setup: tenant_id {tenant!r}: {e}")
        if caller != tenant:
            self.close()
            held = f"the token of tenant {caller!r}" if caller else "not a tenant's token"
            return _refuse(_PERMISSION_DENIED, f"setup: tenant_id {tenant!r}, but the secret "
                           f"presented is {held}: give auth_token_file the tenant's token from "
                           "the master's --tenants-file (docs/security.md)")
        return _OK

    def _setup_segment(self, master, segment, buffer, label, bind_host, port, use_shm,
                       disk_dir=""):
        """Connects to master, an (address, cluster id) pair, embedding a segment named
        label:port whose data server listens on port."""
        if segment == 0:
            # Nothing listens without a segment: the port only completes the name.
            if port == 0:
                ports = _candidate_ports(bind_host)
                port = ports[0] if ports else _PORT_RANGE[0]
            code = self._connect(master, 0, buffer, bind_host, 0, use_shm, "")
            if code == _OK:
                self._hostname = f"{label}:{port}"
            return code
        ports = [port] if port else _candidate_ports(bind_host)
        code = _TRANSFER_FAIL
        for p in ports:
            code = self._connect(master, segment, buffer, bind_host, p, use_shm, f"{label}:{p}",
                                 disk_dir)
            if code != _TRANSFER_FAIL or port:
                break  # only a port taken since it was probed is worth another try
        if code == _OK:
            self._hostname = self._segment = self._client.segment_name
        elif not ports:
            code = _refuse(_TRANSFER_FAIL, f"setup: no free port in {_PORT_RANGE[0]}-"
                                           f"{_PORT_RANGE[1]} on {bind_host}")
        return code

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """Attaches to a standalone node on this host (`granary-node --standalone`, whose master
        listens at server_address) without contributing memory; alloc_from_mem_pool hands out
        buffers from a pool of mem_pool_size bytes that the zero-copy calls accept."""
        if self._client is not None:
            return _refuse(_UNAVAILABLE, "setup_dummy: this store is already set up")
        try:
            pool = _size(mem_pool_size, "mem_pool_size")
            buffer = _size(local_buffer_size, "local_buffer_size")
            master = _master_address(server_address)
            cluster = _cluster_id(None) if master.startswith(_ETCD_SCHEME) else ""
        except Error as e:
            return _refuse(e.code, f"setup_dummy: {e}")
        code = self._connect((master, cluster), 0, pool, "127.0.0.1", 0, True, "")
        if code == _OK:
            self._hostname = socket.gethostname()
            self._buffer_limit = buffer
        return code

    def init_all(self, protocol, device_name, mount_segment_size=_DEFAULT_SEGMENT):
        """Mooncake's legacy two-step initialisation; setup() does all of it in Granary."""
        return _unsupported("init_all (use setup)", _INVALID_PARAMS)

    def _connect(self, master, segment, pool_size, host, port, use_shm, segment_name,
                 disk_dir=""):
        address, cluster = master
        master = f"{address} (HA cluster {cluster!r})" if cluster else address  # for messages
        try:
            client = _granary.Client(address, segment_size=segment,
                                     segment_name=segment_name, data_host=host, data_port=port,
                                     use_shared_memory=use_shm, disk_dir=disk_dir,
                                     cluster_id=cluster,
                                     auth_token_file=self._auth_token_file,
                                     tls_ca_file=self._tls[0], tls_cert_file=self._tls[1],
                                     tls_key_file=self._tls[2])
        except Error as e:
            return _refuse(e.code, f"cannot connect to the master at {master} or start the "
                                   f"embedded segment: {e}")
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
        return _OK

    def _c(self):
        if self._client is None:
            raise error_for(_UNAVAILABLE, "the store is not set up (call setup first)")
        return self._client

    def close(self):
        """Stops the embedded segment (its objects leave the store with it) and disconnects;
        0, also when not set up. The store may be set up again afterwards."""
        if self._client is not None:
            self._client.close()
        self._client = None
        self._pool = None
        self._segment = ""
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
        """host:port: the embedded segment's name (what preferred_segment names)."""
        return self._hostname

    # ---- memory for the zero-copy calls ----
    def register_buffer(self, buffer_ptr, size):
        """Host memory of this process, or GPU memory where CUDA is found (`cuda_status()`)."""
        try:
            self._c().register_buffer(buffer_ptr, size)
            return _OK
        except Error as e:
            _log.error("register_buffer: %s", e)  # e.g. GPU memory on a host without CUDA
            return e.code
        except (TypeError, ValueError, OverflowError):
            return _INVALID_PARAMS

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
    def _cfg(self, config, key_count=1):
        return (config or ReplicateConfig())._native(key_count, self._segment)

    def _staged(self, total):
        """Copy-path writes stage their bytes through the local buffer in Mooncake: a call
        larger than local_buffer_size fails there, and so here."""
        if total > self._buffer_limit:
            raise error_for(_INVALID_PARAMS, f"a copy-path write of {total} bytes exceeds "
                            f"local_buffer_size ({self._buffer_limit}); use the zero-copy calls")

    def _put(self, key, value, config, upsert):
        def call():
            client = self._c()
            self._staged(_nbytes(value))
            return client.put(key, value, self._cfg(config), upsert=upsert)
        return _code(call)

    def _put_parts(self, key, parts, config, upsert):
        def call():
            client = self._c()
            self._staged(sum(_nbytes(p) for p in parts))
            return client.put_parts(key, list(parts), self._cfg(config), upsert=upsert)
        return _code(call)

    def _put_batch(self, keys, values, config, upsert):
        """0 if every key was stored, else the first failed key's code."""
        keys, values = list(keys), list(values)

        def call():
            client = self._c()
            self._staged(sum(_nbytes(v) for v in values))
            return client.batch_put(keys, values, self._cfg(config, len(keys)), upsert=upsert)
        codes = _codes(len(keys), call)
        return next((c for c in codes if c != 0), _OK)

    def put(self, key, value, config=None):
        return self._put(key, value, config, False)

    def put_parts(self, key, *parts, config=None):
        return self._put_parts(key, parts, config, False)

    def put_batch(self, keys, values, config=None):
        return self._put_batch(keys, values, config, False)

    def upsert(self, key, value, config=None):
        return self._put(key, value, config, True)

    def upsert_parts(self, key, *parts, config=None):
        return self._put_parts(key, parts, config, True)

    def upsert_batch(self, keys, values, config=None):
        return self._put_batch(keys, values, config, True)

    def put_from(self, key, buffer_ptr, size, config=None):
        return _code(lambda: self._c().put_addr(key, buffer_ptr, size, self._cfg(config)))

    def upsert_from(self, key, buffer_ptr, size, config=None):
        return _code(lambda: self._c().put_addr(key, buffer_ptr, size, self._cfg(config),
                                                upsert=True))

    def put_from_with_metadata(self, key, buffer_ptr, metadata_buffer_ptr, size, metadata_size,
                               config=None):
        """One object: the metadata bytes, then the data bytes (Mooncake's order). As in
        Mooncake, size 0 stores nothing and returns 0."""
        if size == 0:
            return _OK
        codes = _codes(1, lambda: self._c().batch_put_addr_parts(
            [key], [[metadata_buffer_ptr, buffer_ptr]], [[metadata_size, size]],
            self._cfg(config)))
        return codes[0]

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_put_addr(
            keys, list(buffer_ptrs), list(sizes), self._cfg(config, len(keys))))

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_put_addr(
            keys, list(buffer_ptrs), list(sizes), self._cfg(config, len(keys)), upsert=True))

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_put_addr_parts(
            keys, [list(p) for p in all_buffer_ptrs], [list(s) for s in all_sizes],
            self._cfg(config, len(keys))))

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

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_same_node=False):
        """`prefer_same_node` (Mooncake's fourth argument) is accepted: Granary reads a replica
        on this host first anyway."""
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_get_into_addr_parts(
            keys, [list(p) for p in all_buffer_ptrs], [list(s) for s in all_sizes]))

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                        all_sizes):
        """Buffer-major ranged reads: results[i][j][k] is the bytes read for fragment k of key
        all_keys[i][j] into buffer i, or a negative code: -600 for a shape mismatch, a bad
        number or an unregistered buffer, -10 for a destination range past the end of its
        registered buffer, -701 for a source range past the end of the object, the key's own
        failure (-704 when missing). Other fragments of the call still succeed.

        Every object is read whole and verified against its checksum before any of its
        fragments is copied out; see docs/python.md for the cost."""
        lists = (all_keys, all_dst_offsets, all_src_offsets, all_sizes)
        results, plan = _plan_ranges(buffer_ptrs, lists)
        try:
            client = self._c()
        except Error as e:
            return [[[e.code] * len(frags) for frags in buf] for buf in results]
        if not plan["key_of"]:
            return results
        try:
            codes = client.get_ranges(plan["keys"], plan["key_of"], plan["buffers"],
                                      plan["buffer_of"], plan["dst"], plan["src"], plan["sizes"],
                                      _RANGE_SCRATCH_BUDGET)
        except Error as e:
            codes = [e.code] * len(plan["key_of"])
        for (i, j, k), code in zip(plan["where"], codes):
            results[i][j][k] = code
        return results

    # ---- queries ----
    def is_exist(self, key):
        """1 if stored, 0 if not, a negative code on error."""
        return _code(lambda: int(self._c().exist(key)))

    def batch_is_exist(self, keys):
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_exist(keys))

    def get_size(self, key):
        return _code(lambda: self._c().get_size(key))

    def get_replica_desc(self, key):
        """The object's replicas as descriptors (memory replicas only: Granary's SSD tier is not
        available yet); [] on a miss or an error."""
        try:
            stat = self._c().stat(key)
        except Error:
            return []
        return [ReplicaDescriptor(stat["state"], r) for r in stat["replicas"]]

    def batch_get_replica_desc(self, keys):
        return {k: self.get_replica_desc(k) for k in keys}

    # ---- removal ----
    def remove(self, key, force=False):
        return _code(lambda: self._c().remove(key, force))

    def batch_remove(self, keys, force=False):
        keys = list(keys)
        return _codes(len(keys), lambda: self._c().batch_remove(keys, force))

    def remove_by_regex(self, regex=None, force=False, *, regex_pattern=None):
        """How many objects were removed, or a negative code. `regex_pattern` is the older
        binding's name for `regex`."""
        pattern = regex if regex is not None else regex_pattern
        return _code(lambda: self._c().remove_by_regex(pattern, force))

    def remove_all(self, force=False):
        return _code(lambda: self._c().remove_all(force))

    # ---- what Granary does not have ----
    def mount_segment(self, path, size, offset=0, protocol="tcp", location=""):
        return _unsupported("mount_segment", {"ret": _INVALID_PARAMS, "segment_ids": []})

    def unmount_segment(self, segment_ids, grace_period_seconds=0):
        return _unsupported("unmount_segment", _INVALID_PARAMS)

    def allocate_and_mount_segment(self, size, protocol="tcp", location=""):
        return _unsupported("allocate_and_mount_segment",
                            {"ret": _INVALID_PARAMS, "segment_ids": [], "allocated_size": 0})

    def unmount_and_free_segment(self, segment_ids, grace_period_seconds=0):
        return _unsupported("unmount_and_free_segment", _INVALID_PARAMS)

    def create_copy_task(self, key, targets):
        return _unsupported("create_copy_task", (uuid.UUID(int=0), _INVALID_PARAMS))

    def create_move_task(self, key, source, target):
        return _unsupported("create_move_task", (uuid.UUID(int=0), _INVALID_PARAMS))

    def query_task(self, task_id):
        return _unsupported("query_task", (None, _INVALID_PARAMS))

    # ---- PyTorch tensors (need torch importable) ----
    def _with_torch(self, name, failure, fn):
        torch = _torch()
        if torch is None:
            _log.error("%s needs PyTorch, which is not importable here", name)
            return failure
        try:
            return fn(torch)
        except Error as e:
            _log.error("%s: %s", name, e)
            return failure if not isinstance(failure, int) else e.code
        except (TypeError, ValueError, RuntimeError) as e:
            _log.error("%s: %s", name, e)
            return failure

    def _put_tensors(self, name, keys, tensors, config, upsert):
        """Each tensor as its own object (header + bytes, no copy into a joined buffer)."""
        keys, tensors = list(keys), list(tensors)
        if len(keys) != len(tensors):
            return [_INVALID_PARAMS] * len(keys)

        def run(torch):
            out = [_OK] * len(keys)
            good, parts = [], []
            for i, t in enumerate(tensors):
                try:
                    # a TP shard comes as (tensor, global shape, axes)
                    parts.append(list(_tensor_parts(torch, *t) if isinstance(t, tuple)
                                      else _tensor_parts(torch, t)))
                    good.append(i)
                except Error as e:
                    out[i] = e.code
            if good:
                client = self._c()
                self._staged(sum(len(p[0]) + p[1].nbytes for p in parts))
                codes = client.batch_put_parts([keys[i] for i in good], parts,
                                               self._cfg(config, len(good)), upsert=upsert)
                for i, c in zip(good, codes):
                    out[i] = c
            return out
        return self._with_torch(name, [_INVALID_PARAMS] * len(keys), run)

    def put_tensor(self, key, tensor):
        return self._put_tensors("put_tensor", [key], [tensor], None, False)[0]

    def pub_tensor(self, key, tensor, config=None):
        return self._put_tensors("pub_tensor", [key], [tensor], config, False)[0]

    def upsert_tensor(self, key, tensor):
        return self._put_tensors("upsert_tensor", [key], [tensor], None, True)[0]

    def upsert_pub_tensor(self, key, tensor, config=None):
        return self._put_tensors("upsert_pub_tensor", [key], [tensor], config, True)[0]

    def batch_put_tensor(self, keys, tensors_list):
        return self._put_tensors("batch_put_tensor", keys, tensors_list, None, False)

    def batch_pub_tensor(self, keys, tensors_list, config=None):
        return self._put_tensors("batch_pub_tensor", keys, tensors_list, config, False)

    def batch_upsert_tensor(self, keys, tensors_list):
        return self._put_tensors("batch_upsert_tensor", keys, tensors_list, None, True)

    def batch_upsert_pub_tensor(self, keys, tensors_list, config=None):
        return self._put_tensors("batch_upsert_pub_tensor", keys, tensors_list, config, True)

    def get_tensor(self, key):
        return self.batch_get_tensor([key])[0]

    def batch_get_tensor(self, keys):
        keys = list(keys)

        def run(torch):
            out = []
            for b in self.batch_get_buffer(keys):
                out.append(None if b is None else _tensors.decode(torch, b, b.size()))
            return out
        return self._with_torch("batch_get_tensor", [None] * len(keys), run)

    def get_tensor_into(self, key, buffer_ptr, size):
        return self.batch_get_tensor_into([key], [buffer_ptr], [size])[0]

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes):
        """Tensors viewing the caller's buffers (no copy beyond the read), None for a miss."""
        keys = list(keys)

        def run(torch):
            import ctypes
            got = self.batch_get_into(keys, buffer_ptrs, sizes)
            out = []
            for n, ptr in zip(got, buffer_ptrs):
                if n <= 0:
                    out.append(None)
                    continue
                out.append(_tensors.decode(torch, (ctypes.c_uint8 * n).from_address(ptr), n))
            return out
        return self._with_torch("batch_get_tensor_into", [None] * len(keys), run)

    def put_tensor_from(self, key, buffer_ptr, size):
        """The buffer already holds the serialized tensor (header + bytes): a zero-copy put;
        needs no torch."""
        return self.put_from(key, buffer_ptr, size)

    def batch_put_tensor_from(self, keys, buffer_ptrs, sizes):
        return self.batch_put_from(keys, buffer_ptrs, sizes)

    def upsert_tensor_from(self, key, buffer_ptr, size):
        return self.upsert_from(key, buffer_ptr, size)

    def batch_upsert_tensor_from(self, keys, buffer_ptrs, sizes):
        return self.batch_upsert_from(keys, buffer_ptrs, sizes)

    @staticmethod
    def _tp_key(key, rank):
        return f"{key}_tp_{rank}"

    def _put_tensor_tp(self, name, keys, tensors, config, tp_size, split_dim):
        keys, tensors = list(keys), list(tensors)
        if tp_size <= 1:
            return self._put_tensors(name, keys, tensors, config, False)
        if len(keys) != len(tensors):
            return [_INVALID_PARAMS] * len(keys)

        def run(torch):
            shard_keys, shards, owner = [], [], []
            out = [_OK] * len(keys)
            for i, (k, t) in enumerate(zip(keys, tensors)):
                chunks = t.chunk(tp_size, split_dim) if isinstance(t, torch.Tensor) else ()
                if len(chunks) != tp_size:
                    out[i] = _INVALID_PARAMS
                    continue
                for rank, chunk in enumerate(chunks):
                    shard_keys.append(self._tp_key(k, rank))
                    shards.append((chunk, tuple(t.shape),
                                   [_tensors.Axis("tp", rank, tp_size, split_dim % t.dim())]))
                    owner.append(i)
            codes = self._put_tensors(name, shard_keys, shards, config, False) if shards else []
            for i, c in zip(owner, codes):
                if c != _OK and out[i] == _OK:
                    out[i] = c
            return out
        return self._with_torch(name, [_INVALID_PARAMS] * len(keys), run)

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
        """Stores every shard (key_tp_0 ... key_tp_{tp_size-1}) whatever tp_rank is."""
        return self._put_tensor_tp("put_tensor_with_tp", [key], [tensor], None, tp_size,
                                   split_dim)[0]

    def pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
        return self._put_tensor_tp("pub_tensor_with_tp", [key], [tensor], config, tp_size,
                                   split_dim)[0]

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1,
                                 split_dim=0):
        return self._put_tensor_tp("batch_put_tensor_with_tp", base_keys, tensors_list, None,
                                   tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0,
                                 tp_size=1, split_dim=0):
        return self._put_tensor_tp("batch_pub_tensor_with_tp", base_keys, tensors_list, config,
                                   tp_size, split_dim)

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        return self.get_tensor(key if tp_size <= 1 else self._tp_key(key, tp_rank))

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1):
        return self.batch_get_tensor(
            [k if tp_size <= 1 else self._tp_key(k, tp_rank) for k in base_keys])

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
        return self.get_tensor_into(key if tp_size <= 1 else self._tp_key(key, tp_rank),
                                    buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0,
                                      tp_size=1):
        return self.batch_get_tensor_into(
            [k if tp_size <= 1 else self._tp_key(k, tp_rank) for k in base_keys],
            buffer_ptrs, sizes)

    def put_tensor_with_tp_from(self, key, buffer_ptr, size, tp_rank=0, tp_size=1,
                                split_dim=0):
        return self.batch_put_tensor_with_tp_from([key], [buffer_ptr], [size], tp_rank, tp_size,
                                                  split_dim)[0]

    def batch_put_tensor_with_tp_from(self, base_keys, buffer_ptrs, sizes, tp_rank=0,
                                      tp_size=1, split_dim=0):
        """tp_size 1 is batch_put_tensor_from; otherwise each full tensor is parsed from its
        buffer and split into shards (needs torch)."""
        base_keys = list(base_keys)
        if tp_size <= 1:
            return self.batch_put_tensor_from(base_keys, buffer_ptrs, sizes)

        def run(torch):
            import ctypes
            tensors = []
            for ptr, n in zip(buffer_ptrs, sizes):
                t = _tensors.decode(torch, (ctypes.c_uint8 * n).from_address(ptr), n)
                tensors.append(t)
            return self._put_tensor_tp("batch_put_tensor_with_tp_from", base_keys, tensors,
                                       None, tp_size, split_dim)
        return self._with_torch("batch_put_tensor_with_tp_from",
                                [_INVALID_PARAMS] * len(base_keys), run)

    # The unified parallel tensor family (TensorParallelism / ReadTarget) is not supported.
    def put_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                    writer_partition=None):
        return _unsupported("put_tensor_with_parallelism", _INVALID_PARAMS)

    def batch_put_tensor_with_parallelism(self, keys, tensors, parallelisms=None, config=None,
                                          writer_partitions=None):
        return _unsupported("batch_put_tensor_with_parallelism", [_INVALID_PARAMS] * len(keys))

    def upsert_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                       writer_partition=None):
        return _unsupported("upsert_tensor_with_parallelism", _INVALID_PARAMS)

    def batch_upsert_tensor_with_parallelism(self, keys, tensors, parallelisms=None,
                                             config=None, writer_partitions=None):
        return _unsupported("batch_upsert_tensor_with_parallelism",
                            [_INVALID_PARAMS] * len(keys))

    def get_tensor_with_parallelism(self, key, target=None):
        return _unsupported("get_tensor_with_parallelism", None)

    def batch_get_tensor_with_parallelism(self, keys, targets=None):
        return _unsupported("batch_get_tensor_with_parallelism", [None] * len(keys))

    def get_tensor_with_parallelism_into(self, key, buffer_ptr, size, target=None):
        return _unsupported("get_tensor_with_parallelism_into", None)

    def batch_get_tensor_with_parallelism_into(self, keys, buffer_ptrs, sizes, targets=None):
        return _unsupported("batch_get_tensor_with_parallelism_into", [None] * len(keys))

    def put_tensor_with_parallelism_from(self, key, buffer_ptr, size, *args, **kwargs):
        return _unsupported("put_tensor_with_parallelism_from", _INVALID_PARAMS)

    def batch_put_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes, *args, **kwargs):
        return _unsupported("batch_put_tensor_with_parallelism_from",
                            [_INVALID_PARAMS] * len(keys))

    def upsert_tensor_with_parallelism_from(self, key, buffer_ptr, size, *args, **kwargs):
        return _unsupported("upsert_tensor_with_parallelism_from", _INVALID_PARAMS)

    def batch_upsert_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes, *args,
                                                  **kwargs):
        return _unsupported("batch_upsert_tensor_with_parallelism_from",
                            [_INVALID_PARAMS] * len(keys))


# ---- get_into_ranges' shape rules ----

def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _UINT64_MAX


def _length(seq):
    try:
        return len(seq)
    except TypeError:
        return None


def _plan_ranges(buffer_ptrs, lists):
    """The result skeleton (every entry -600 until a read fills it) and the fragments worth
    reading, flattened for the native call. Shapes follow Mooncake: one entry per buffer, per
    key of that buffer, per fragment of that key; a buffer or key whose lists disagree in length
    fails as a whole, and so does every buffer when the top-level lists disagree."""
    n = _length(buffer_ptrs) or 0
    top_ok = all(_length(x) == n for x in lists)

    def at(seq, i):
        return seq[i] if _length(seq) is not None and i < len(seq) else None

    results = []
    plan = {"keys": [], "key_of": [], "buffers": [], "buffer_of": [], "dst": [], "src": [],
            "sizes": [], "where": []}
    key_index, buffer_index = {}, {}
    for i in range(n):
        per_buffer = [at(x, i) for x in lists]
        lengths = [_length(x) for x in per_buffer]
        key_count = max((m for m in lengths if m is not None), default=0)
        buffer_ptr = buffer_ptrs[i]
        buffer_ok = (top_ok and len(set(lengths)) == 1 and lengths[0] is not None
                     and _is_count(buffer_ptr) and buffer_ptr != 0)
        row = []
        for j in range(key_count):
            key = at(per_buffer[0], j)
            frags = [at(x, j) for x in per_buffer[1:]]
            frag_lengths = [_length(f) for f in frags]
            count = max((m for m in frag_lengths if m is not None), default=0)
            shape_ok = (buffer_ok and isinstance(key, str) and len(set(frag_lengths)) == 1
                        and frag_lengths[0] is not None)
            row.append([_INVALID_PARAMS] * (count if shape_ok else max(count, 1)))
            if not shape_ok:
                continue
            if key not in key_index:
                key_index[key] = len(plan["keys"])
                plan["keys"].append(key)
            if i not in buffer_index:
                buffer_index[i] = len(plan["buffers"])
                plan["buffers"].append(buffer_ptr)
            dst, src, size = frags
            for k in range(count):
                if not (_is_count(dst[k]) and _is_count(src[k]) and _is_count(size[k])):
                    continue  # stays -600
                plan["key_of"].append(key_index[key])
                plan["buffer_of"].append(buffer_index[i])
                plan["dst"].append(dst[k])
                plan["src"].append(src[k])
                plan["sizes"].append(size[k])
                plan["where"].append((i, j, k))
        results.append(row)
    return results, plan


BufferHandle = _granary.Buffer  # what get_buffer returns; Mooncake's name for it


class ReplicaStatus(enum.IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class Descriptor:
    """Where a memory replica lives: `buffer_address` is its offset inside the segment (Granary
    replicas are addressed by segment and offset, not by a remote virtual address),
    `transport_endpoint` the node's data-plane address, `segment_name` the segment."""

    def __init__(self, size, buffer_address, transport_endpoint, segment_name):
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint
        self.segment_name = segment_name

    def __repr__(self):
        return (f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
                f"transport_endpoint={self.transport_endpoint}>")


class MemoryDescriptor:
    def __init__(self, buffer_descriptor):
        self.buffer_descriptor = buffer_descriptor


class ReplicaDescriptor:
    """One replica of get_replica_desc: always a memory replica in Granary for now."""

    def __init__(self, state, replica):
        self.status = ReplicaStatus.COMPLETE if state.startswith("COMPLETE") \
            else ReplicaStatus.PROCESSING
        self._memory = MemoryDescriptor(Descriptor(replica["length"], replica["offset"],
                                                   replica["endpoint"], replica["segment"]))

    def is_memory_replica(self):
        return True

    def is_disk_replica(self):
        return False

    def get_memory_descriptor(self):
        return self._memory

    def get_disk_descriptor(self):
        raise ValueError("not a disk replica")


__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction",
           "MooncakeHostMemAllocator", "bind_to_numa_node", "BufferHandle", "ReplicaStatus",
           "ReplicaDescriptor", "MemoryDescriptor", "Descriptor"]
