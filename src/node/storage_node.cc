#include "node/storage_node.h"

#include <algorithm>

#include <atomic>

#include <sys/resource.h>
#include <unistd.h>

#include "common/host.h"
#include "common/logging.h"
#include "proto/rpc_util.h"
#include "security/capability.h"
#include "transfer/shm_mapping.h"

namespace granary::node {
namespace {

// The segment's shared-memory object: "granary-<segment name>". A character a shm name may not
// hold (e.g. the ':' of Mooncake's "host:port" segment names) becomes '_', and then a hash of the
// real name is appended so that "a:1" and "a_1" still get distinct objects. Clients learn the
// name from the master (SegmentSpec.shm_name); nothing else derives it.
std::string ShmNameFor(const std::string& segment_name) {
  std::string out(ShmSegment::kNamePrefix);
  bool changed = false;
  uint64_t hash = 1469598103934665603ull;  // FNV-1a 64: stable across builds and runs
  for (char c : segment_name) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    const bool allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    out += allowed ? c : '_';
    changed |= !allowed;
  }
  if (changed) {
    static constexpr char kHex[] = "0123456789abcdef";
    out += '-';
    for (int shift = 60; shift >= 32; shift -= 4) out += kHex[(hash >> shift) & 0xf];
  }
  return out;
}

// Each data-plane connection is a descriptor: raise the soft RLIMIT_NOFILE (up to the hard limit)
// so the connection cap, not the default 1024, is what refuses clients.
void RaiseDescriptorLimit(uint64_t connections) {
  const rlim_t wanted = static_cast<rlim_t>(connections) + 1024;  // segment, disk, gRPC, logs
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur >= wanted) return;
  const rlim_t before = files.rlim_cur;
  files.rlim_cur = files.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, files.rlim_max);
  if (files.rlim_cur > before && setrlimit(RLIMIT_NOFILE, &files) == 0) {
    GLOG_INFO("raised the descriptor limit from {} to {} for {} data connections",
              static_cast<uint64_t>(before), static_cast<uint64_t>(files.rlim_cur), connections);
  }
  if (files.rlim_cur < wanted) {
    GLOG_WARN("descriptor limit {} (hard) is below the {} data connections allowed, plus margin",
              static_cast<uint64_t>(files.rlim_max), connections);
  }
}

}  // namespace

