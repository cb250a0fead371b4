// granary/client.h - the Granary client: put and get objects in a Granary store.
//
// Promise: a Get never returns wrong, stale or partial bytes. Every object carries an XXH3-64
// checksum set by its writer; a reader verifies it and, on a mismatch, tries the next replica;
// CHECKSUM_MISMATCH is returned only when no replica verifies. A miss is OBJECT_NOT_FOUND, an
// error is any other code: the two are never confused. Objects are write-once: Put of a key that
// exists (or is being written) succeeds and keeps the old value; Upsert replaces it.
// Transport: a replica on this host is read and written with one memcpy through its shared
// memory; any other over TCP, striped over several connections for large objects.
// Ownership: the Client owns its connections, mappings and, when segment_size > 0, an embedded
// storage node contributing that much memory (and, with disk_dir, a disk tier). Buffers passed
// in stay the caller's.
// Thread safety: every method may be called from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "granary/status.h"

namespace granary {

using ByteSpan = std::span<const std::byte>;
using MutableByteSpan = std::span<std::byte>;

// Whether the object is copied to a node's disk tier (docs/disk.md). It changes nothing where no
// node runs one. kDefault: the master's --persistence.
enum class Persistence : uint8_t {
  kDefault = 0,
  kEager = 1,  // soon after its put ends
  kLazy = 2,   // once its node's memory passes the master's offload watermark
  kNone = 3,   // never: memory eviction drops it
};

struct ReplicateConfig {
  uint32_t replica_num = 1;        // memory replicas, on distinct segments, best effort
  bool with_soft_pin = false;      // evicted only after every unpinned object
  bool with_hard_pin = false;      // never evicted; still removable
  std::vector<std::string> preferred_segments;  // tried first, then the others
  uint64_t soft_pin_ttl_ms = 0;    // 0: the master's default
  Persistence persistence = Persistence::kDefault;  // an upsert's own replaces the old one's
};

struct ClientOptions {
  // "host:port" of the master, or "etcd://h1:p1[;h2:p2...]": the serving leader of the HA cluster
  // `cluster_id` that etcd names, followed across failovers (docs/ha.md).
  std::string master_address = "127.0.0.1:50051";
  std::string cluster_id;          // empty: $GRANARY_CLUSTER_ID, else "granary"
  // File whose first line is the cluster's secret (mode 0600; docs/security.md), presented on
  // every master call. Empty: $GRANARY_AUTH_TOKEN_FILE, else no secret. A file that cannot be
  // used fails Connect with INVALID_PARAMS; a master that refuses it, with UNAUTHENTICATED.
  std::string auth_token_file;
  // TLS to the master (gRPC and the fast port; docs/security.md): PEM files. tls_ca_file is the
  // CA that signed the master's certificate; tls_cert_file and tls_key_file are this client's,
  // for a master that requires them (mutual TLS). All empty: $GRANARY_TLS_CA, $GRANARY_TLS_CERT
  // and $GRANARY_TLS_KEY; none set: plain TCP. Files that cannot be used fail Connect with
  // INVALID_PARAMS; a master whose certificate does not verify, with UNAUTHENTICATED or RPC_FAIL.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // With an etcd:// master whose etcd has auth enabled: a file (mode 0600) whose first line is
  // USER:PASSWORD of an etcd user that may read the cluster's keys. Empty: $GRANARY_ETCD_AUTH_FILE,
  // else none.
  std::string etcd_auth_file;
  // > 0: this process contributes a segment of this many bytes (an embedded node).
  uint64_t segment_size = 0;
  std::string segment_name;        // embedded node's segment name (default: hostname-pid-<random>)
  std::string data_host = "127.0.0.1";  // embedded node's data-plane bind address
  uint16_t data_port = 0;
  int rpc_timeout_ms = 10'000;
  int io_timeout_ms = 30'000;
  size_t connections_per_node = 4;
  uint64_t stripe_threshold = 4 << 20;  // objects above this go over several connections
  bool use_shared_memory = true;   // false: always TCP, even on this host
  // Maps this host's segments at Connect and populates their page tables in the background, so
  // the first puts do not pay a page fault per 4 KiB (transfer/mapping_warmer.h). Allocates the
  // pages of a segment its node did not prefault.
  bool warm_shared_memory = true;
  bool use_fast_path = true;       // false: every master call over gRPC, never the fast port
  // How long a call waits awake (polling its socket) for an answer from the master's fast port
  // or a node's TCP port before it sleeps on it, in microseconds: where idle cores halt, a
  // sleeping thread's wake-up is a large part of a same-host round trip. Bounded per wait; at
  // most half the process's cores spin at once. 0: never spin. -1: $GRANARY_SPIN_WAIT_US (a whole
  // number >= 0; anything else counts as unset), else 50. Values past 1 s are cut to 1 s. A node
  // that never answers is given up on after io_timeout_ms plus the spin.
  int spin_wait_us = -1;
  // Gets ask the master for a cache lease of this long on each key; until it ends (less a
  // margin) a repeat get of the key reads the replicas it was named without asking the master
  // (docs/control-path.md). Another client's put or remove of the key returns only once the
  // lease is over. 0: every get asks the master. At most location_cache_entries keys are kept.
  int64_t location_cache_ms = 2'000;
  size_t location_cache_entries = 65'536;
  size_t io_threads = 4;           // transfers of one batch run in parallel on these
  // Space reserved ahead of puts (one replica, no preferred segments), so that such a put is one
  // copy and one master call instead of two calls. Refilled in the background; 0: off.
  uint64_t reserve_bytes = 64ull << 20;
  // The embedded node's SSD tier (docs/disk.md), as granary-node's --disk-* flags: non-empty
  // disk_dir (an existing, writable directory) needs segment_size > 0. Empty strings and a 0
  // interval take granary-node's defaults; a bad value fails Connect with INVALID_PARAMS.
  std::string disk_dir;
  uint64_t disk_size = 0;          // 0: 80% of the free space of disk_dir's filesystem at start
  std::string disk_backend;        // bucket (default), file or offset
  std::string disk_eviction;       // lru (default), lru-units or fifo
  std::string disk_io;             // auto (default), uring or posix
  int64_t offload_interval_ms = 0; // how often it asks the master what to copy (default 1s)
                                   // < 0: never (no offload, no garbage deletion)
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  uint32_t replica_count = 0;
};

struct ReplicaInfo {
  std::string segment_name;
  std::string endpoint;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A copy on a node's local disk (the SSD tier).
struct DiskReplicaInfo {
  std::string node_id;
  std::string endpoint;
  uint64_t location = 0;  // the node's own handle
  uint64_t length = 0;
};

struct ObjectStat {
  std::string state;  // COMPLETE, PROCESSING or COMPLETE+PROCESSING
  uint64_t size = 0;
  uint64_t checksum = 0;
  std::vector<ReplicaInfo> replicas;  // in memory
  std::vector<DiskReplicaInfo> disk_replicas;
  uint32_t read_locks = 0;
  bool hard_pinned = false;
  bool soft_pinned = false;
  uint64_t idle_ms = 0;
  uint32_t want_replicas = 0;  // memory replicas it should have (its put's, or Replicate's)
  bool copying = false;        // a node is making it a new replica
};

// Who leads an HA cluster and how far each standby is (docs/ha.md). For a master running
// alone, ha is false and only applied_seq is set.
struct StandbyInfo {
  std::string id;
  std::string address;
  bool connected = false;
  bool synchronous = false;  // the one standby that may take over
  uint64_t acked_seq = 0;
  uint64_t lag = 0;          // operations behind the leader
};
// A tenant's objects (docs/security.md).
struct TenantInfo {
  std::string name;
  uint64_t bytes = 0;        // complete and being put
  uint64_t objects = 0;      // complete
  uint64_t quota_bytes = 0;  // 0: none
};
struct ClusterStatus {
  bool ha = false;
  std::string cluster_id;
  std::string leader_id;
  std::string leader_address;
  uint16_t leader_http_port = 0;  // its HTTP port (/metrics); 0: unknown (an older master)
  uint64_t term = 0;
  uint64_t applied_seq = 0;
  bool serving_alone = false;
  std::vector<StandbyInfo> standbys;
  // Who the master took this client for: "admin", "member" or "tenant", and its tenant ("" for
  // the default namespace); the tenants an admin or member may see, or a tenant's own.
  std::string caller_role;
  std::string caller_tenant;
  std::vector<TenantInfo> tenants;
};

// Bytes this client moved, by path: for checking which transport a deployment really uses.
struct ClientStats {
  uint64_t shm_bytes_written = 0;
  uint64_t shm_bytes_read = 0;
  uint64_t tcp_bytes_written = 0;
  uint64_t tcp_bytes_read = 0;
  uint64_t shm_mappings = 0;  // segments of this host mapped now (a gauge; dead ones are dropped)
  uint64_t disk_bytes_read = 0;  // object bytes loaded from nodes' disk tiers (both paths)
  // Of disk_bytes_read, those copied out of a same-host node's shared-memory staging region
  // (the rest came over TCP).
  uint64_t disk_bytes_read_shm = 0;
  // The background warm-up of new shared-memory mappings (ClientOptions::warm_shared_memory):
  // bytes populated so far, bytes still to populate, and the time it took.
  uint64_t shm_bytes_warmed = 0;
  uint64_t shm_bytes_warm_pending = 0;
  uint64_t shm_warm_ns = 0;
  // Objects put in one master call, into space reserved ahead (ClientOptions::reserve_bytes).
  uint64_t reserved_puts = 0;
  uint64_t reservations_held = 0;  // ready for puts now, in the background-filled pool (a gauge)
  // Of shm_bytes_read and shm_bytes_written, those a device copied straight out of or into a
  // segment (BatchGetIntoDevice, BatchPutFromDevice).
  uint64_t shm_bytes_read_by_device = 0;
  uint64_t shm_bytes_written_by_device = 0;
  // Gets served from the location cache with no master call (ClientOptions::location_cache_ms).
  uint64_t cached_gets = 0;
};

// Asked once per found object, on the calling thread, in key order, before any byte moves:
// returns where object `index` (of `size` bytes) goes, as buffers filled in order whose total is
// exactly `size`, or an error for that key. Lets a caller allocate once the size is known (a
// Python bytes object, a pinned buffer) instead of copying out of a temporary.
using BufferProvider =
    std::function<Result<std::vector<MutableByteSpan>>(size_t index, uint64_t size)>;

// Memory the client must never load or store with the CPU, such as a GPU's (the Python binding
// implements it over the CUDA runtime: gpu/cuda_device_memory.h). BatchGetIntoDevice and
// BatchPutFromDevice move each object by the cheapest path. To or from a segment on this host:
// one copy by the device straight into or out of the mapped segment, which the client registers
// with the device once per mapping (Register). A get hashes the segment's bytes on the CPU while
// the device copies them, and reports the object read only after the copy finished, the mount's
// token still held and the checksum matched. A put's checksum is computed from the segment after
// the device wrote it (the CPU cannot read the source): sound because the master hands that
// space to no one else while the put may write it. Anywhere else (TCP, a disk tier): through
// host memory of the client's. Implementations are called from the client's I/O threads at once:
// they must be thread-safe.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Whether [p, p + n) is this kind of memory; the client treats any other range as host memory.
  virtual bool Holds(const std::byte* p, uint64_t n) const = 0;
  // Starts copying n host bytes at src to device memory at dst; may return before it is done,
  // or before it began (held to join the next copy). An error may be that of an earlier copy
  // since the last Wait, which then fails too.
  virtual Status CopyIn(std::byte* dst, const std::byte* src, uint64_t n) = 0;
  // Starts copying n device bytes at src to host memory at dst; as CopyIn.
  virtual Status CopyOut(std::byte* dst, const std::byte* src, uint64_t n) = 0;
  // Waits for every copy this thread started: once it returns, their sources may change and
  // their destinations hold the bytes.
  virtual Status Wait() = 0;
  // Registers host memory with the device for fast copies out of it, for as long as the
  // returned handle lives (the client keeps it while the memory stays mapped and drops it before
  // unmapping); nullptr when it cannot: copies still work, through the device's own staging.
  // The handle lives as long as the client's mapping, which may be longer than this object:
  // what it releases must not depend on this object still being there.
  virtual std::shared_ptr<void> Register(std::byte* base, uint64_t size) = 0;
};

struct SegmentStatus {
  std::string name;
  std::string node_id;
  std::string endpoint;
  uint64_t size = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t largest_free_block = 0;
  uint64_t replicas = 0;
  // The owning node's disk tier (all 0 without one).
  uint64_t disk_capacity = 0;
  uint64_t disk_used = 0;
  uint64_t disk_objects = 0;
  // Drain (Client::Drain): no new placements here; what still needs a copy elsewhere.
  bool draining = false;
  uint64_t drain_remaining_objects = 0;
  uint64_t drain_remaining_bytes = 0;
};

// A drain (Client::Drain) under way, or done: its segment unmounted and its name refused until
// Undrain. A drain under way outlives its segment if the segment's node dies meanwhile.
struct DrainStatus {
  std::string segment;
  bool drop = false;
  bool done = false;
  int64_t start_unix_ms = 0;
  uint64_t remaining_objects = 0;  // still needing a copy elsewhere (under way only)
  uint64_t remaining_bytes = 0;
};

class Client {
 public:
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  virtual ~Client() = default;

