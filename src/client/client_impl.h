// client/client_impl.h - the Client implementation (granary/client.h): the two-phase protocol of
// DESIGN.md over the master link (metadata) and ReplicaIo (bytes). Declared here so that its
// parts live in files of their own: client.cc (connecting), client_put.cc (the put paths),
// client_get.cc (reads, from memory and disk).
// Ownership: owns its link, directory, mappings, transport, pool and reservations; shares the
// master locator. Thread safety: every public method from any thread (granary/client.h).
#pragma once

#include "granary/client.h"

#include <atomic>
#include <algorithm>
#include <deque>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_set>

#include "client/master_link.h"
#include "client/location_cache.h"
#include "client/master_locator.h"
#include "client/read_releaser.h"
#include "client/replica_io.h"
#include "client/replica_admin.h"
#include "client/reservation_pool.h"
#include "client/segment_directory.h"
#include "common/checksum.h"
#include "common/host.h"
#include "common/spin_wait.h"
#include "common/thread_pool.h"
#include "granary/proto/master.grpc.pb.h"
#include "node/storage_node.h"
#include "proto/rpc_util.h"
#include "security/secret.h"
#include "security/tls.h"

namespace granary::client {

inline uint64_t TotalSize(const auto& parts) {
  uint64_t total = 0;
  for (const auto& p : parts) total += p.size();
  return total;
}

inline proto::ReplicateConfig ToProto(const ReplicateConfig& c) {
  proto::ReplicateConfig out;
  out.set_replica_num(c.replica_num);
  out.set_with_soft_pin(c.with_soft_pin);
  out.set_with_hard_pin(c.with_hard_pin);
  for (const auto& s : c.preferred_segments) out.add_preferred_segments(s);
  out.set_soft_pin_ttl_ms(c.soft_pin_ttl_ms);
  out.set_persistence(static_cast<proto::Persistence>(c.persistence));  // same numbering
  return out;
}

class ClientImpl final : public Client {
 public:
  ClientImpl(const ClientOptions& options, std::shared_ptr<client::MasterLocator> locator)
      : options_(options),
        client_id_(UniqueProcessId("client")),
        master_(std::move(locator)),
        link_(master_, options.rpc_timeout_ms,
              options.use_fast_path ? client::MasterLink::Path::kAuto
                                    : client::MasterLink::Path::kGrpc,
              SpinWaitUs(options)),
        directory_(master_.get(), HostId(), options.rpc_timeout_ms),
        tcp_(TcpOptions(options)),
        pool_(options.io_threads),
        io_(&directory_, &mappings_, &tcp_, options.use_shared_memory,
            options.warm_shared_memory, &pool_),
        releaser_(&link_, client_id_),
        reservations_(&link_, client_id_, options.reserve_bytes),
        cache_(options.location_cache_ms > 0 ? options.location_cache_entries : 0) {}

  ~ClientImpl() override { Close(); }

  Status Init() {
    if (!options_.disk_dir.empty() && options_.segment_size == 0) {
      return Status(ErrorCode::INVALID_PARAMS,
                    "disk_dir needs an embedded node (segment_size > 0): the disk tier offloads "
                    "from the node's own memory");
    }
    if (options_.segment_size > 0) {
      node::StorageNodeOptions n;
      n.master_address = options_.master_address;
      n.cluster_id = options_.cluster_id;
      n.secret = master_->secret();
      n.tls = master_->tls();
      n.etcd_credentials = master_->etcd_credentials();
      n.segment_name = options_.segment_name;
      n.segment_size = options_.segment_size;
      n.listen_host = options_.data_host;
      n.port = options_.data_port;
      // Unset fields keep granary-node's defaults, so both run the same tier.
      node::DiskTierSettings disk;
      disk.dir = options_.disk_dir;
      disk.size = options_.disk_size;
      if (!options_.disk_backend.empty()) disk.backend = options_.disk_backend;
      if (!options_.disk_eviction.empty()) disk.eviction = options_.disk_eviction;
      if (!options_.disk_io.empty()) disk.io = options_.disk_io;
      if (options_.offload_interval_ms != 0) disk.offload_interval_ms = options_.offload_interval_ms;
      auto tier = node::MakeDiskTierOptions(disk, n.rpc_timeout_ms);
      if (!tier.ok()) return tier.status();
      n.disk = std::move(*tier);
      auto node = node::StorageNode::Start(n);
      if (!node.ok()) return node.status();
      node_ = std::move(*node);
      if (!node_->mounted()) {
        return Status(ErrorCode::RPC_FAIL,
                      "master " + options_.master_address + " is unreachable; segment not mounted");
      }
      segment_name_ = node_->segment_name();
    }
    // Learns this host's segments now, so their mappings warm while the caller sets up.
    if (options_.use_shared_memory) (void)directory_.Refresh();
    return Status::Ok();
  }

