#include "master/service/master_service.h"
#include "master/service/rpc_results.h"
#include "proto/rpc_util.h"

#include <algorithm>

#include "common/clock.h"
#include "common/units.h"
#include "security/capability.h"

#include <chrono>
#include <optional>
#include <string_view>
#include <stdexcept>

namespace granary::master {

namespace {
const char* const kMethods[] = {
    "MountSegment",  "UnmountSegment",      "ReMountSegment",  "ListSegments", "Ping",
    "BatchPutStart", "BatchPutEnd",         "BatchPutRevoke",  "BatchGetReplicaList",
    "BatchFinishRead", "BatchExist",        "BatchGetSize",    "BatchPrefixMatch",
    "StatObject",    "BatchRemove",         "RemoveByRegex",   "QueryByRegex", "RemoveAll",
    "DiskRegister",  "DiskDrop",            "OffloadStart",    "OffloadEnd", "PromoteEnd",
    "Reserve",       "BatchPutCommit",      "ReleaseReservations", "ClusterStatus",
    "Replicate",     "ReplicaCopyStart",    "ReplicaCopyEnd",  "Drain"};

SegmentSpec FromProto(const proto::SegmentSpec& s) {
  return {s.name(),    s.size(),  s.endpoint(),       s.shm_name(),
          s.host_id(), s.token(), s.fresh(),          s.capability_key(),
          s.capabilities_required()};
}

PlacementConfig ToPlacement(const proto::ReplicateConfig& c) {
  PlacementConfig p;
  p.replica_num = c.replica_num();
  p.with_soft_pin = c.with_soft_pin();
  p.with_hard_pin = c.with_hard_pin();
  p.preferred_segments.assign(c.preferred_segments().begin(), c.preferred_segments().end());
  p.soft_pin_ttl_ms = static_cast<int64_t>(std::min<uint64_t>(c.soft_pin_ttl_ms(), INT64_MAX));
  // Values past kNone (a newer client's, or junk) stay out of range: PutStart refuses them.
  const int raw = c.persistence();
  p.persistence = static_cast<PutPersistence>(raw >= 0 && raw <= 0xFF ? raw : 0xFF);
  return p;
}
}  // namespace

MasterService::MasterService(MasterState* state, Evictor* evictor, MetricsRegistry* metrics,
                             OffloadPolicy offload, uint32_t promote_after)
    : state_(state), evictor_(evictor), registry_(metrics), planner_(state, offload),
      promotions_(promote_after), replicas_(state) {
  const std::vector<double> bounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                      0.01,   0.025,   0.05,   0.1,   0.5,    1.0};
  for (const char* method : kMethods) {
    Labels labels = {{"method", method}};
    RpcMetrics& m = rpc_metrics_[method];
    m.calls = registry_->AddCounter("granary_master_rpc_total", "RPCs served", labels);
    m.keys = registry_->AddCounter("granary_master_rpc_keys_total", "keys carried by RPCs", labels);
    m.key_errors = registry_->AddCounter("granary_master_rpc_key_errors_total",
                                         "keys answered with an error code", labels);
    m.seconds = registry_->AddHistogram("granary_master_rpc_seconds", "RPC service time", bounds,
                                        labels);
  }
  RegisterCacheMetrics();
}

