// The Client implementation: the two-phase protocol of DESIGN.md over gRPC (metadata) and
// ReplicaIo (bytes).
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
#include "client/master_locator.h"
#include "client/read_releaser.h"
#include "client/replica_io.h"
#include "client/replica_admin.h"
#include "client/reservation_pool.h"
#include "client/segment_directory.h"
#include "common/checksum.h"
#include "common/host.h"
#include "common/thread_pool.h"
#include "granary/proto/master.grpc.pb.h"
#include "node/storage_node.h"
#include "proto/rpc_util.h"
#include "security/secret.h"
#include "security/tls.h"

namespace granary {
namespace {

using client::ReplicaIo;
using client::SegmentDirectory;

uint64_t TotalSize(const auto& parts) {
  uint64_t total = 0;
  for (const auto& p : parts) total += p.size();
  return total;
}

proto::ReplicateConfig ToProto(const ReplicateConfig& c) {
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
                                    : client::MasterLink::Path::kGrpc),
        directory_(master_.get(), HostId(), options.rpc_timeout_ms),
        tcp_(TcpOptions(options)),
        pool_(options.io_threads),
        io_(&directory_, &mappings_, &tcp_, options.use_shared_memory,
            options.warm_shared_memory, &pool_),
        releaser_(&link_, client_id_),
        reservations_(&link_, client_id_, options.reserve_bytes) {}

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
    Status s = master_->Call(&proto::Master::Stub::BatchRemove, req, &resp, "remove",
                              /*idempotent=*/false);
    return Statuses(s, resp, keys.size());
  }
  Result<uint64_t> RemoveByRegex(const std::string& pattern, bool force) override {
    releaser_.Flush();
    proto::RegexRequest req;
    req.set_pattern(pattern);
    req.set_force(force);
    proto::RemoveCountResponse resp;
    Status s = master_->Call(&proto::Master::Stub::RemoveByRegex, req, &resp, "remove by regex",
                              /*idempotent=*/false);
    if (!s.ok()) return s;
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
    Status s = master_->Call(&proto::Master::Stub::RemoveAll, req, &resp, "remove all",
                              /*idempotent=*/false);
    if (!s.ok()) return s;
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
    return t;
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
  // Puts into space reserved ahead: one copy and one commit call. The keys it did not settle
  // (no reservation ready, or the reservation turned out unusable) are left in `rest`.
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
  std::mutex close_mu_;
  std::unique_ptr<node::StorageNode> node_;
};

std::vector<Status> ClientImpl::PutCore(const std::vector<std::string>& keys,
                                        const std::vector<std::vector<ByteSpan>>& parts,
                                        const ReplicateConfig& config, bool upsert,
                                        DeviceMemory* device) {
  const size_t n = keys.size();
  if (parts.size() != n) return Fill(n, Mismatch("values"));
  if (n == 0) return {};
  if (static_cast<uint8_t>(config.persistence) > static_cast<uint8_t>(Persistence::kNone)) {
    return Fill(n, Status(ErrorCode::INVALID_PARAMS, "persistence is none of the enum's values"));
  }
  if (config.replica_num > 1 || !config.preferred_segments.empty()) {
    return PutStartEnd(keys, parts, config, upsert, device);
  }
  std::vector<size_t> rest;
  std::vector<Status> results = PutReserved(keys, parts, config, upsert, rest, device);
  if (rest.size() == n) return PutStartEnd(keys, parts, config, upsert, device);
  if (rest.empty()) return results;
  std::vector<std::string> rest_keys;
  std::vector<std::vector<ByteSpan>> rest_parts;
  for (size_t i : rest) {
    rest_keys.push_back(keys[i]);
    rest_parts.push_back(parts[i]);
  }
  std::vector<Status> settled = PutStartEnd(rest_keys, rest_parts, config, upsert, device);
  for (size_t k = 0; k < rest.size(); ++k) results[rest[k]] = std::move(settled[k]);
  return results;
}

std::vector<Status> ClientImpl::PutReserved(const std::vector<std::string>& keys,
                                            const std::vector<std::vector<ByteSpan>>& parts,
                                            const ReplicateConfig& config, bool upsert,
                                            std::vector<size_t>& rest, DeviceMemory* device) {
  using Held = client::ReservationPool::Held;
  const size_t n = keys.size();
  std::vector<Status> results(n);
  std::vector<std::optional<Held>> held(n);
  std::vector<size_t> taken;
  // A key repeated in the batch: the first occurrence wins, so one after an occurrence left to
  // the two-call way goes that way too (committed here, it would settle first).
  std::unordered_set<std::string_view> left;
  for (size_t i = 0; i < n; ++i) {
    if (!left.contains(keys[i])) held[i] = reservations_.Take(TotalSize(parts[i]));
    if (!held[i]) left.insert(keys[i]);
    if (held[i]) {
      taken.push_back(i);
    } else {
      rest.push_back(i);
    }
  }
  if (taken.empty()) return results;
  std::vector<ChecksumStream> hashes(taken.size());
  std::vector<Status> wrote(taken.size());
  std::vector<char> late(taken.size(), 0);  // not written: past its hand-out time when its turn came
  auto write = [&](size_t k) {
    // The lease is checked before each copy, not once per batch: a long batch's last copies
    // would otherwise start into reservations near the end of their lease.
    if (client::ReservationPool::Clock::now() >= held[taken[k]]->good_until) {
      late[k] = 1;
      return;
    }
    // The object may be up to 1/8 smaller than its reservation (ReservationPool::ClassOf): it
    // is written at the reservation's start, and the commit trims the rest.
    proto::Replica replica = held[taken[k]]->replica;
    replica.set_length(TotalSize(parts[taken[k]]));
    wrote[k] = io_.Write(replica, parts[taken[k]], &hashes[k], device);
  };
  if (taken.size() == 1) {
    write(0);  // no hand-off to a worker for the common single put
  } else {
    pool_.ParallelFor(taken.size(), write);
  }
  proto::BatchPutCommitRequest commit;
  commit.set_client_id(client_id_);
  commit.set_upsert(upsert);
  *commit.mutable_config() = ToProto(config);
  std::vector<size_t> committing;
  for (size_t k = 0; k < taken.size(); ++k) {
    const size_t i = taken[k];
    if (late[k]) {  // never written: the pool releases it as stale
      reservations_.Return(std::move(*held[i]));
      rest.push_back(i);
      continue;
    }
    // A failed write may still have bytes on their way: the reservation is left to expire (the
    // master quarantines it then) and the key goes the two-call way.
    if (!wrote[k].ok()) {
      rest.push_back(i);
      continue;
    }
    commit.add_keys(keys[i]);
    commit.add_reservations(held[i]->name);
    commit.add_sizes(TotalSize(parts[i]));
    commit.add_checksums(hashes[k].Digest());
    commit.add_segment_ids(held[i]->replica.segment_id());
    commit.add_offsets(held[i]->replica.offset());
    committing.push_back(i);
  }
  if (!committing.empty()) {
    proto::BatchStatusResponse resp;
    Status s = link_.PutCommit(commit, &resp);
    // Unknown outcome: each key may be committed in its reservation, which must then never be
    // written again; so the reservations are dropped and the keys report the call's error.
    std::vector<Status> statuses = Statuses(s, resp, committing.size());
    for (size_t j = 0; j < committing.size(); ++j) {
      const size_t i = committing[j];
      const Status& st = statuses[j];
      if (st.ok()) {
        reserved_puts_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (!s.ok() || resp.results_size() != static_cast<int>(committing.size())) {
        results[i] = st;
        continue;
      }
      switch (st.code()) {
        case ErrorCode::INVALID_PARAMS:
          // A master older than the trim at commit refuses a smaller object, in these words.
          if (TotalSize(parts[i]) < held[i]->replica.length() &&
              st.message().find("is not the reservation's") != std::string::npos) {
            // Refused before anything was written there: still ours, for an exact-size put.
            reservations_.ExactSizesOnly();
            reservations_.Return(std::move(*held[i]));
          }
          [[fallthrough]];
        case ErrorCode::INVALID_WRITE:   // not held (any more): expired, or its segment went
        case ErrorCode::ILLEGAL_CLIENT:
        case ErrorCode::LEASE_EXPIRED:
          rest.push_back(i);
          break;
        default:  // refused for the key's own reason: the reservation is still ours, unused
          reservations_.Return(std::move(*held[i]));
          results[i] = st.code() == ErrorCode::OBJECT_ALREADY_EXISTS && !upsert ? Status::Ok() : st;
      }
    }
  }
  std::sort(rest.begin(), rest.end());
  return results;
}

std::vector<Status> ClientImpl::PutStartEnd(const std::vector<std::string>& keys,
                                            const std::vector<std::vector<ByteSpan>>& parts,
                                            const ReplicateConfig& config, bool upsert,
                                            DeviceMemory* device) {
  const size_t n = keys.size();
  proto::BatchPutStartRequest start;
  start.set_client_id(client_id_);
  start.set_upsert(upsert);
  *start.mutable_config() = ToProto(config);
  for (size_t i = 0; i < n; ++i) {
    start.add_keys(keys[i]);
    start.add_sizes(TotalSize(parts[i]));
  }
  proto::BatchPutStartResponse started;
  Status s = link_.PutStart(start, &started);
  if (!s.ok()) return Fill(n, s);
  if (started.results_size() != static_cast<int>(n)) return Fill(n, Malformed());

  std::vector<Status> results(n);
  std::vector<size_t> writing;  // keys whose bytes this call writes
  std::vector<std::pair<size_t, int>> transfers;  // (key, replica)
  for (size_t i = 0; i < n; ++i) {
    const auto& r = started.results(static_cast<int>(i));
    if (r.code() == static_cast<int32_t>(ErrorCode::OBJECT_ALREADY_EXISTS) && !upsert) {
      continue;  // write-once: the stored value stays, and that is success
    }
    results[i] = rpc::FromCode(r.code(), r.message());
    if (!results[i].ok()) continue;
    writing.push_back(i);
    for (int j = 0; j < r.replicas_size(); ++j) transfers.emplace_back(i, j);
  }
  if (writing.empty()) return results;

  // The first replica of each key is written with its checksum computed on the way; a key with
  // no first transfer (cannot happen: start gave >= 1 replica) would keep checksum 0.
  std::vector<ChecksumStream> hashes(n);
  std::vector<Status> transfer_status(transfers.size());
  pool_.ParallelFor(transfers.size(), [&](size_t t) {
    auto [i, j] = transfers[t];
    transfer_status[t] = io_.Write(started.results(static_cast<int>(i)).replicas(j), parts[i],
                                   j == 0 ? &hashes[i] : nullptr, device);
  });
  std::vector<uint64_t> checksums(n);
  for (size_t i : writing) checksums[i] = hashes[i].Digest();
  for (size_t t = 0; t < transfers.size(); ++t) {
    size_t i = transfers[t].first;
    if (!transfer_status[t].ok() && results[i].ok()) results[i] = transfer_status[t];
  }

  proto::BatchPutEndRequest end;
  proto::BatchPutRevokeRequest revoke;
  end.set_client_id(client_id_);
  revoke.set_client_id(client_id_);
  // Every revoke here follows a failed transfer: the master quarantines that space.
  revoke.set_after_transfer_error(true);
  std::vector<size_t> ended;
  for (size_t i : writing) {
    const uint64_t gen = started.results(static_cast<int>(i)).put_gen();
    if (results[i].ok()) {
      end.add_keys(keys[i]);
      end.add_checksums(checksums[i]);
      end.add_put_gens(gen);
      ended.push_back(i);
    } else {
      revoke.add_keys(keys[i]);
      revoke.add_put_gens(gen);
    }
  }
  if (revoke.keys_size() > 0) {
    proto::BatchStatusResponse ignored;  // on failure the master's discard timeout cleans up
    (void)link_.PutRevoke(revoke, &ignored);
  }
  if (!ended.empty()) {
    proto::BatchStatusResponse resp;
    Status e = link_.PutEnd(end, &resp);
    std::vector<Status> statuses = Statuses(e, resp, ended.size());
    for (size_t k = 0; k < ended.size(); ++k) {
      // Another put of the key took this one over (this client again, or a writer after the
      // discard timeout): write-once, as "already exists" at the start.
      const bool taken_over = statuses[k].code() == ErrorCode::ILLEGAL_CLIENT && !upsert;
      results[ended[k]] = taken_over ? Status::Ok() : statuses[k];
    }
  }
  return results;
}

// Reads under the master's read leases. A lease lasts lease_ttl_ms from when the master granted
// it, which is after this call sent its request, so the deadline is counted from just before the
// request, less a safety margin. A copy that ends after the deadline may have read space the
// master has since freed and handed out again: its bytes are abandoned, never returned, even with
// a matching checksum. Such keys are tried once more under a fresh lease (same buffers: the
// destination callback is asked once per key); a second miss of the deadline is LEASE_EXPIRED.
std::vector<Result<uint64_t>> ClientImpl::GetCore(
    const std::vector<std::string>& keys,
    const std::function<Result<std::vector<MutableByteSpan>>(size_t, uint64_t)>& destination,
    DeviceMemory* device) {
  using Clock = std::chrono::steady_clock;
  const size_t n = keys.size();
  if (n == 0) return {};
  std::vector<Result<uint64_t>> results(n, Result<uint64_t>(Status(ErrorCode::INTERNAL_ERROR, "")));
  std::vector<std::vector<MutableByteSpan>> dst(n);
  std::vector<uint64_t> dst_size(n, 0);
  std::vector<bool> has_dst(n, false);
  std::vector<size_t> todo(n);  // indices into keys still to read
  for (size_t i = 0; i < n; ++i) todo[i] = i;

  constexpr int kAttempts = 2;
  for (int attempt = 0; attempt < kAttempts && !todo.empty(); ++attempt) {
    proto::BatchGetReplicaListRequest req;
    req.set_client_id(client_id_);
    for (size_t i : todo) req.add_keys(keys[i]);
    proto::BatchGetReplicaListResponse replicas;
    const Clock::time_point sent = Clock::now();
    Status s = link_.GetReplicaList(req, &replicas);
    if (!s.ok() || replicas.results_size() != static_cast<int>(todo.size())) {
      for (size_t i : todo) results[i] = s.ok() ? Status(Malformed()) : s;
      break;
    }
    // 0 (a master that does not say) leaves the reads unbounded, as before leases were known.
    const int64_t ttl = static_cast<int64_t>(
        std::min<uint64_t>(replicas.lease_ttl_ms(), uint64_t{1} << 40));
    const int64_t margin = std::max<int64_t>(ttl / 10, std::min<int64_t>(100, ttl / 2));
    const Clock::time_point deadline =
        ttl > 0 ? sent + std::chrono::milliseconds(ttl - margin) : Clock::time_point::max();

    std::vector<size_t> reading;      // positions in todo
    std::vector<std::string> locked;  // released in the background once read (ReadReleaser)
    for (size_t k = 0; k < todo.size(); ++k) {
      const size_t i = todo[k];
      const auto& r = replicas.results(static_cast<int>(k));
      if (r.code() != 0) {
        results[i] = rpc::FromCode(r.code(), r.message());
        continue;
      }
      locked.push_back(keys[i]);  // locked: must be released whatever happens next
      if (has_dst[i]) {  // a retry: the buffers were sized for the first attempt's object
        if (r.size() != dst_size[i]) {
          results[i] = Status(ErrorCode::LEASE_EXPIRED,
                              "read lease of '" + keys[i] + "' expired mid-copy and the object " +
                                  "changed size before the retry");
          continue;
        }
        reading.push_back(k);
        continue;
      }
      Result<std::vector<MutableByteSpan>> d = Status(ErrorCode::INTERNAL_ERROR, "");
      try {  // a caller's BufferProvider may throw: that key fails, the locks are still released
        d = destination(i, r.size());
      } catch (const std::exception& e) {
        d = Status(ErrorCode::INTERNAL_ERROR, std::string("buffer provider failed: ") + e.what());
      } catch (...) {
        d = Status(ErrorCode::INTERNAL_ERROR, "buffer provider failed");
      }
      if (!d.ok()) {
        results[i] = d.status();
        continue;
      }
      dst[i] = std::move(*d);
      dst_size[i] = r.size();
      has_dst[i] = true;
      reading.push_back(k);
    }

    std::vector<char> late(todo.size(), 0);
    pool_.ParallelFor(reading.size(), [&](size_t x) {
      const size_t k = reading[x];
      const size_t i = todo[k];
      const auto& r = replicas.results(static_cast<int>(k));
      if (r.replicas_size() == 0) {
        results[i] = Status(ErrorCode::OBJECT_NOT_FOUND, "no memory replica");
        return;  // on disk only: LoadFromDisk below
      }
      // Local replicas first: a memcpy beats any socket.
      std::vector<int> order(r.replicas_size());
      for (int j = 0; j < r.replicas_size(); ++j) order[j] = j;
      if (order.size() > 1) {
        std::stable_partition(order.begin(), order.end(),
                              [&](int j) { return io_.IsLocal(r.replicas(j)); });
      }
      Status last(ErrorCode::OBJECT_NOT_FOUND, "no replica");
      for (int j : order) {
        if (Clock::now() >= deadline) {
          late[k] = 1;
          return;
        }
        auto got = io_.Read(r.replicas(j), dst[i], device);
        if (Clock::now() >= deadline) {  // whatever was read, the lease no longer covered it
          late[k] = 1;
          return;
        }
        if (!got.ok()) {
          last = got.status();
          continue;
        }
        if (*got != r.checksum()) {
          last = Status(ErrorCode::CHECKSUM_MISMATCH,
                        "replica on " + r.replicas(j).segment_name() + " failed its checksum");
          continue;
        }
        results[i] = r.size();
        return;
      }
      results[i] = last;
    });
    // Whatever memory did not give (no memory replica, or every one failed) comes from disk.
    std::vector<size_t> from_disk;  // positions in todo
    for (size_t k : reading) {
      const size_t i = todo[k];
      if (!late[k] && !results[i].ok() &&
          replicas.results(static_cast<int>(k)).disk_replicas_size() > 0) {
        from_disk.push_back(k);
      }
    }
    if (!from_disk.empty()) {
      if (device != nullptr) {
        LoadFromDiskToDevice(keys, replicas, todo, from_disk, dst, results, *device);
      } else {
        LoadFromDisk(keys, replicas, todo, from_disk, dst, results);
      }
    }
    releaser_.Add(std::move(locked));

    std::vector<size_t> retry;
    for (size_t k = 0; k < todo.size(); ++k) {
      if (!late[k]) continue;
      const size_t i = todo[k];
      results[i] = Status(ErrorCode::LEASE_EXPIRED,
                          "read lease of '" + keys[i] + "' (" + std::to_string(ttl) +
                              " ms) expired before its copy finished; the bytes were discarded");
      retry.push_back(i);
    }
    todo = std::move(retry);
  }
  return results;
}

// Disk loads: one DISK_READ batch per node, the nodes in parallel; a key whose copy fails on
// one node tries its next disk replica in the following pass. The master's read lock guards
// memory only; a disk copy is guarded by the node (it serves exactly the copy named, or nothing).
void ClientImpl::LoadFromDiskToDevice(const std::vector<std::string>& names,
                                      const proto::BatchGetReplicaListResponse& replicas,
                                      const std::vector<size_t>& todo,
                                      const std::vector<size_t>& keys,
                                      std::vector<std::vector<MutableByteSpan>>& dst,
                                      std::vector<Result<uint64_t>>& results,
                                      DeviceMemory& device) {
  std::vector<std::vector<MutableByteSpan>> host = dst;
  std::deque<std::vector<std::byte>> bounce;
  for (size_t k : keys) {
    for (auto& part : host[todo[k]]) {
      if (!part.empty() && device.Holds(part.data(), part.size())) {
        part = MutableByteSpan(bounce.emplace_back(part.size()).data(), part.size());
      }
    }
  }
  LoadFromDisk(names, replicas, todo, keys, host, results);
  for (size_t k : keys) {
    const size_t i = todo[k];
    if (!results[i].ok()) continue;
    Status copied;
    for (size_t j = 0; j < dst[i].size() && copied.ok(); ++j) {
      if (host[i][j].data() != dst[i][j].data()) {
        copied = device.CopyIn(dst[i][j].data(), host[i][j].data(), host[i][j].size());
      }
    }
    Status waited = device.Wait();
    if (!copied.ok() || !waited.ok()) results[i] = !copied.ok() ? copied : waited;
  }
}

void ClientImpl::LoadFromDisk(const std::vector<std::string>& names,
                              const proto::BatchGetReplicaListResponse& replicas,
                              const std::vector<size_t>& todo, std::vector<size_t> keys,
                              std::vector<std::vector<MutableByteSpan>>& dst,
                              std::vector<Result<uint64_t>>& results) {
  std::vector<int> next_replica(keys.size(), 0);
  std::vector<int> busy(keys.size(), 0);  // times the node's staging memory was busy
  for (int pass = 0; pass < 8 && !keys.empty(); ++pass) {
    std::map<std::string, std::vector<size_t>> by_node;  // endpoint -> positions in keys
    std::map<std::string, std::string> node_of;          // endpoint -> node id
    for (size_t x = 0; x < keys.size(); ++x) {
      const auto& r = replicas.results(static_cast<int>(keys[x]));
      while (next_replica[x] < r.disk_replicas_size() &&
             r.disk_replicas(next_replica[x]).endpoint().empty()) {
        ++next_replica[x];
      }
      if (next_replica[x] < r.disk_replicas_size()) {
        const auto& d = r.disk_replicas(next_replica[x]);
        by_node[d.endpoint()].push_back(x);
        node_of.emplace(d.endpoint(), d.node_id());
      }
    }
    if (by_node.empty()) break;
    std::vector<std::pair<std::string, std::vector<size_t>>> nodes(by_node.begin(), by_node.end());
    pool_.ParallelFor(nodes.size(), [&](size_t g) {
      const auto& [endpoint, members] = nodes[g];
      // A node on this host stages into shared memory (the same host test as memory replicas).
      const bool same_host =
          options_.use_shared_memory && directory_.NodeIsLocal(node_of.at(endpoint));
      std::vector<transfer::DiskReadItem> items;
      items.reserve(members.size());
      for (size_t x : members) {
        const size_t k = keys[x];
        const auto& r = replicas.results(static_cast<int>(k));
        const auto& d = r.disk_replicas(next_replica[x]);
        items.push_back({d.stored_key().empty() ? names[todo[k]] : d.stored_key(), d.location(),
                         r.checksum(), r.size(),
                         {dst[todo[k]].begin(), dst[todo[k]].end()}});
      }
      std::vector<Status> got = io_.ReadDisk(endpoint, items, same_host);
      for (size_t m = 0; m < members.size(); ++m) {
        const size_t i = todo[keys[members[m]]];
        if (got[m].ok()) {
          results[i] = replicas.results(static_cast<int>(keys[members[m]])).size();
        } else {
          results[i] = got[m];
        }
      }
    });
    std::vector<size_t> again;
    std::vector<int> again_next, again_busy;
    bool wait = false;
    for (size_t x = 0; x < keys.size(); ++x) {
      const Result<uint64_t>& r = results[todo[keys[x]]];
      if (r.ok()) continue;
      // A busy node (staging budget) is asked again a little later, twice; anything else moves
      // on to the next disk replica.
      const bool retry_here = r.status().code() == ErrorCode::NO_AVAILABLE_HANDLE && busy[x] < 2;
      wait |= retry_here;
      again.push_back(keys[x]);
      again_next.push_back(next_replica[x] + (retry_here ? 0 : 1));
      again_busy.push_back(busy[x] + (retry_here ? 1 : 0));
    }
    keys = std::move(again);
    next_replica = std::move(again_next);
    busy = std::move(again_busy);
    if (wait) std::this_thread::sleep_for(std::chrono::milliseconds(50 << std::min(pass, 3)));
  }
}

}  // namespace

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.master_address.empty()) {
    return Status(ErrorCode::INVALID_PARAMS, "master address is empty");
  }
  auto secret = security::LoadClientSecret(options.auth_token_file);
  if (!secret.ok()) return secret.status();
  auto tls = security::LoadClientTls(
      {options.tls_cert_file, options.tls_key_file, options.tls_ca_file});
  if (!tls.ok()) return tls.status();
  auto etcd_user = security::LoadClientEtcdAuth(options.etcd_auth_file);
  if (!etcd_user.ok()) return etcd_user.status();
  auto locator = client::MasterLocator::Create(options.master_address, options.cluster_id,
                                               options.rpc_timeout_ms, false, *secret, *tls,
                                               {etcd_user->user, etcd_user->password});
  if (!locator.ok()) return locator.status();
  auto client = std::make_unique<ClientImpl>(options, std::move(*locator));
  if (Status s = client->Init(); !s.ok()) return s;
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace granary