  // ---- single key ----
  virtual Status Put(std::string_view key, ByteSpan value, const ReplicateConfig& config = {}) = 0;
  // The concatenation of parts, stored as one object.
  virtual Status PutParts(std::string_view key, const std::vector<ByteSpan>& parts,
                          const ReplicateConfig& config = {}) = 0;
  virtual Status Upsert(std::string_view key, ByteSpan value,
                        const ReplicateConfig& config = {}) = 0;
  virtual Result<std::vector<std::byte>> Get(std::string_view key) = 0;
  // Copies the object into buffer and returns its size; BUFFER_OVERFLOW (nothing copied) if the
  // buffer is smaller than the object.
  virtual Result<uint64_t> GetInto(std::string_view key, MutableByteSpan buffer) = 0;
  virtual Result<bool> Exist(std::string_view key) = 0;
  virtual Result<uint64_t> GetSize(std::string_view key) = 0;
  virtual Status Remove(std::string_view key, bool force = false) = 0;
  virtual Result<ObjectStat> Stat(std::string_view key) = 0;

  // ---- batches: one result per key, in order ----
  virtual std::vector<Status> BatchPut(const std::vector<std::string>& keys,
                                       const std::vector<ByteSpan>& values,
                                       const ReplicateConfig& config = {}) = 0;
  // Each object gathered from several buffers.
  virtual std::vector<Status> BatchPutParts(const std::vector<std::string>& keys,
                                            const std::vector<std::vector<ByteSpan>>& parts,
                                            const ReplicateConfig& config = {}) = 0;
  virtual std::vector<Status> BatchUpsert(const std::vector<std::string>& keys,
                                          const std::vector<ByteSpan>& values,
                                          const ReplicateConfig& config = {}) = 0;
  virtual std::vector<Status> BatchUpsertParts(const std::vector<std::string>& keys,
                                               const std::vector<std::vector<ByteSpan>>& parts,
                                               const ReplicateConfig& config = {}) = 0;
  virtual std::vector<Result<std::vector<std::byte>>> BatchGet(
      const std::vector<std::string>& keys) = 0;
  virtual std::vector<Result<uint64_t>> BatchGetInto(const std::vector<std::string>& keys,
                                                     const std::vector<MutableByteSpan>& buffers) = 0;
  // Each object scattered over several buffers, filled in order; their total must hold it.
  virtual std::vector<Result<uint64_t>> BatchGetIntoParts(
      const std::vector<std::string>& keys,
      const std::vector<std::vector<MutableByteSpan>>& buffers) = 0;
  // BatchPutParts (BatchUpsertParts with `upsert`) where some parts are `device` memory, which
  // the CPU never touches (see DeviceMemory).
  virtual std::vector<Status> BatchPutFromDevice(const std::vector<std::string>& keys,
                                                 const std::vector<std::vector<ByteSpan>>& parts,
                                                 DeviceMemory& device,
                                                 const ReplicateConfig& config = {},
                                                 bool upsert = false) = 0;
  // BatchGetIntoParts where some buffers are `device` memory, which the CPU never touches (see
  // DeviceMemory). An object only on a disk tier comes through host memory too.
  virtual std::vector<Result<uint64_t>> BatchGetIntoDevice(
      const std::vector<std::string>& keys,
      const std::vector<std::vector<MutableByteSpan>>& buffers, DeviceMemory& device) = 0;
  // Each object into the buffers `provide` hands out once its size is known. A provider that
  // throws fails its key (INTERNAL_ERROR); nothing escapes and no read lock is left behind.
  virtual std::vector<Result<uint64_t>> BatchGetWith(const std::vector<std::string>& keys,
                                                     const BufferProvider& provide) = 0;
  virtual std::vector<Result<bool>> BatchExist(const std::vector<std::string>& keys) = 0;
  virtual std::vector<Result<uint64_t>> BatchGetSize(const std::vector<std::string>& keys) = 0;
  // How many leading keys are stored: "how much of my prompt is cached?" in one call.
  virtual Result<uint32_t> PrefixMatch(const std::vector<std::string>& keys) = 0;
  virtual std::vector<Status> BatchRemove(const std::vector<std::string>& keys,
                                          bool force = false) = 0;