StorageNode::StorageNode(StorageNodeOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<StorageNode>> StorageNode::Start(StorageNodeOptions options) {
  if (options.segment_size == 0) {
    return Status(ErrorCode::INVALID_PARAMS, "segment size must be positive");
  }
  if (options.segment_name.empty()) {
    // hostname-pid-tag, then hostname-pid-tag-2, -3...: one process may embed several nodes
    // (clients). The tag is random per process start: a node with the same pid in another
    // container (same hostname, same pid) gets another name, so neither takes over the other's
    // segment; an explicit name stays stable across restarts, so a restarted node does.
    static std::atomic<uint32_t> nodes_in_process{0};
    const uint32_t n = ++nodes_in_process;
    options.segment_name = Hostname() + "-" + std::to_string(getpid()) + "-" + ProcessStartTag() +
                           (n == 1 ? "" : "-" + std::to_string(n));
  }
  if (options.advertise_host.empty()) {
    options.advertise_host =
        options.listen_host == "0.0.0.0" ? Hostname() : options.listen_host;
  }
  std::unique_ptr<StorageNode> node(new StorageNode(std::move(options)));
  const StorageNodeOptions& o = node->options_;
  node->client_id_ = UniqueProcessId("node");

  // Dead nodes' files first: their pages count as used in /dev/shm until unlinked.
  ShmSegment::ReclaimOrphans();
  node->last_reclaim_ = std::chrono::steady_clock::now();
  auto segment = ShmSegment::Create(ShmNameFor(o.segment_name), o.segment_size, o.prefault);
  if (!segment.ok()) return segment.status();
  node->segment_ = std::move(*segment);
  if (o.prefault) {
    node->populator_ = std::make_unique<SegmentPopulator>();
    node->populator_->Start(node->segment_->data(), node->segment_->size());
  }

  DataServer::Options server_options;
  server_options.host = o.listen_host;
  server_options.port = o.port;
  server_options.idle_timeout_ms = o.data_idle_timeout_ms;
  server_options.max_connections = o.data_max_connections;
  server_options.io_threads = o.data_io_threads;
  server_options.require_capabilities = !o.secret.empty();
  server_options.metrics = &node->metrics_;
  server_options.request_timeout_ms =
      static_cast<int>(std::clamp<int64_t>(o.data_request_timeout_ms, 1, 86'400'000));
  RaiseDescriptorLimit(o.data_max_connections);
  // Token 0 until the first mount: nothing is accepted before the master knows the segment.
  node->server_ = std::make_unique<DataServer>(node->segment_->data(), node->segment_->size(),
                                               0, server_options);
  if (Status s = node->server_->Start(); !s.ok()) return s;
  node->endpoint_ = o.advertise_host + ":" + std::to_string(node->server_->port());

  auto locator = client::MasterLocator::Create(o.master_address, o.cluster_id, o.rpc_timeout_ms,
                                               /*own_connection=*/false, o.secret, o.tls,
                                               o.etcd_credentials);
  if (!locator.ok()) return locator.status();
  node->master_ = std::move(*locator);
  if (!o.disk.store.dir.empty()) {
    auto tier = DiskTier::Open(o.disk, [n = node.get()] { return n->segment(); },
                               node->master_.get(), node->client_id_);
    if (!tier.ok()) return tier.status();
    node->disk_ = std::move(*tier);
    if (o.disk_shm_staging_bytes > 0) {
      ShmStaging::Options so;
      so.bytes = o.disk_shm_staging_bytes;
      so.slot_ttl_ms = static_cast<int>(std::clamp<int64_t>(o.disk_staging_ttl_ms, 1, 86'400'000));
      auto staging = ShmStaging::Create(ShmNameFor(o.segment_name) + "-stage", so);
      if (staging.ok()) {
        node->staging_ = std::move(*staging);
        node->server_->SetShmStaging(node->staging_.get());
      } else {
        GLOG_WARN("no shared-memory staging for same-host disk loads ({}): they go over TCP",
                  staging.status().ToString());
      }
    }
    node->server_->SetDiskReads(node->disk_->reads());
  }
  if (o.copy_interval_ms > 0) {  // made before the metrics read it, started once mounted
    ReplicaCopierOptions co;
    co.node_id = node->client_id_;
    co.interval_ms = o.copy_interval_ms;
    co.rpc_timeout_ms = o.rpc_timeout_ms;
    node->copier_ = std::make_unique<ReplicaCopier>(
        co, [n = node.get()] { return n->segment(); }, node->master_.get());
  }
  // Before the master knows the node: a port that cannot be bound fails the start cleanly.
  node->RegisterMetrics();
  if (o.http_port.has_value()) {
    if (Status s = node->StartHttp(); !s.ok()) return s;
  }
  Status mounted = node->Mount();
  if (!mounted.ok() && mounted.code() != ErrorCode::RPC_FAIL &&
      mounted.code() != ErrorCode::RPC_TIMEOUT) {
    return mounted;  // the master answered and said no: a real configuration error
  }
  if (!mounted.ok()) {
    GLOG_WARN("master {} unreachable ({}); will keep trying", o.master_address,
              mounted.ToString());
  }
  node->heartbeat_ = std::thread([n = node.get()] { n->HeartbeatLoop(); });
  if (node->disk_) node->disk_->Start();
  if (node->copier_) node->copier_->Start();
  GLOG_INFO("node {}: segment {} ({} bytes) served at {}", node->client_id_, o.segment_name,
            o.segment_size, node->endpoint_);
  return node;
}

StorageNode::~StorageNode() { Stop(); }

std::shared_ptr<ShmSegment> StorageNode::segment() const {
  std::lock_guard lock(segment_mu_);
  return segment_;
}

proto::SegmentSpec StorageNode::Spec() const {
  const std::shared_ptr<ShmSegment> segment = this->segment();
  proto::SegmentSpec spec;
  spec.set_name(options_.segment_name);
  spec.set_size(segment->size());
  spec.set_endpoint(endpoint_);
  spec.set_shm_name(segment->name());
  spec.set_host_id(HostId());
  spec.set_token(token_.load());
  {
    std::lock_guard lock(segment_mu_);
    spec.set_capability_key(capability_key_);
  }
  spec.set_capabilities_required(!options_.secret.empty());
  // Mount() sends only memory nobody was handed: new at start, renewed at every remount.
  spec.set_fresh(true);
  return spec;
}

Status StorageNode::Mount() {
  refused_as_drained_ = false;
  // A new token for every attempt, published before the master can hand out space under it:
  // the header first (same-host clients), then the data server (TCP clients).
  uint64_t token = 0;
  while (token == 0 || token == transfer::kShmRetiredToken || token == token_.load()) {
    token = RandomU64() | 1;  // never 0 ("no token") nor the retired mark
  }
  // Not mounted under the new token until the master says so (mounted() waits on this).
  mounted_ = false;
  token_ = token;
  std::shared_ptr<ShmSegment> segment = this->segment();
  if (offered_) {
    // The memory may have been handed out under an earlier token: fence it, then replace it.
    // Fence first: from here on no data-plane byte of an earlier mount moves (data_server.h).
    if (Status s = server_->SetMount(segment->data(), 0); !s.ok()) return s;
    populator_.reset();  // it would fault the retired pages back in
    auto renewed = segment->Renew();
    if (!renewed.ok()) {
      GLOG_ERROR("segment {} cannot get new memory for its remount: {}", options_.segment_name,
                 renewed.status().ToString());
      return renewed.status();  // refusing every request meanwhile; the next heartbeat retries
    }
    segment = std::move(*renewed);
    {
      std::lock_guard lock(segment_mu_);
      segment_ = segment;  // the retired file is unmapped once the disk tier lets it go too
    }
    offered_ = false;
    if (options_.prefault) {
      populator_ = std::make_unique<SegmentPopulator>();
      populator_->Start(segment->data(), segment->size());
    }
  }
  segment->PublishToken(token);
  const std::string capability_key = security::NewCapabilityKey();  // per mount, like the token
  {
    std::lock_guard lock(segment_mu_);
    capability_key_ = capability_key;
  }
  if (Status s = server_->SetMount(segment->data(), token, capability_key); !s.ok()) return s;
  Status found;
  auto target = master_->Current(
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.rpc_timeout_ms), &found);
  if (!target) return found;
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, options_.rpc_timeout_ms);
  proto::ReMountSegmentRequest req;
  req.set_client_id(client_id_);
  *req.add_segments() = Spec();
  proto::ReMountSegmentResponse resp;
  grpc::Status rpc_status = target->stub->ReMountSegment(&ctx, req, &resp);
  // Unless the master was unreachable, it may have mounted this memory (a timed-out reply) and
  // handed it out: the next mount then renews it first.
  if (rpc_status.error_code() != grpc::StatusCode::UNAVAILABLE) offered_ = true;
  Status called = rpc::FromGrpc(rpc_status, "mount");
  if (called.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_MODE ||
      rpc_status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      (called.ok() && !master_->NoteTerm(resp.term()))) {
    master_->Stale(target->generation);  // not the leader (any more): the next try looks again
    if (called.ok()) called = Status(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, "mount: a deposed leader");
  }
  if (!called.ok()) return called;
  if (resp.results_size() != 1) return Status(ErrorCode::INTERNAL_ERROR, "malformed mount reply");
  Status s = rpc::FromCode(resp.results(0).code(), resp.results(0).message());
  mounted_ = s.ok();
  // The segment's own answer (not the call's: an HA leader without its standby says the same).
  refused_as_drained_ = s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  if (s.ok() && disk_) {
    // The master may have lost (restart) or dropped (expiry) what the disk holds: tell it again.
    disk_->SetMountToken(token);
    if (Status r = disk_->RegisterInventory(); !r.ok()) {
      GLOG_WARN("disk inventory not registered: {}", r.ToString());
    }
  }
  return s;
}