void MasterService::RegisterCacheMetrics() {
  const char* outcomes[kGetOutcomes] = {"memory_hit", "disk_hit", "miss"};
  for (size_t o = 0; o < kGetOutcomes; ++o) {
    gets_[o] = registry_->AddCounter(
        "granary_master_gets_total",
        "keys answered by BatchGetReplicaList: with memory replicas, with disk replicas only, or "
        "not readable",
        {{"outcome", outcomes[o]}});
  }
  memory_hit_bytes_ = registry_->AddCounter("granary_master_get_hit_bytes_total",
                                            "object bytes of the hits, by the tier that served",
                                            {{"tier", "memory"}});
  disk_hit_bytes_ = registry_->AddCounter("granary_master_get_hit_bytes_total",
                                          "object bytes of the hits, by the tier that served",
                                          {{"tier", "disk"}});
  puts_ = registry_->AddCounter("granary_master_puts_total",
                                "keys whose put was started (BatchPutStart) or committed "
                                "(BatchPutCommit)");
  put_bytes_ = registry_->AddCounter("granary_master_put_bytes_total",
                                     "object bytes of those puts");
  // 0 (nothing cached) and the powers of two up to 4096 keys: an engine asks for its prefix.
  std::vector<double> key_bounds = {0};
  for (double b = 1; b <= 4096; b *= 2) key_bounds.push_back(b);
  prefix_match_keys_ = registry_->AddHistogram(
      "granary_master_prefix_match_keys", "leading keys found by one BatchPrefixMatch",
      std::move(key_bounds));
  allocation_evictions_ = registry_->AddCounter(
      "granary_master_evictions_total",
      "objects evicted from memory, by what started it: usage above the high watermark "
      "(housekeeping) or a put that found no space",
      {{"reason", "allocation"}});
  const char* help = "offloads of memory objects to a node's disk, by outcome";
  demotions_started_ = registry_->AddCounter("granary_master_demotions_total", help,
                                             {{"outcome", "started"}});
  demotions_completed_ = registry_->AddCounter("granary_master_demotions_total", help,
                                               {{"outcome", "completed"}});
  demotions_failed_ = registry_->AddCounter("granary_master_demotions_total", help,
                                            {{"outcome", "failed"}});
  demotions_aborted_ = registry_->AddCounter("granary_master_demotions_total", help,
                                             {{"outcome", "aborted"}});
}

void MasterService::CountPuts(const std::vector<Status>& statuses,
                              const std::vector<uint64_t>& sizes) {
  uint64_t keys = 0, bytes = 0;
  for (size_t i = 0; i < statuses.size() && i < sizes.size(); ++i) {
    if (!statuses[i].ok()) continue;
    ++keys;
    bytes += sizes[i];
  }
  puts_->Inc(keys);
  put_bytes_->Inc(bytes);
}

grpc::Status MasterService::Admission::refusal() const { return rpc::ToGrpc(entry_); }

std::string MasterService::HeldClient(const std::string& id, const Principal* who) const {
  if (id.empty() || !who->tenant_only()) return id;
  return HeldKey(PrefixOf(who), id);
}

template <typename Repeated>
std::vector<std::string> MasterService::HeldKeys(const Repeated& keys, const Principal* who) const {
  const std::string& prefix = PrefixOf(who);
  std::vector<std::string> held;
  held.reserve(static_cast<size_t>(keys.size()));
  for (const auto& key : keys) held.push_back(HeldKey(prefix, key));
  return held;
}

grpc::Status MasterService::Admission::Finish() {
  if (!gate_) return grpc::Status::OK;
  // Counted, not compared by seq: the state may have gone back to an earlier seq since this
  // thread's last call (a snapshot loaded), so the new operation can have that call's number.
  if (kind_ == CallKind::kUpdate && MasterState::AppliedOnThisThread() != applied_before_) {
    if (Status s = gate_->Commit(MasterState::LastSeqOnThisThread()); !s.ok()) {
      // The operation happened here: never answer with a refusal's code, which tells the client
      // that nothing was applied (it would send the call again to the next leader).
      if (s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_MODE ||
          s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS) {
        s = Status(ErrorCode::RPC_TIMEOUT, s.message());
      }
      return rpc::ToGrpc(s);
    }
  }
  set_term_(reply_, term_);
  return grpc::Status::OK;
}

MasterService::RpcMetrics& MasterService::Metrics(const char* method) {
  auto it = rpc_metrics_.find(std::string_view(method));
  if (it == rpc_metrics_.end()) throw std::out_of_range(method);  // a method missing from kMethods
  return it->second;
}

