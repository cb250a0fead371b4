// MasterService: the SSD tier's RPCs. A node registers what its disk holds, drops what its disk
// eviction removed, offloads memory objects the master picks (OffloadPlanner) as demotions, and
// learns with each OffloadStart which of its copies the master let go (disk garbage) to delete,
// and which disk-only objects (read --promote-after times) to copy back into its memory.
#include "master/service/master_service.h"
#include "master/service/rpc_results.h"

#include <algorithm>

namespace granary::master {

// The bounds of one answer (offload_planner.h): garbage well inside a message, which a node
// deletes in about an interval, the rest following in the next rounds; promotions the node reads
// one by one from its disk, between offload rounds.

grpc::Status MasterService::DiskRegister(Ctx* ctx, const proto::DiskRegisterRequest* req,
                                         proto::BatchStatusResponse* resp) {
  CallScope scope(Metrics("DiskRegister"), req->copies_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (who->tenant_only()) return Deny(who, "DiskRegister");
  DiskRegisterOp op{req->client_id(), {}, req->disk_id(), req->complete()};
  op.entries.reserve(req->copies_size());
  for (const auto& c : req->copies()) {
    op.entries.push_back({c.key(), c.size(), c.checksum(), c.location()});
  }
  scope.KeyErrors(FillStatuses(state_->DiskRegister(std::move(op)), resp));
  return admission.Finish();
}

grpc::Status MasterService::DiskDrop(Ctx* ctx, const proto::DiskDropRequest* req,
                                     proto::BatchStatusResponse* resp) {
  CallScope scope(Metrics("DiskDrop"), req->keys_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (who->tenant_only()) return Deny(who, "DiskDrop");
  auto statuses = state_->DiskDrop(
      {req->client_id(), Keys(req->keys()),
       std::vector<uint64_t>(req->locations().begin(), req->locations().end())});
  scope.KeyErrors(FillStatuses(statuses, resp));
  return admission.Finish();
}

grpc::Status MasterService::OffloadStart(Ctx* ctx, const proto::OffloadStartRequest* req,
                                         proto::OffloadStartResponse* resp) {
  CallScope scope(Metrics("OffloadStart"), 0);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (who->tenant_only()) return Deny(who, "OffloadStart");
  const uint64_t disk_id = req->disk_id();
  if (disk_id != 0) {
    // Acknowledged first, so the answer does not name them again. Only a real ack is an
    // operation: an idle node's rounds leave no trace in the history.
    if (req->deleted_ids_size() > 0) {
      state_->DiskGarbageAck({req->client_id(), disk_id,
                              std::vector<uint64_t>(req->deleted_ids().begin(),
                                                    req->deleted_ids().end())});
    }
    for (const GarbageEntry& g :
         state_->DiskGarbageOf(disk_id, kMaxGarbagePerReply, kMaxGarbageKeyBytesPerReply)) {
      resp->add_delete_keys(g.key);
      resp->add_delete_locations(g.location);
      resp->add_delete_ids(g.id);
    }
  }
  const std::vector<uint64_t> own = state_->segments().SegmentsOf(req->client_id());
  if (req->client_id().empty() || own.empty()) {
    resp->set_code(Code(Status(ErrorCode::ILLEGAL_CLIENT, "")));
    resp->set_message("offload is for a node with a mounted segment");
    return admission.Finish();
  }
  if (!state_->DiskKnown(disk_id)) {
    resp->set_disk_unknown(true);
    return admission.Finish();
  }
  StartPromotions(*req, own, resp);
  const size_t max_keys = std::min(req->max_keys(), kMaxOffloadKeys);
  std::vector<std::string> plan = planner_.Plan(req->client_id(), max_keys, req->max_bytes());
  if (plan.empty()) return admission.Finish();
  std::vector<DemoteStartKeyResult> started =
      state_->DemoteStart({req->client_id(), plan, disk_id});
  std::vector<std::string> unusable;
  std::vector<uint64_t> unusable_gens;
  for (size_t i = 0; i < plan.size(); ++i) {
    const DemoteStartKeyResult& r = started[i];
    if (!r.status.ok()) continue;  // changed since the plan: skipped
    demotions_started_->Inc();
    // The node copies from its own memory: one of the version's replicas is on its segment.
    const Extent* source = nullptr;
    for (const auto& e : r.replicas) {
      if (std::find(own.begin(), own.end(), e.segment_id) != own.end()) source = &e;
    }
    google::protobuf::RepeatedPtrField<proto::Replica> filled;
    if (source) FillReplicas({*source}, &filled);
    if (filled.empty()) {  // unmounted meanwhile
      unusable.push_back(plan[i]);
      unusable_gens.push_back(r.version_gen);
      continue;
    }
    proto::OffloadItem* item = resp->add_items();
    item->set_key(plan[i]);
    item->set_version_gen(r.version_gen);
    item->set_size(r.size);
    item->set_checksum(r.checksum);
    *item->mutable_source() = std::move(filled[0]);
  }
  if (!unusable.empty()) {
    demotions_aborted_->Inc(unusable.size());
    state_->DemoteAbort({req->client_id(), unusable, unusable_gens});
  }
  return admission.Finish();
}

void MasterService::StartPromotions(const proto::OffloadStartRequest& req,
                                    const std::vector<uint64_t>& own,
                                    proto::OffloadStartResponse* resp) {
  if (req.round() == 0) return;  // a node that does not promote
  std::vector<std::string> due = promotions_.Take(req.client_id(), kMaxPromotionsPerRound);
  // Nothing due and nothing of an earlier round to end: an idle round stays out of the history.
  if (due.empty() && state_->PromotionsOf(req.client_id()) == 0) return;
  std::vector<PromoteStartKeyResult> started =
      state_->PromoteStart({req.client_id(), due, req.disk_id(), req.round()});
  std::vector<std::string> unusable;
  std::vector<uint64_t> unusable_gens;
  for (size_t i = 0; i < due.size(); ++i) {
    const PromoteStartKeyResult& r = started[i];
    if (!r.status.ok()) continue;  // in memory already, replaced, or no room: not promoted
    google::protobuf::RepeatedPtrField<proto::Replica> filled;
    if (std::find(own.begin(), own.end(), r.extent.segment_id) != own.end()) {
      FillReplicas({r.extent}, &filled);
    }
    if (filled.empty()) {  // unmounted meanwhile: give the allocation back at once
      unusable.push_back(due[i]);
      unusable_gens.push_back(r.version_gen);
      continue;
    }
    proto::PromoteItem* item = resp->add_promotions();
    item->set_key(due[i]);
    item->set_version_gen(r.version_gen);
    item->set_size(r.size);
    item->set_checksum(r.checksum);
    item->set_location(r.location);
    *item->mutable_target() = std::move(filled[0]);
  }
  if (!unusable.empty()) {
    state_->PromoteEnd({req.client_id(), req.round(), unusable, unusable_gens,
                        std::vector<uint8_t>(unusable.size(), 0)});
  }
}

grpc::Status MasterService::PromoteEnd(Ctx* ctx, const proto::PromoteEndRequest* req,
                                       proto::BatchStatusResponse* resp) {
  const int n = req->keys_size();
  CallScope scope(Metrics("PromoteEnd"), n);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (who->tenant_only()) return Deny(who, "PromoteEnd");
  if (req->version_gens_size() != n || req->copied_size() != n) {
    std::vector<Status> bad(n, Status(ErrorCode::INVALID_PARAMS,
                                      "keys, version_gens and copied differ in length"));
    scope.KeyErrors(FillStatuses(bad, resp));
    return admission.Finish();
  }
  PromoteEndOp op{req->client_id(), req->round(), Keys(req->keys()),
                  std::vector<uint64_t>(req->version_gens().begin(), req->version_gens().end()),
                  {}};
  op.copied.reserve(n);
  for (bool c : req->copied()) op.copied.push_back(c ? 1 : 0);
  scope.KeyErrors(FillStatuses(state_->PromoteEnd(std::move(op)), resp));
  return admission.Finish();
}

grpc::Status MasterService::OffloadEnd(Ctx* ctx, const proto::OffloadEndRequest* req,
                                       proto::BatchStatusResponse* resp) {
  const int n = req->keys_size();
  CallScope scope(Metrics("OffloadEnd"), n);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (who->tenant_only()) return Deny(who, "OffloadEnd");
  std::vector<Status> results(n);
  if (req->version_gens_size() != n || req->locations_size() != n || req->written_size() != n) {
    std::fill(results.begin(), results.end(),
              Status(ErrorCode::INVALID_PARAMS,
                     "keys, version_gens, locations and written differ in length"));
    scope.KeyErrors(FillStatuses(results, resp));
    return admission.Finish();
  }
  DemoteEndOp end{req->client_id(), {}, {}, {}, req->disk_id()};
  DemoteAbortOp abort{req->client_id(), {}, {}};
  std::vector<int> end_index, abort_index;
  for (int i = 0; i < n; ++i) {
    if (req->written(i)) {
      end.keys.push_back(req->keys(i));
      end.version_gens.push_back(req->version_gens(i));
      end.locations.push_back(req->locations(i));
      end_index.push_back(i);
    } else {
      abort.keys.push_back(req->keys(i));
      abort.version_gens.push_back(req->version_gens(i));
      abort_index.push_back(i);
    }
  }
  if (!end.keys.empty()) {
    std::vector<Status> ended = state_->DemoteEnd(std::move(end));
    for (size_t j = 0; j < ended.size(); ++j) {
      (ended[j].ok() ? demotions_completed_ : demotions_failed_)->Inc();
      results[end_index[j]] = std::move(ended[j]);
    }
  }
  if (!abort.keys.empty()) {
    demotions_aborted_->Inc(abort.keys.size());
    std::vector<Status> aborted = state_->DemoteAbort(std::move(abort));
    for (size_t j = 0; j < aborted.size(); ++j) results[abort_index[j]] = std::move(aborted[j]);
  }
  scope.KeyErrors(FillStatuses(results, resp));
  return admission.Finish();
}

}  // namespace granary::master