void StorageNode::HeartbeatLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_interval_ms),
                 [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    if (options_.reclaim_interval_ms > 0 &&
        std::chrono::steady_clock::now() - last_reclaim_ >=
            std::chrono::milliseconds(options_.reclaim_interval_ms)) {
      ShmSegment::ReclaimOrphans();
      last_reclaim_ = std::chrono::steady_clock::now();
    }
    proto::PingRequest req;
    req.set_client_id(client_id_);
    proto::MountedSegment* mount = req.add_mounts();
    mount->set_name(options_.segment_name);
    mount->set_token(token_.load());
    if (disk_) disk_->FillStats(req.mutable_disk());
    proto::PingResponse resp;
    Status pinged = master_->Call(&proto::Master::Stub::Ping, req, &resp, "ping",
                                  /*idempotent=*/true, options_.rpc_timeout_ms);
    if (!pinged.ok()) {
      if (mounted_.exchange(false)) GLOG_WARN("master unreachable: {}", pinged.ToString());
    } else if (resp.status() == proto::PingResponse::NEED_REMOUNT &&
               std::chrono::steady_clock::now() < drained_retry_at_) {
      // Drained (granary drain): the name is refused until undrained; each attempt renews the
      // segment's memory, so ask again only now and then.
    } else if (resp.status() == proto::PingResponse::NEED_REMOUNT) {
      Status s = Mount();
      if (s.ok()) {
        GLOG_INFO("segment {} remounted (new token, new memory)", options_.segment_name);
        drained_retry_at_ = {};
      } else if (refused_as_drained_) {
        if (drained_retry_at_ == std::chrono::steady_clock::time_point{}) {
          GLOG_WARN("segment {} is drained; asking again every {} s: {}", options_.segment_name,
                    kDrainedRetry.count(), s.ToString());
        }
        drained_retry_at_ = std::chrono::steady_clock::now() + kDrainedRetry;
      } else {
        GLOG_WARN("remount of {} failed: {}", options_.segment_name, s.ToString());
      }
    } else if (!mounted_.exchange(true)) {
      // Reachable again and the master still holds our mount under our token: nothing to redo.
      GLOG_INFO("master reachable again; segment {} still mounted", options_.segment_name);
    }
    lock.lock();
  }
}

void StorageNode::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (copier_) copier_->Stop();
  if (http_) http_->Stop();  // /health says 503 from now on anyway: stopping_ is set
  if (disk_) disk_->Stop();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (master_ && mounted_) {
    proto::UnmountSegmentRequest req;
    req.set_client_id(client_id_);
    req.set_name(options_.segment_name);
    proto::UnmountSegmentResponse resp;
    Status s = master_->Call(&proto::Master::Stub::UnmountSegment, req, &resp, "unmount",
                             /*idempotent=*/false, 2000);
    if (!s.ok() || resp.code() != 0) {
      GLOG_WARN("unmount of {} failed: {} {}", options_.segment_name, s.ToString(), resp.message());
    }
    mounted_ = false;
  }
  if (server_) server_->Stop();
  populator_.reset();
  std::lock_guard lock(segment_mu_);
  // A client on this host may still hold the memory mapped, and a cached location in it
  // (client/location_cache.h): the retired token makes its next copy ask the master instead.
  if (segment_ && !segment_->retired()) segment_->Retire();
  segment_.reset();  // unlinks the shm
}

}  // namespace granary::node