MasterService::CallScope::CallScope(RpcMetrics& m, size_t keys)
    : m_(m), start_(std::chrono::steady_clock::now()) {
  m_.calls->Inc();
  m_.keys->Inc(keys);
}

MasterService::CallScope::~CallScope() {
  if (errors_) m_.key_errors->Inc(errors_);
  m_.seconds->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
}

ReplicaAccess MasterService::AccessFor(const Principal* who, ReplicaAccess::Kind kind,
                                       int64_t ttl_ms) {
  const bool tenant = who != nullptr && who->role == Principal::Role::kTenant;
  // Deadlines are wall-clock: the node checks them against its own.
  return {tenant, kind, WallClock::Instance()->NowMs() + ttl_ms};
}

void MasterService::FillReplicas(const std::vector<Extent>& extents,
                                 google::protobuf::RepeatedPtrField<proto::Replica>* out,
                                 const ReplicaAccess& access) const {
  using Kind = ReplicaAccess::Kind;
  for (const auto& e : extents) {
    auto segment = state_->segments().Find(e.segment_id);
    if (!segment) continue;  // unmounted since: its bytes are gone, so is this replica
    const bool capability =
        access.kind != Kind::kNone && (access.tenant || segment->capabilities_required);
    if (access.tenant && access.kind != Kind::kNone && segment->signer == nullptr) {
      continue;  // an older node: its bytes cannot be granted without the whole segment
    }
    proto::Replica* r = out->Add();
    r->set_segment_id(e.segment_id);
    r->set_segment_name(segment->name);
    r->set_node_id(segment->client_id);
    r->set_endpoint(segment->endpoint);
    r->set_offset(e.offset);
    r->set_length(e.length);
    if (!access.tenant) r->set_token(segment->token);
    if (!capability || segment->signer == nullptr) continue;
    const security::CapabilityGrant grant{
        e.offset, e.length, access.expiry_unix_ms,
        access.kind == Kind::kWrite ? security::CapabilityAccess::kWrite
                                    : security::CapabilityAccess::kRead};
    const security::CapabilityMac mac = segment->signer->Sign(grant);
    proto::Capability* cap = r->mutable_capability();
    cap->set_grant_offset(grant.offset);
    cap->set_grant_length(grant.length);
    cap->set_expiry_unix_ms(grant.expiry_unix_ms);
    cap->set_access(static_cast<uint32_t>(grant.access));
    cap->set_mac(mac.data(), mac.size());
  }
}

void MasterService::FillDiskReplicas(
    const std::vector<DiskReplica>& disk,
    google::protobuf::RepeatedPtrField<proto::DiskReplica>* out, std::string_view held,
    std::string_view named) const {
  for (const auto& d : disk) {
    proto::DiskReplica* r = out->Add();
    if (held != named) r->set_stored_key(std::string(held));
    r->set_node_id(d.node_id);
    for (uint64_t id : state_->segments().SegmentsOf(d.node_id)) {
      if (auto segment = state_->segments().Find(id)) {
        r->set_endpoint(segment->endpoint);
        break;
      }
    }
    r->set_location(d.location);
    r->set_length(d.length);
  }
}

// ---- segments and liveness ----

grpc::Status MasterService::MountSegment(Ctx* ctx, const proto::MountSegmentRequest* req,
                                         proto::MountSegmentResponse* resp) {
  CallScope scope(Metrics("MountSegment"), 1);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (who->tenant_only()) return Deny(who, "MountSegment");
  MountResult r = state_->Mount({req->client_id(), FromProto(req->segment())});
  resp->set_code(Code(r.status));
  resp->set_message(r.status.message());
  resp->set_segment_id(r.segment_id);
  resp->set_view_version(state_->segments().view_version());
  scope.KeyErrors(!r.status.ok());
  return admission.Finish();
}