  // ---- writes ----

  Status Put(std::string_view key, ByteSpan value, const ReplicateConfig& config) override {
    return PutCore({std::string(key)}, {{value}}, config, false)[0];
  }
  Status PutParts(std::string_view key, const std::vector<ByteSpan>& parts,
                  const ReplicateConfig& config) override {
    return PutCore({std::string(key)}, {parts}, config, false)[0];
  }
  Status Upsert(std::string_view key, ByteSpan value, const ReplicateConfig& config) override {
    return PutCore({std::string(key)}, {{value}}, config, true)[0];
  }
  std::vector<Status> BatchPut(const std::vector<std::string>& keys,
                               const std::vector<ByteSpan>& values,
                               const ReplicateConfig& config) override {
    return PutCore(keys, AsParts(values, keys.size()), config, false);
  }
  std::vector<Status> BatchPutParts(const std::vector<std::string>& keys,
                                    const std::vector<std::vector<ByteSpan>>& parts,
                                    const ReplicateConfig& config) override {
    if (parts.size() != keys.size()) return Fill(keys.size(), Mismatch("parts"));
    return PutCore(keys, parts, config, false);
  }
  std::vector<Status> BatchUpsert(const std::vector<std::string>& keys,
                                  const std::vector<ByteSpan>& values,
                                  const ReplicateConfig& config) override {
    return PutCore(keys, AsParts(values, keys.size()), config, true);
  }
  std::vector<Status> BatchUpsertParts(const std::vector<std::string>& keys,
                                       const std::vector<std::vector<ByteSpan>>& parts,
                                       const ReplicateConfig& config) override {
    if (parts.size() != keys.size()) return Fill(keys.size(), Mismatch("parts"));
    return PutCore(keys, parts, config, true);
  }
  std::vector<Status> BatchPutFromDevice(const std::vector<std::string>& keys,
                                         const std::vector<std::vector<ByteSpan>>& parts,
                                         DeviceMemory& device, const ReplicateConfig& config,
                                         bool upsert) override {
    if (parts.size() != keys.size()) return Fill(keys.size(), Mismatch("parts"));
    return PutCore(keys, parts, config, upsert, &device);
  }

  // ---- reads ----