  // ---- many keys by pattern (RE2, searched anywhere in the key; anchor with ^ and $) ----
  virtual Result<uint64_t> RemoveByRegex(const std::string& pattern, bool force = false) = 0;
  virtual Result<std::vector<ObjectInfo>> QueryByRegex(const std::string& pattern,
                                                       uint32_t limit = 0) = 0;
  virtual Result<uint64_t> RemoveAll(bool force = false) = 0;

  // ---- replica counts and drains (docs/operations.md) ----
  // Sets each key's number of memory replicas (1..64). Fewer replicas: the surplus goes at once
  // (its space waits for readers' locks). More: nodes copy from a live replica in the
  // background, at the master's --rereplicate-mbps; a copy becomes a replica only once complete,
  // so no reader sees a half-copied one. Stat's want_replicas and replicas show the progress.
  virtual std::vector<Status> BatchReplicate(const std::vector<std::string>& keys,
                                             uint32_t replica_num) = 0;
  // Drains a segment: nothing new is placed there, its objects get their replicas elsewhere
  // (those only it holds, in memory or on its node's disk, too), then it is unmounted and its
  // name refused until Undrain. drop: unmount at once, copying nothing. Not for tenants.
  virtual Status Drain(const std::string& segment, bool drop = false) = 0;
  // Reverts a drain not finished yet, or lets a drained segment's name mount again.
  virtual Status Undrain(const std::string& segment) = 0;
  // Every drain the master remembers: under way, or done and not undrained, by segment name.
  virtual Result<std::vector<DrainStatus>> ListDrains() = 0;

  // ---- the store ----
  virtual Result<std::vector<SegmentStatus>> ListSegments() = 0;
  // OK if the master answers.
  virtual Status Health() = 0;
  // The leader, its term and its standbys (HA); see ClusterStatus.
  virtual Result<ClusterStatus> Cluster() = 0;
  // This client's id with the master, and the embedded node's segment name (empty if none).
  virtual const std::string& client_id() const = 0;
  virtual const std::string& segment_name() const = 0;
  virtual ClientStats Stats() const = 0;
  // Stops the embedded node (unmounting its segment) and releases pending read locks.
  virtual void Close() = 0;
};

}  // namespace granary