grpc::Status MasterService::UnmountSegment(Ctx* ctx, const proto::UnmountSegmentRequest* req,
                                           proto::UnmountSegmentResponse* resp) {
  CallScope scope(Metrics("UnmountSegment"), 1);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (who->tenant_only()) return Deny(who, "UnmountSegment");
  if (req->client_id().empty()) {  // an empty id is the master's own, never a caller's
    resp->set_code(Code(Status(ErrorCode::INVALID_PARAMS, "")));
    resp->set_message("client id is empty");
    return admission.Finish();
  }
  UnmountResult r = state_->Unmount({req->client_id(), req->name()});
  resp->set_code(Code(r.status));
  resp->set_message(r.status.message());
  resp->set_view_version(state_->segments().view_version());
  scope.KeyErrors(!r.status.ok());
  return admission.Finish();
}

grpc::Status MasterService::ReMountSegment(Ctx* ctx, const proto::ReMountSegmentRequest* req,
                                           proto::ReMountSegmentResponse* resp) {
  CallScope scope(Metrics("ReMountSegment"), req->segments_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (who->tenant_only()) return Deny(who, "ReMountSegment");
  if (req->client_id().empty()) {
    for (int i = 0; i < req->segments_size(); ++i) {
      SetStatus(Status(ErrorCode::INVALID_PARAMS, "client id is empty"), resp->add_results());
    }
    scope.KeyErrors(req->segments_size());
    return admission.Finish();
  }
  for (const auto& seg : req->segments()) {
    MountResult r = state_->Mount({req->client_id(), FromProto(seg)});
    SetStatus(r.status, resp->add_results());
    scope.KeyErrors(!r.status.ok());
  }
  if (req->segments_size() == 0) state_->Ping(req->client_id());
  resp->set_view_version(state_->segments().view_version());
  return admission.Finish();
}

grpc::Status MasterService::ListSegments(Ctx* ctx, const proto::ListSegmentsRequest*,
                                         proto::ListSegmentsResponse* resp) {
  CallScope scope(Metrics("ListSegments"), 0);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kQuery, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  const ReplicaPlanner::Stats replication = replicas_.GetStats();
  std::lock_guard disks_lock(disks_mu_);
  for (const auto& u : state_->segments().Usage()) {
    proto::SegmentInfo* info = resp->add_segments();
    info->set_draining(u.draining);
    if (auto p = replication.drains.find(u.identity->name); p != replication.drains.end()) {
      info->set_drain_remaining_objects(p->second.objects);
      info->set_drain_remaining_bytes(p->second.bytes);
    }
    info->set_segment_id(u.identity->id);
    info->set_name(u.identity->name);
    info->set_node_id(u.identity->client_id);
    info->set_endpoint(u.identity->endpoint);
    info->set_size(u.identity->size);
    info->set_used_bytes(u.stats.used_bytes);
    info->set_free_bytes(u.stats.free_bytes);
    info->set_largest_free_block(u.stats.largest_free_block);
    info->set_object_count(u.replica_count);
    // A tenant maps no segment (its memory holds every tenant's objects), so it is told no
    // shared-memory name, host or token here; its bytes move over TCP by its replicas' tokens.
    if (who->tenant_only()) continue;
    info->set_shm_name(u.identity->shm_name);
    info->set_host_id(u.identity->host_id);
    info->set_token(u.identity->token);
    if (auto d = disks_.find(u.identity->client_id); d != disks_.end()) {
      *info->mutable_node_disk() = d->second;
    }
  }
  resp->set_view_version(state_->segments().view_version());
  const uint16_t fast_port = fast_port_.load();
  resp->set_fast_port(fast_port);
  if (fast_port != 0) resp->set_fast_local_socket(fast_local_socket_);
  for (const auto& [name, mark] : state_->segments().Drains()) {
    proto::DrainInfo* d = resp->add_drains();
    d->set_name(name);
    d->set_drop(mark.drop);
    d->set_done(mark.done);
    d->set_start_unix_ms(mark.start_ms);
    if (auto p = replication.drains.find(name); p != replication.drains.end() && !mark.done) {
      d->set_remaining_objects(p->second.objects);
      d->set_remaining_bytes(p->second.bytes);
    }
  }
  resp->set_rereplication_backlog_objects(replication.backlog_objects);
  resp->set_rereplication_backlog_bytes(replication.backlog_bytes);
  resp->set_copies_in_flight(state_->copies_in_flight());
  return admission.Finish();
}

proto::DiskStats MasterService::DiskTotals() const {
  proto::DiskStats total;
  std::lock_guard lock(disks_mu_);
  for (const auto& [node, d] : disks_) {
    if (state_->segments().SegmentsOf(node).empty()) continue;  // gone (expired or unmounted)
    total.set_capacity_bytes(total.capacity_bytes() + d.capacity_bytes());
    total.set_used_bytes(total.used_bytes() + d.used_bytes());
    total.set_object_count(total.object_count() + d.object_count());
    total.set_promoted_objects(total.promoted_objects() + d.promoted_objects());
  }
  return total;
}

grpc::Status MasterService::Ping(Ctx* ctx, const proto::PingRequest* req, proto::PingResponse* resp) {
  CallScope scope(Metrics("Ping"), 0);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kSoft, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  // A node's ping reports its mounts (segments are for nodes, not tenants).
  if (who->tenant_only() && (req->mounts_size() > 0 || req->has_disk())) return Deny(who, "Ping");
  if (req->client_id().empty()) {
    resp->set_code(static_cast<int32_t>(ErrorCode::INVALID_PARAMS));
    return admission.Finish();
  }
  std::vector<MountRef> mounts;
  for (const auto& m : req->mounts()) mounts.push_back({m.name(), m.token()});
  PingResult r = state_->Ping(HeldClient(req->client_id(), who), std::move(mounts));
  if (req->has_disk()) {  // kept until replaced: shown only while the node has a segment
    std::lock_guard lock(disks_mu_);
    disks_[req->client_id()] = req->disk();
  }
  resp->set_code(0);
  resp->set_status(r.need_remount ? proto::PingResponse::NEED_REMOUNT : proto::PingResponse::OK);
  resp->set_view_version(state_->segments().view_version());
  return admission.Finish();
}

// ---- writes ----

grpc::Status MasterService::BatchPutStart(Ctx* ctx, const proto::BatchPutStartRequest* req,
                                          proto::BatchPutStartResponse* resp) {
  CallScope scope(Metrics("BatchPutStart"), req->keys_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  PutStartOp op{HeldClient(req->client_id(), who), HeldKeys(req->keys(), who),
                std::vector<uint64_t>(req->sizes().begin(), req->sizes().end()),
                ToPlacement(req->config()), req->upsert()};
  const ReplicaAccess access = AccessFor(who, ReplicaAccess::Kind::kWrite,
                                         state_->policy().put_release_timeout_ms);
  // A tenant with a quota checks and starts under its lock: two puts cannot both pass it.
  TenantRuntime* tenant = TenantOf(who);
  std::unique_lock<std::mutex> quota_lock;
  if (tenant && who->quota_bytes) quota_lock = std::unique_lock(tenant->quota_mu);
  std::vector<PutStartKeyResult> results;
  std::vector<bool> admitted;
  std::vector<Status> refused;
  FitQuota(who, tenant, op.sizes, &admitted, &refused);
  if (op.sizes.size() != op.keys.size() ||
      std::find(admitted.begin(), admitted.end(), false) == admitted.end()) {
    results = state_->PutStart(op);
  } else {
    PutStartOp fit{op.client_id, {}, {}, op.config, op.upsert};
    for (size_t i = 0; i < op.keys.size(); ++i) {
      if (!admitted[i]) continue;
      fit.keys.push_back(op.keys[i]);
      fit.sizes.push_back(op.sizes[i]);
    }
    std::vector<PutStartKeyResult> started;
    if (!fit.keys.empty()) started = state_->PutStart(std::move(fit));
    results.resize(op.keys.size());
    for (size_t i = 0, j = 0; i < op.keys.size(); ++i) {
      if (admitted[i]) {
        results[i] = std::move(started[j++]);
      } else {
        results[i].status = refused[i];
      }
    }
  }

  // A full store evicts now, once, and retries just the keys that found no space. A key larger
  // than every segment can never fit: evicting for it would empty the cache for nothing.
  std::vector<size_t> full;
  uint64_t needed = 0, largest_request = 0;
  const uint64_t largest = state_->segments().LargestCapacity();
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].status.code() != ErrorCode::NO_AVAILABLE_HANDLE) continue;
    if (OffsetAllocator::AllocationSize(op.sizes[i]) > largest) {
      results[i].status = Status(ErrorCode::NO_AVAILABLE_HANDLE,
                                 "object of " + std::to_string(op.sizes[i]) +
                                     " bytes is larger than every segment (largest " +
                                     std::to_string(largest) + ")");
      continue;
    }
    full.push_back(i);
    needed += OffsetAllocator::AllocationSize(op.sizes[i]);  // one replica each is enough to go on
    largest_request = std::max(largest_request, OffsetAllocator::AllocationSize(op.sizes[i]));
  }
  if (!full.empty()) {
    allocation_evictions_->Inc(evictor_->EvictForAllocation(needed, largest_request).objects);
    PutStartOp retry{op.client_id, {}, {}, op.config, op.upsert};
    for (size_t i : full) {
      retry.keys.push_back(op.keys[i]);
      retry.sizes.push_back(op.sizes[i]);
    }
    std::vector<PutStartKeyResult> again = state_->PutStart(retry);
    for (size_t j = 0; j < full.size(); ++j) results[full[j]] = std::move(again[j]);
  }
  // Applied: the reply's wait for the standbys need not hold the tenant's other puts.
  if (quota_lock.owns_lock()) quota_lock.unlock();

  std::vector<Status> started(results.size());
  for (size_t i = 0; i < results.size(); ++i) started[i] = results[i].status;
  CountPuts(started, op.sizes);
  resp->mutable_results()->Reserve(static_cast<int>(results.size()));
  size_t errors = 0;
  for (const auto& r : results) {
    proto::PutStartResult* out = resp->add_results();
    out->set_code(Code(r.status));
    if (!r.status.ok()) out->set_message(r.status.message());
    FillReplicas(r.replicas, out->mutable_replicas(), access);
    out->set_put_gen(r.put_gen);
    errors += !r.status.ok();
  }
  scope.KeyErrors(errors);
  return admission.Finish();
}