  Result<std::vector<std::byte>> Get(std::string_view key) override {
    return std::move(BatchGet({std::string(key)})[0]);
  }
  Result<uint64_t> GetInto(std::string_view key, MutableByteSpan buffer) override {
    return std::move(BatchGetInto({std::string(key)}, {buffer})[0]);
  }
  std::vector<Result<std::vector<std::byte>>> BatchGet(
      const std::vector<std::string>& keys) override {
    std::vector<std::vector<std::byte>> storage(keys.size());
    auto sizes = GetCore(keys, [&](size_t i, uint64_t size) -> Result<std::vector<MutableByteSpan>> {
      storage[i].resize(size);
      return std::vector<MutableByteSpan>{MutableByteSpan(storage[i])};
    });
    std::vector<Result<std::vector<std::byte>>> out;
    out.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (sizes[i].ok()) {
        out.emplace_back(std::move(storage[i]));
      } else {
        out.emplace_back(sizes[i].status());
      }
    }
    return out;
  }
  std::vector<Result<uint64_t>> BatchGetInto(const std::vector<std::string>& keys,
                                             const std::vector<MutableByteSpan>& buffers) override {
    if (buffers.size() != keys.size()) return FillResult<uint64_t>(keys.size(), Mismatch("buffers"));
    return GetCore(keys, [&](size_t i, uint64_t size) -> Result<std::vector<MutableByteSpan>> {
      if (buffers[i].size() < size) return TooSmall(buffers[i].size(), size);
      return std::vector<MutableByteSpan>{buffers[i].subspan(0, size)};
    });
  }
  std::vector<Result<uint64_t>> BatchGetWith(const std::vector<std::string>& keys,
                                             const BufferProvider& provide) override {
    return GetCore(keys, [&](size_t i, uint64_t size) -> Result<std::vector<MutableByteSpan>> {
      auto d = provide(i, size);
      if (d.ok() && TotalSize(*d) != size) {
        return Status(ErrorCode::INVALID_PARAMS, "provided buffers hold " +
                                                     std::to_string(TotalSize(*d)) +
                                                     " bytes, not the object's " +
                                                     std::to_string(size));
      }
      return d;
    });
  }
  std::vector<Result<uint64_t>> BatchGetIntoParts(
      const std::vector<std::string>& keys,
      const std::vector<std::vector<MutableByteSpan>>& buffers) override {
    return GetIntoParts(keys, buffers, nullptr);
  }
  std::vector<Result<uint64_t>> BatchGetIntoDevice(
      const std::vector<std::string>& keys,
      const std::vector<std::vector<MutableByteSpan>>& buffers, DeviceMemory& device) override {
    return GetIntoParts(keys, buffers, &device);
  }
  std::vector<Result<uint64_t>> GetIntoParts(
      const std::vector<std::string>& keys,
      const std::vector<std::vector<MutableByteSpan>>& buffers, DeviceMemory* device) {
    if (buffers.size() != keys.size()) return FillResult<uint64_t>(keys.size(), Mismatch("buffers"));
    return GetCore(keys, [&](size_t i, uint64_t size) -> Result<std::vector<MutableByteSpan>> {
      if (TotalSize(buffers[i]) < size) return TooSmall(TotalSize(buffers[i]), size);
      std::vector<MutableByteSpan> parts;
      uint64_t left = size;
      for (const auto& b : buffers[i]) {
        if (left == 0) break;
        uint64_t take = std::min<uint64_t>(left, b.size());
        parts.push_back(b.subspan(0, take));
        left -= take;
      }
      return parts;
    }, device);
  }

  // ---- queries ----

