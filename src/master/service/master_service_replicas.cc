// MasterService: replica counts (Replicate), re-replication (ReplicaCopyStart/End, asked by each
// node for copies into its own segment) and drains (docs/operations.md).
#include <algorithm>

#include "common/logging.h"
#include "master/service/master_service.h"
#include "master/service/rpc_results.h"

namespace granary::master {

namespace {
// Copies per node round: each is one read from another node, one at a time.
constexpr uint32_t kMaxCopiesPerRound = 256;
}  // namespace

grpc::Status MasterService::Replicate(Ctx* ctx, const proto::ReplicateRequest* req,
                                      proto::BatchStatusResponse* resp) {
  CallScope scope(Metrics("Replicate"), req->keys_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  // A tenant's keys are its own namespace's (HeldKeys); nobody else's are reachable.
  auto statuses = state_->SetReplicas({HeldKeys(req->keys(), who), req->replica_num()});
  scope.KeyErrors(FillStatuses(statuses, resp));
  return admission.Finish();
}

grpc::Status MasterService::ReplicaCopyStart(Ctx* ctx, const proto::ReplicaCopyStartRequest* req,
                                             proto::ReplicaCopyStartResponse* resp) {
  CallScope scope(Metrics("ReplicaCopyStart"), 0);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (who->tenant_only()) return Deny(who, "ReplicaCopyStart");
  const std::vector<uint64_t> own = state_->segments().SegmentsOf(req->client_id());
  if (req->client_id().empty() || own.empty() || req->round() == 0) {
    resp->set_code(Code(Status(ErrorCode::ILLEGAL_CLIENT, "")));
    resp->set_message("re-replication is for a node with a mounted segment, from round 1");
    return admission.Finish();
  }
  const size_t max_keys = std::min(req->max_keys(), kMaxCopiesPerRound);
  std::vector<std::string> plan =
      replicas_.Take(req->client_id(), max_keys, state_->clock()->NowMs());
  // More for this node only if it got some: a backlog it cannot take must not make it spin.
  resp->set_more(!plan.empty() && replicas_.GetStats().backlog_objects > 0);
  // Nothing to start and nothing of an earlier round to end: an idle round leaves no trace.
  if (plan.empty() && state_->CopiesOf(req->client_id()) == 0) return admission.Finish();
  std::vector<ReplicaCopyKeyResult> started =
      state_->ReplicaCopyStart({req->client_id(), plan, req->round()});
  const ReplicaAccess read =
      AccessFor(who, ReplicaAccess::Kind::kRead, state_->policy().lease_ttl_ms);
  std::vector<std::string> unusable;
  std::vector<uint64_t> unusable_gens;
  for (size_t i = 0; i < plan.size(); ++i) {
    const ReplicaCopyKeyResult& r = started[i];
    if (!r.status.ok()) continue;  // changed since the plan: skipped
    google::protobuf::RepeatedPtrField<proto::Replica> target;
    if (std::find(own.begin(), own.end(), r.extent.segment_id) != own.end()) {
      FillReplicas({r.extent}, &target);
    }
    proto::ReplicaCopyItem item;
    FillReplicas(r.sources, item.mutable_sources(), read);
    FillDiskReplicas(r.disk_sources, item.mutable_disk_sources());
    if (target.empty() || (item.sources_size() == 0 && item.disk_sources_size() == 0)) {
      unusable.push_back(plan[i]);  // unmounted meanwhile: give the allocation back at once
      unusable_gens.push_back(r.version_gen);
      continue;
    }
    item.set_key(plan[i]);
    item.set_version_gen(r.version_gen);
    item.set_size(r.size);
    item.set_checksum(r.checksum);
    *item.mutable_target() = std::move(target[0]);
    *resp->add_items() = std::move(item);
  }
  if (!unusable.empty()) {
    state_->ReplicaCopyEnd({req->client_id(), req->round(), unusable, unusable_gens,
                            std::vector<uint8_t>(unusable.size(), 0)});
  }
  return admission.Finish();
}

grpc::Status MasterService::ReplicaCopyEnd(Ctx* ctx, const proto::ReplicaCopyEndRequest* req,
                                           proto::BatchStatusResponse* resp) {
  const int n = req->keys_size();
  CallScope scope(Metrics("ReplicaCopyEnd"), n);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (who->tenant_only()) return Deny(who, "ReplicaCopyEnd");
  if (req->version_gens_size() != n || req->copied_size() != n) {
    std::vector<Status> bad(n, Status(ErrorCode::INVALID_PARAMS,
                                      "keys, version_gens and copied differ in length"));
    scope.KeyErrors(FillStatuses(bad, resp));
    return admission.Finish();
  }
  ReplicaCopyEndOp op{req->client_id(), req->round(), Keys(req->keys()),
                      std::vector<uint64_t>(req->version_gens().begin(), req->version_gens().end()),
                      {}};
  op.copied.reserve(n);
  for (bool c : req->copied()) op.copied.push_back(c ? 1 : 0);
  std::vector<Status> ended = state_->ReplicaCopyEnd(std::move(op));
  scope.KeyErrors(FillStatuses(ended, resp));
  return admission.Finish();
}

grpc::Status MasterService::Drain(Ctx* ctx, const proto::DrainRequest* req,
                                  proto::DrainResponse* resp) {
  CallScope scope(Metrics("Drain"), 0);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (who->tenant_only()) return Deny(who, "Drain");
  DrainResult result = state_->Drain({req->segment_name(), req->drop(), req->undrain()});
  resp->set_code(Code(result.status));
  resp->set_message(result.status.message());
  resp->set_dropped_replicas(result.unmounted_replicas);
  if (result.status.ok()) {
    GLOG_INFO("segment {}: {}", req->segment_name(),
              req->undrain() ? "undrained"
                             : (req->drop() ? "dropped (drain --drop)" : "draining"));
  }
  return admission.Finish();
}

size_t MasterService::FinishDrains() {
  size_t finished = 0;
  for (const std::string& name : replicas_.FinishedDrains(state_->clock()->NowMs())) {
    DrainResult r = state_->DrainFinish({name});
    if (!r.status.ok()) continue;
    GLOG_INFO("segment {} drained: unmounted ({} replicas went with it)", name,
              r.unmounted_replicas);
    finished++;
  }
  return finished;
}

}  // namespace granary::master