grpc::Status MasterService::BatchPutEnd(Ctx* ctx, const proto::BatchPutEndRequest* req,
                                        proto::BatchStatusResponse* resp) {
  CallScope scope(Metrics("BatchPutEnd"), req->keys_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  auto statuses = state_->PutEnd(
      {HeldClient(req->client_id(), who), HeldKeys(req->keys(), who),
       std::vector<uint64_t>(req->checksums().begin(), req->checksums().end()),
       std::vector<uint64_t>(req->put_gens().begin(), req->put_gens().end())});
  scope.KeyErrors(FillStatuses(statuses, resp));
  SetSettle(req->client_id(), req->keys(), who, statuses, resp);
  return admission.Finish();
}

grpc::Status MasterService::BatchPutRevoke(Ctx* ctx, const proto::BatchPutRevokeRequest* req,
                                           proto::BatchStatusResponse* resp) {
  CallScope scope(Metrics("BatchPutRevoke"), req->keys_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  auto statuses = state_->PutRevoke(
      {HeldClient(req->client_id(), who), HeldKeys(req->keys(), who),
       std::vector<uint64_t>(req->put_gens().begin(), req->put_gens().end()),
       req->after_transfer_error()});
  scope.KeyErrors(FillStatuses(statuses, resp));
  return admission.Finish();
}

grpc::Status MasterService::Reserve(Ctx* ctx, const proto::ReserveRequest* req,
                                    proto::ReserveResponse* resp) {
  CallScope scope(Metrics("Reserve"), req->count());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  // A tenant with a quota is granted what would fit it beside its objects and its clients'
  // reservations (the commits are checked again): reserved space stays within the quota too.
  uint32_t count = req->count();
  TenantRuntime* tenant = TenantOf(who);
  std::unique_lock<std::mutex> quota_lock;
  if (tenant && who->quota_bytes && req->size() > 0) {
    quota_lock = std::unique_lock(tenant->quota_mu);
    const MasterState::TenantUsage usage = state_->UsageOf(who->tenant);
    const uint64_t used = static_cast<uint64_t>(std::max<int64_t>(usage.bytes + usage.reserved, 0));
    const uint64_t room = used < who->quota_bytes ? who->quota_bytes - used : 0;
    count = static_cast<uint32_t>(std::min<uint64_t>(count, room / req->size()));
  }
  if (count == 0 && req->count() > 0) {
    tenant->quota_refusals->Inc();
    resp->set_code(Code(Status(ErrorCode::QUOTA_EXCEEDED, "")));
    resp->set_message("tenant " + who->tenant + " has no room left in its quota of " +
                      FormatSize(who->quota_bytes));
    scope.KeyErrors(req->count());
    return admission.Finish();
  }
  // Reserved space is reused no sooner than put_release_timeout_ms after its grant.
  const ReplicaAccess access = AccessFor(who, ReplicaAccess::Kind::kWrite,
                                         state_->policy().put_release_timeout_ms);
  ReserveResult r = state_->Reserve(
      {HeldClient(req->client_id(), who), req->size(), count,
       std::vector<std::string>(req->preferred_segments().begin(), req->preferred_segments().end())});
  if (quota_lock.owns_lock()) quota_lock.unlock();
  resp->set_code(Code(r.status));
  if (!r.status.ok()) resp->set_message(r.status.message());
  resp->set_ttl_ms(static_cast<uint64_t>(state_->policy().reservation_ttl_ms));
  resp->mutable_granted()->Reserve(static_cast<int>(r.granted.size()));
  for (const Reservation& g : r.granted) {
    proto::ReservedExtent* out = resp->add_granted();
    out->set_reservation(g.gen);
    google::protobuf::RepeatedPtrField<proto::Replica> one;
    FillReplicas({g.extent}, &one, access);
    if (!one.empty()) out->mutable_replica()->Swap(&one[0]);
  }
  scope.KeyErrors(req->count() - r.granted.size());
  return admission.Finish();
}

grpc::Status MasterService::BatchPutCommit(Ctx* ctx, const proto::BatchPutCommitRequest* req,
                                           proto::BatchStatusResponse* resp) {
  CallScope scope(Metrics("BatchPutCommit"), req->keys_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  PutCommitOp op{HeldClient(req->client_id(), who), HeldKeys(req->keys(), who),
                 std::vector<uint64_t>(req->reservations().begin(), req->reservations().end()),
                 std::vector<uint64_t>(req->sizes().begin(), req->sizes().end()),
                 std::vector<uint64_t>(req->checksums().begin(), req->checksums().end()),
                 ToPlacement(req->config()), req->upsert(),
                 std::vector<uint64_t>(req->segment_ids().begin(), req->segment_ids().end()),
                 std::vector<uint64_t>(req->offsets().begin(), req->offsets().end())};
  op.trim = state_->CommitTrims(op);
  TenantRuntime* tenant = TenantOf(who);
  std::unique_lock<std::mutex> quota_lock;
  if (tenant && who->quota_bytes) quota_lock = std::unique_lock(tenant->quota_mu);
  std::vector<bool> admitted;
  std::vector<Status> refused;
  FitQuota(who, tenant, op.sizes, &admitted, &refused);
  const size_t n = op.keys.size();
  const std::vector<uint64_t> sizes = op.sizes;  // op is moved into the state below
  const bool shaped = op.reservations.size() == n && op.sizes.size() == n &&
                      op.checksums.size() == n && op.segment_ids.size() == n &&
                      op.offsets.size() == n;
  std::vector<Status> statuses;
  if (!shaped || std::find(admitted.begin(), admitted.end(), false) == admitted.end()) {
    statuses = state_->PutCommit(std::move(op));  // a misshapen batch is refused whole there
  } else {
    // Refused keys keep their reservations, as any refused commit does.
    PutCommitOp fit{op.client_id, {}, {}, {}, {}, op.config, op.upsert, {}, {}, op.trim};
    for (size_t i = 0; i < n; ++i) {
      if (!admitted[i]) continue;
      fit.keys.push_back(op.keys[i]);
      fit.reservations.push_back(op.reservations[i]);
      fit.sizes.push_back(op.sizes[i]);
      fit.checksums.push_back(op.checksums[i]);
      fit.segment_ids.push_back(op.segment_ids[i]);
      fit.offsets.push_back(op.offsets[i]);
    }
    std::vector<Status> committed;
    if (!fit.keys.empty()) committed = state_->PutCommit(std::move(fit));
    statuses.resize(n);
    for (size_t i = 0, j = 0; i < n; ++i) statuses[i] = admitted[i] ? committed[j++] : refused[i];
  }
  if (quota_lock.owns_lock()) quota_lock.unlock();
  if (shaped) CountPuts(statuses, sizes);
  scope.KeyErrors(FillStatuses(statuses, resp));
  SetSettle(req->client_id(), req->keys(), who, statuses, resp);
  return admission.Finish();
}

grpc::Status MasterService::ReleaseReservations(Ctx* ctx, const proto::ReleaseReservationsRequest* req,
                                                proto::BatchStatusResponse* resp) {
  CallScope scope(Metrics("ReleaseReservations"), req->reservations_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  auto statuses = state_->ReleaseReservations(
      {HeldClient(req->client_id(), who),
       std::vector<uint64_t>(req->reservations().begin(), req->reservations().end()),
       std::vector<uint64_t>(req->segment_ids().begin(), req->segment_ids().end()),
       std::vector<uint64_t>(req->offsets().begin(), req->offsets().end())});
  scope.KeyErrors(FillStatuses(statuses, resp));
  return admission.Finish();
}

// ---- high availability ----

grpc::Status MasterService::ClusterStatus(Ctx* ctx, const proto::ClusterStatusRequest*,
                                          proto::ClusterStatusResponse* resp) {
  CallScope scope(Metrics("ClusterStatus"), 0);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kQuery, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (cluster_status_) {
    cluster_status_(resp);
  } else {
    resp->set_applied_seq(state_->last_seq());
  }
  resp->set_caller_role(who->role_name());
  resp->set_caller_tenant(who->tenant);
  resp->set_http_port(http_port_.load());
  if (auth_ != nullptr) {
    for (const Principal& t : auth_->tenants()) {
      if (who->tenant_only() && who != &t) continue;
      const MasterState::TenantUsage usage = state_->UsageOf(t.tenant);
      proto::TenantStatus* out = resp->add_tenants();
      out->set_name(t.tenant);
      out->set_bytes(static_cast<uint64_t>(std::max<int64_t>(usage.bytes, 0)));
      out->set_objects(static_cast<uint64_t>(std::max<int64_t>(usage.objects, 0)));
      out->set_quota_bytes(t.quota_bytes);
    }
  }
  return admission.Finish();
}

}  // namespace granary::master