  Result<bool> Exist(std::string_view key) override {
    return std::move(BatchExist({std::string(key)})[0]);
  }
  std::vector<Result<bool>> BatchExist(const std::vector<std::string>& keys) override {
    proto::BatchExistRequest req;
    for (const auto& k : keys) req.add_keys(k);
    proto::BatchExistResponse resp;
    Status s = link_.Exist(req, &resp);
    if (s.code() == ErrorCode::RPC_FAIL) s = link_.Exist(req, &resp);  // a query: safe to repeat
    if (!s.ok() || resp.results_size() != static_cast<int>(keys.size())) {
      return FillResult<bool>(keys.size(), s.ok() ? Malformed() : s);
    }
    std::vector<Result<bool>> out;
    for (int32_t r : resp.results()) {
      if (r < 0) {
        out.emplace_back(Status(ErrorCodeFromInt(r), "exist"));
      } else {
        out.emplace_back(r == 1);
      }
    }
    return out;
  }
  Result<uint64_t> GetSize(std::string_view key) override {
    return std::move(BatchGetSize({std::string(key)})[0]);
  }
  std::vector<Result<uint64_t>> BatchGetSize(const std::vector<std::string>& keys) override {
    proto::BatchGetSizeRequest req;
    for (const auto& k : keys) req.add_keys(k);
    proto::BatchGetSizeResponse resp;
    Status s = master_->Call(&proto::Master::Stub::BatchGetSize, req, &resp, "get size",
                              /*idempotent=*/true);
    if (!s.ok() || resp.results_size() != static_cast<int>(keys.size())) {
      return FillResult<uint64_t>(keys.size(), s.ok() ? Malformed() : s);
    }
    std::vector<Result<uint64_t>> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      int64_t r = resp.results(static_cast<int>(i));
      if (r < 0) {
        out.emplace_back(Status(ErrorCodeFromInt(static_cast<int32_t>(r)), "'" + keys[i] + "'"));
      } else {
        out.emplace_back(static_cast<uint64_t>(r));
      }
    }
    return out;
  }
  Result<uint32_t> PrefixMatch(const std::vector<std::string>& keys) override {
    proto::BatchPrefixMatchRequest req;
    for (const auto& k : keys) req.add_keys(k);
    proto::BatchPrefixMatchResponse resp;
    Status s = master_->Call(&proto::Master::Stub::BatchPrefixMatch, req, &resp, "prefix match",
                              /*idempotent=*/true);
    if (!s.ok()) return s;
    if (resp.code() != 0) return rpc::FromCode(resp.code(), resp.message());
    return resp.matched();
  }
  Result<ObjectStat> Stat(std::string_view key) override {
    proto::StatObjectRequest req;
    req.set_key(std::string(key));
    proto::StatObjectResponse resp;
    Status s = master_->Call(&proto::Master::Stub::StatObject, req, &resp, "stat",
                              /*idempotent=*/true);
    if (!s.ok()) return s;
    if (resp.code() != 0) return rpc::FromCode(resp.code(), resp.message());
    ObjectStat stat;
    stat.state = resp.state();
    stat.size = resp.size();
    stat.checksum = resp.checksum();
    for (const auto& r : resp.replicas()) {
      stat.replicas.push_back({r.segment_name(), r.endpoint(), r.offset(), r.length()});
    }
    for (const auto& d : resp.disk_replicas()) {
      stat.disk_replicas.push_back({d.node_id(), d.endpoint(), d.location(), d.length()});
    }
    stat.read_locks = resp.read_locks();
    stat.hard_pinned = resp.hard_pinned();
    stat.soft_pinned = resp.soft_pinned();
    stat.idle_ms = resp.idle_ms();
    stat.want_replicas = resp.want_replicas();
    stat.copying = resp.copying();
    return stat;
  }

  // ---- removal ----

  Status Remove(std::string_view key, bool force) override {
    return BatchRemove({std::string(key)}, force)[0];
  }
  std::vector<Status> BatchRemove(const std::vector<std::string>& keys, bool force) override {
    releaser_.Flush();  // our own finished reads must not hold up our own remove
    proto::BatchRemoveRequest req;
    req.set_client_id(client_id_);
    for (const auto& k : keys) req.add_keys(k);
    req.set_force(force);
    proto::BatchStatusResponse resp;
    Forget(keys);
    Status s = master_->Call(&proto::Master::Stub::BatchRemove, req, &resp, "remove",
                              /*idempotent=*/false);
    Forget(keys);
    if (s.ok()) Settle(resp.settle_ms());
    return Statuses(s, resp, keys.size());
  }
  Result<uint64_t> RemoveByRegex(const std::string& pattern, bool force) override {
    releaser_.Flush();
    proto::RegexRequest req;
    req.set_pattern(pattern);
    req.set_force(force);
    proto::RemoveCountResponse resp;
    cache_.Clear();
    Status s = master_->Call(&proto::Master::Stub::RemoveByRegex, req, &resp, "remove by regex",
                              /*idempotent=*/false);
    cache_.Clear();
    if (!s.ok()) return s;
    Settle(resp.settle_ms());
    if (resp.code() != 0) return rpc::FromCode(resp.code(), resp.message());
    return resp.removed();
  }
  Result<std::vector<ObjectInfo>> QueryByRegex(const std::string& pattern,
                                               uint32_t limit) override {
    proto::RegexRequest req;
    req.set_pattern(pattern);
    req.set_limit(limit);
    proto::QueryByRegexResponse resp;
    Status s = master_->Call(&proto::Master::Stub::QueryByRegex, req, &resp, "query by regex",
                              /*idempotent=*/true);
    if (!s.ok()) return s;
    if (resp.code() != 0) return rpc::FromCode(resp.code(), resp.message());
    std::vector<ObjectInfo> out;
    for (const auto& o : resp.objects()) out.push_back({o.key(), o.size(), o.replica_count()});
    return out;
  }
  Result<uint64_t> RemoveAll(bool force) override {
    releaser_.Flush();
    proto::RemoveAllRequest req;
    req.set_force(force);
    proto::RemoveCountResponse resp;
    cache_.Clear();
    Status s = master_->Call(&proto::Master::Stub::RemoveAll, req, &resp, "remove all",
                              /*idempotent=*/false);
    cache_.Clear();
    if (!s.ok()) return s;
    Settle(resp.settle_ms());
    if (resp.code() != 0) return rpc::FromCode(resp.code(), resp.message());
    return resp.removed();
  }

  // ---- the store ----

  Result<std::vector<SegmentStatus>> ListSegments() override {
    proto::ListSegmentsResponse resp;
    Status s = master_->Call(&proto::Master::Stub::ListSegments, proto::ListSegmentsRequest(),
                             &resp, "list segments", /*idempotent=*/true);
    if (!s.ok()) return s;
    std::vector<SegmentStatus> out;
    for (const auto& i : resp.segments()) {
      out.push_back({i.name(), i.node_id(), i.endpoint(), i.size(), i.used_bytes(),
                     i.free_bytes(), i.largest_free_block(), i.object_count(),
                     i.node_disk().capacity_bytes(), i.node_disk().used_bytes(),
                     i.node_disk().object_count(), i.draining(), i.drain_remaining_objects(),
                     i.drain_remaining_bytes()});
    }
    return out;
  }
  std::vector<Status> BatchReplicate(const std::vector<std::string>& keys,
                                     uint32_t replica_num) override {
    return client::ReplicateKeys(*master_, client_id_, keys, replica_num);
  }
  Status Drain(const std::string& segment, bool drop) override {
    return client::DrainSegment(*master_, segment, drop, /*undrain=*/false);
  }
  Status Undrain(const std::string& segment) override {
    return client::DrainSegment(*master_, segment, false, /*undrain=*/true);
  }
  Result<std::vector<DrainStatus>> ListDrains() override { return client::ListDrains(*master_); }
  Status Health() override {
    proto::PingRequest req;
    req.set_client_id(client_id_);
    proto::PingResponse resp;
    return link_.Ping(req, &resp);
  }
  Result<ClusterStatus> Cluster() override {
    proto::ClusterStatusResponse resp;
    Status s = master_->Call(&proto::Master::Stub::ClusterStatus, proto::ClusterStatusRequest(),
                             &resp, "cluster status", /*idempotent=*/true);
    if (!s.ok()) return s;
    ClusterStatus out;
    out.ha = resp.ha();
    out.cluster_id = resp.cluster_id();
    out.leader_id = resp.member_id();
    out.leader_address = resp.address();
    out.leader_http_port = static_cast<uint16_t>(resp.http_port());
    out.term = resp.term();
    out.applied_seq = resp.applied_seq();
    out.serving_alone = resp.serving_alone();
    for (const auto& st : resp.standbys()) {
      out.standbys.push_back({st.id(), st.address(), st.connected(), st.synchronous(),
                              st.acked_seq(), st.lag()});
    }
    out.caller_role = resp.caller_role();
    out.caller_tenant = resp.caller_tenant();
    for (const auto& t : resp.tenants()) {
      out.tenants.push_back({t.name(), t.bytes(), t.objects(), t.quota_bytes()});
    }
    return out;
  }
  const std::string& client_id() const override { return client_id_; }
  const std::string& segment_name() const override { return segment_name_; }
  ClientStats Stats() const override {
    ClientStats stats = io_.Stats();
    stats.reserved_puts = reserved_puts_.load(std::memory_order_relaxed);
    stats.reservations_held = reservations_.stats().held;
    stats.cached_gets = cached_gets_.load(std::memory_order_relaxed);
    return stats;
  }
  void Close() override {
    releaser_.Flush();
    reservations_.Close();
    std::lock_guard lock(close_mu_);
    if (node_) node_->Stop();
    node_.reset();
  }

 private:
  static transfer::TcpTransport::Options TcpOptions(const ClientOptions& o) {
    transfer::TcpTransport::Options t;
    t.connections_per_endpoint = o.connections_per_node;
    t.stripe_threshold = o.stripe_threshold;
    t.io_timeout_ms = o.io_timeout_ms;
    t.spin_wait_us = SpinWaitUs(o);
    return t;
  }
  static uint32_t SpinWaitUs(const ClientOptions& o) {
    return net::ResolveSpinWaitUs(o.spin_wait_us);
  }
  static Status Mismatch(const char* what) {
    return Status(ErrorCode::INVALID_PARAMS, std::string("keys and ") + what + " differ in count");
  }
  static Status Malformed() { return Status(ErrorCode::RPC_FAIL, "malformed reply from master"); }
  static Status TooSmall(uint64_t have, uint64_t need) {
    return Status(ErrorCode::BUFFER_OVERFLOW, "buffer of " + std::to_string(have) +
                                                  " bytes is smaller than the object's " +
                                                  std::to_string(need));
  }
  static std::vector<Status> Fill(size_t n, const Status& s) { return std::vector<Status>(n, s); }
  // This client writes or removes `keys`: its cached locations of them go (LocationCache).
  template <typename Keys>
  void Forget(const Keys& keys) {
    cache_.InvalidateAll(keys);
  }
  // A commit or remove answered that other clients may read the keys' former versions from
  // their caches for `ms` yet: the write is complete only after that (bounded, against a
  // hostile or broken answer, by the longest lease a client asks).
  static void Settle(uint64_t ms) {
    if (ms == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<uint64_t>(ms, 60'000)));
  }
  // Reads one key from its memory replicas (this host's first) into `dst`, under a lease that
  // ends at `deadline`: OK with the size, or why not; *late when the deadline passed before
  // the copy or during it (the bytes are then abandoned, whatever they are).
  Status ReadMemory(const proto::GetReplicaResult& r, std::vector<MutableByteSpan>& dst,
                    std::chrono::steady_clock::time_point deadline, DeviceMemory* device,
                    bool* late);
  // ReadMemory as a get's answer for one key: `result` its size or why not, `late` set when the
  // lease ran out first; a key with no memory replica is OBJECT_NOT_FOUND (disk's to serve).
  void ReadKey(const proto::GetReplicaResult& r, std::vector<MutableByteSpan>& dst,
               std::chrono::steady_clock::time_point deadline, DeviceMemory* device,
               Result<uint64_t>& result, char& late);
  // ReadMemory for many keys into device memory: each of the pool's threads starts the device's
  // copies of its share from replicas on this host, hashing their bytes meanwhile, and waits
  // for the device once; the lease, the token and the checksum are checked only after that
  // wait. A key this cannot serve so (no replica here, host destinations, a failed check) goes
  // through ReadMemory. `reading` holds positions in `todo`; results and late as GetCore's.
  void ReadMemoryToDevice(const proto::BatchGetReplicaListResponse& replicas,
                          const std::vector<size_t>& todo, const std::vector<size_t>& reading,
                          std::vector<std::vector<MutableByteSpan>>& dst,
                          std::chrono::steady_clock::time_point deadline, DeviceMemory& device,
                          std::vector<Result<uint64_t>>& results, std::vector<char>& late);
  // A get whose every key has a live cache entry: each read from its replicas with no master
  // call (any key without one: nothing done here). Keys served leave `todo`; a key whose cached
  // read failed stays, its entry dropped and its destination already asked (has_dst, dst,
  // dst_size): if the master then names an object of another size, that key is LEASE_EXPIRED.
  void GetCached(const std::vector<std::string>& keys,
                 const std::function<Result<std::vector<MutableByteSpan>>(size_t, uint64_t)>& destination,
                 DeviceMemory* device, std::vector<size_t>& todo,
                 std::vector<Result<uint64_t>>& results,
                 std::vector<std::vector<MutableByteSpan>>& dst, std::vector<uint64_t>& dst_size,
                 std::vector<bool>& has_dst);
  template <typename T>
  static std::vector<Result<T>> FillResult(size_t n, const Status& s) {
    return std::vector<Result<T>>(n, Result<T>(s));
  }
  static std::vector<std::vector<ByteSpan>> AsParts(const std::vector<ByteSpan>& values, size_t n) {
    std::vector<std::vector<ByteSpan>> parts;
    if (values.size() != n) return parts;
    parts.reserve(n);
    for (const auto& v : values) parts.push_back({v});
    return parts;
  }
  static std::vector<Status> Statuses(const Status& call, const proto::BatchStatusResponse& resp,
                                      size_t n) {
    if (!call.ok()) return Fill(n, call);
    if (resp.results_size() != static_cast<int>(n)) return Fill(n, Malformed());
    std::vector<Status> out;
    out.reserve(n);
    for (const auto& r : resp.results()) out.push_back(rpc::FromCode(r.code(), r.message()));
    return out;
  }

  // With `device`, parts it Holds are device memory (BatchPutFromDevice).
  std::vector<Status> PutCore(const std::vector<std::string>& keys,
                              const std::vector<std::vector<ByteSpan>>& parts,
                              const ReplicateConfig& config, bool upsert,
                              DeviceMemory* device = nullptr);
  // PutCore less the cache's bookkeeping.
  std::vector<Status> PutOnce(const std::vector<std::string>& keys,
                              const std::vector<std::vector<ByteSpan>>& parts,
                              const ReplicateConfig& config, bool upsert, DeviceMemory* device);
  // Puts into space reserved ahead: one copy and one commit call. The keys it did not settle
  // are left in `rest`: all of them unless a reservation was ready for every key (a batch is
  // never split between the two ways before its writes), or those whose reservation turned out
  // unusable.
  std::vector<Status> PutReserved(const std::vector<std::string>& keys,
                                  const std::vector<std::vector<ByteSpan>>& parts,
                                  const ReplicateConfig& config, bool upsert,
                                  std::vector<size_t>& rest, DeviceMemory* device);
  // The two-call put: PutStart (allocation), the copies, PutEnd.
  std::vector<Status> PutStartEnd(const std::vector<std::string>& keys,
                                  const std::vector<std::vector<ByteSpan>>& parts,
                                  const ReplicateConfig& config, bool upsert,
                                  DeviceMemory* device = nullptr);
  // With `device`, destination parts it Holds are device memory (BatchGetIntoDevice).
  std::vector<Result<uint64_t>> GetCore(
      const std::vector<std::string>& keys,
      const std::function<Result<std::vector<MutableByteSpan>>(size_t, uint64_t)>& destination,
      DeviceMemory* device = nullptr);
  // LoadFromDisk for destinations with device parts: those land in host buffers first.
  void LoadFromDiskToDevice(const std::vector<std::string>& names,
                            const proto::BatchGetReplicaListResponse& replicas,
                            const std::vector<size_t>& todo, const std::vector<size_t>& keys,
                            std::vector<std::vector<MutableByteSpan>>& dst,
                            std::vector<Result<uint64_t>>& results, DeviceMemory& device);
  // Reads keys (positions in todo, whose replica lists are in `replicas`) from disk replicas.
  void LoadFromDisk(const std::vector<std::string>& names,
                    const proto::BatchGetReplicaListResponse& replicas,
                    const std::vector<size_t>& todo, std::vector<size_t> keys,
                    std::vector<std::vector<MutableByteSpan>>& dst,
                    std::vector<Result<uint64_t>>& results);

  ClientOptions options_;
  std::string client_id_;
  std::string segment_name_;
  std::shared_ptr<client::MasterLocator> master_;  // the master, or the HA cluster's leader
  client::MasterLink link_;  // the hot calls: fast port or gRPC
  SegmentDirectory directory_;
  transfer::ShmMappingCache mappings_;
  transfer::TcpTransport tcp_;
  ThreadPool pool_;  // a batch's transfers; before io_, which splits large copies on it
  ReplicaIo io_;
  client::ReadReleaser releaser_;
  client::ReservationPool reservations_;
  std::atomic<uint64_t> reserved_puts_{0};
  client::LocationCache cache_;
  std::atomic<uint64_t> cached_gets_{0};  // gets served from cache_, no master call
  std::mutex close_mu_;
  std::unique_ptr<node::StorageNode> node_;
};

}  // namespace granary::client
