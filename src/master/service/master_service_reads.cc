// MasterService: reads (replica lists under read locks, finish-read, exist, size, prefix match,
// stat), removal and regex queries. Split from master_service.cc; same class, same rules.
#include "master/service/master_service.h"
#include "master/service/rpc_results.h"
#include "proto/rpc_util.h"

#include <algorithm>
#include <string_view>

namespace granary::master {

namespace {
constexpr size_t kDefaultQueryLimit = 100'000;
}  // namespace

// ---- reads ----

grpc::Status MasterService::BatchGetReplicaList(Ctx* ctx, const proto::BatchGetReplicaListRequest* req,
                                                proto::BatchGetReplicaListResponse* resp) {
  CallScope scope(Metrics("BatchGetReplicaList"), req->keys_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  const std::string client = HeldClient(req->client_id(), who);
  // The grant, capped here (the op carries it): --cache-lease is validated to [0, 60 s].
  const int64_t cache_ms = static_cast<int64_t>(std::min<uint64_t>(
      req->cache_ms(), static_cast<uint64_t>(state_->policy().cache_lease_ms)));
  GetReplicaListOp op{client, HeldKeys(req->keys(), who), cache_ms};
  const std::vector<std::string> keys = op.keys;  // the op is moved into the state
  // A read lock lasts lease_ttl_ms from the apply: after it the bytes may be freed and reused.
  const ReplicaAccess access = AccessFor(who, ReplicaAccess::Kind::kRead,
                                         state_->policy().lease_ttl_ms);
  auto results = state_->GetReplicaList(std::move(op));
  resp->mutable_results()->Reserve(static_cast<int>(results.size()));
  size_t errors = 0;
  std::vector<std::string> unreadable;  // locked by the state, but refused here: unlocked below
  TenantRuntime* tenant = who->tenant_only() ? TenantOf(who) : nullptr;
  for (size_t k = 0; k < results.size(); ++k) {
    const auto& r = results[k];
    proto::GetReplicaResult* out = resp->add_results();
    FillReplicas(r.replicas, out->mutable_replicas(), access);
    FillDiskReplicas(r.disk, out->mutable_disk_replicas(), keys[k],
                     req->keys(static_cast<int>(k)));
    Status status = r.status;
    if (status.ok() && out->replicas_size() == 0) {
      // A disk-only object is read through its node's data server (DISK_READ), which needs the
      // node mounted (its endpoint).
      const bool reachable =
          std::any_of(out->disk_replicas().begin(), out->disk_replicas().end(),
                      [](const proto::DiskReplica& d) { return !d.endpoint().empty(); });
      if (!reachable) {
        status = Status(ErrorCode::OBJECT_NOT_FOUND,
                        out->disk_replicas_size() > 0 ? "only on the disk of an unmounted node"
                                                      : "every replica's segment is gone");
        unreadable.push_back(keys[k]);
      }
    }
    out->set_code(Code(status));
    if (!status.ok()) out->set_message(status.message());
    out->set_size(r.size);
    out->set_checksum(r.checksum);
    errors += !status.ok();
    if (status.ok()) promotions_.NoteRead(keys[k], r);
    // memory_hit, disk_hit, miss (the order of kGetOutcomes).
    const size_t outcome = !status.ok() ? 2 : out->replicas_size() > 0 ? 0 : 1;
    gets_[outcome]->Inc();
    if (tenant != nullptr && tenant->gets[outcome] != nullptr) tenant->gets[outcome]->Inc();
    if (outcome == 0) memory_hit_bytes_->Inc(r.size);
    if (outcome == 1) disk_hit_bytes_->Inc(r.size);
  }
  // The client releases only what it was told it may read: a lock kept here would make the key
  // unremovable (OBJECT_HAS_LEASE) until the lease ran out.
  if (!unreadable.empty()) (void)state_->FinishRead({client, std::move(unreadable)});
  resp->set_lease_ttl_ms(static_cast<uint64_t>(state_->policy().lease_ttl_ms));
  resp->set_cache_lease_ms(static_cast<uint64_t>(cache_ms));
  scope.KeyErrors(errors);
  return admission.Finish();
}

grpc::Status MasterService::BatchFinishRead(Ctx* ctx, const proto::BatchFinishReadRequest* req,
                                            proto::BatchStatusResponse* resp) {
  CallScope scope(Metrics("BatchFinishRead"), req->keys_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kSoft, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  auto statuses =
      state_->FinishRead({HeldClient(req->client_id(), who), HeldKeys(req->keys(), who)});
  scope.KeyErrors(FillStatuses(statuses, resp));
  return admission.Finish();
}

grpc::Status MasterService::BatchExist(Ctx* ctx, const proto::BatchExistRequest* req,
                                       proto::BatchExistResponse* resp) {
  CallScope scope(Metrics("BatchExist"), req->keys_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kQuery, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  // Views into the request: a query keeps no key, so none is copied (a tenant's are, prefixed).
  std::vector<std::string_view> keys(req->keys().begin(), req->keys().end());
  std::vector<std::string> held;
  const bool marked = std::any_of(keys.begin(), keys.end(), [](std::string_view k) {
    return !k.empty() && k.front() == kNamespaceMark;
  });
  if (who->tenant_only() || marked) {
    held = HeldKeys(req->keys(), who);
    keys.assign(held.begin(), held.end());
  }
  auto results = state_->BatchExist(std::span<const std::string_view>(keys));
  resp->mutable_results()->Add(results.begin(), results.end());
  return admission.Finish();
}

grpc::Status MasterService::BatchGetSize(Ctx* ctx, const proto::BatchGetSizeRequest* req,
                                         proto::BatchGetSizeResponse* resp) {
  CallScope scope(Metrics("BatchGetSize"), req->keys_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kQuery, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  auto results = state_->BatchGetSize(HeldKeys(req->keys(), who));
  resp->mutable_results()->Add(results.begin(), results.end());
  return admission.Finish();
}

grpc::Status MasterService::BatchPrefixMatch(Ctx* ctx, const proto::BatchPrefixMatchRequest* req,
                                             proto::BatchPrefixMatchResponse* resp) {
  CallScope scope(Metrics("BatchPrefixMatch"), req->keys_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kQuery, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  auto matched = state_->PrefixMatch(HeldKeys(req->keys(), who));
  resp->set_code(Code(matched.status()));
  if (!matched.ok()) {
    resp->set_message(matched.status().message());
    return admission.Finish();
  }
  resp->set_matched(*matched);
  prefix_match_keys_->Observe(static_cast<double>(*matched));
  return admission.Finish();
}

grpc::Status MasterService::StatObject(Ctx* ctx, const proto::StatObjectRequest* req,
                                       proto::StatObjectResponse* resp) {
  CallScope scope(Metrics("StatObject"), 1);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kQuery, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  auto stat = state_->Stat(HeldKey(PrefixOf(who), req->key()));
  resp->set_code(Code(stat.status()));
  if (!stat.ok()) {
    resp->set_message(stat.status().message());
    return admission.Finish();
  }
  resp->set_state(stat->committed ? (stat->pending ? "COMPLETE+PROCESSING" : "COMPLETE")
                                  : "PROCESSING");
  resp->set_size(stat->size);
  resp->set_checksum(stat->checksum);
  FillReplicas(stat->replicas, resp->mutable_replicas(),
               AccessFor(who, ReplicaAccess::Kind::kNone, 0));
  FillDiskReplicas(stat->disk, resp->mutable_disk_replicas());
  resp->set_read_locks(stat->read_locks);
  resp->set_hard_pinned(stat->hard_pinned);
  resp->set_soft_pinned(stat->soft_pinned);
  resp->set_idle_ms(static_cast<uint64_t>(std::max<int64_t>(stat->idle_ms, 0)));
  resp->set_want_replicas(stat->want_replicas);
  resp->set_copying(stat->copying);
  return admission.Finish();
}

// ---- removal and queries ----

grpc::Status MasterService::BatchRemove(Ctx* ctx, const proto::BatchRemoveRequest* req,
                                        proto::BatchStatusResponse* resp) {
  CallScope scope(Metrics("BatchRemove"), req->keys_size());
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  if (req->force() && !who->admin()) return Deny(who, "a forced BatchRemove");
  auto statuses = state_->Remove({HeldKeys(req->keys(), who), req->force()});
  scope.KeyErrors(FillStatuses(statuses, resp));
  SetSettle(req->client_id(), req->keys(), who, statuses, resp, /*not_found_too=*/true);
  return admission.Finish();
}

grpc::Status MasterService::RemoveByRegex(Ctx* ctx, const proto::RegexRequest* req,
                                          proto::RemoveCountResponse* resp) {
  CallScope scope(Metrics("RemoveByRegex"), 0);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  // An admin's reaches every namespace; anyone else's, their own (and never forced).
  if (req->force() && !who->admin()) return Deny(who, "a forced RemoveByRegex");
  RemoveCountResult r = state_->RemoveScoped(
      {PrefixOf(who), who->admin(), req->pattern(), req->force()});
  resp->set_code(Code(r.status));
  resp->set_message(r.status.message());
  resp->set_removed(r.removed);
  resp->set_skipped(r.skipped);
  // Even with nothing removed here: an earlier master's objects may still be cached.
  resp->set_settle_ms(static_cast<uint64_t>(state_->SettleAllMs()));
  return admission.Finish();
}

grpc::Status MasterService::QueryByRegex(Ctx* ctx, const proto::RegexRequest* req,
                                         proto::QueryByRegexResponse* resp) {
  CallScope scope(Metrics("QueryByRegex"), 0);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kQuery, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  size_t limit = req->limit() ? std::min<size_t>(req->limit(), kDefaultQueryLimit)
                              : kDefaultQueryLimit;
  const KeyScope keys{PrefixOf(who), false};
  auto result = state_->QueryByRegex(req->pattern(), limit, &keys);
  resp->set_code(Code(result.status()));
  if (!result.ok()) {
    resp->set_message(result.status().message());
    return admission.Finish();
  }
  for (const auto& row : result->objects) {
    proto::ObjectSummary* out = resp->add_objects();
    out->set_key(row.key);
    out->set_size(row.size);
    out->set_replica_count(row.replica_count);
  }
  resp->set_truncated(result->truncated);
  return admission.Finish();
}

grpc::Status MasterService::RemoveAll(Ctx* ctx, const proto::RemoveAllRequest* req,
                                      proto::RemoveCountResponse* resp) {
  CallScope scope(Metrics("RemoveAll"), 0);
  const Principal* who = nullptr;
  Admission admission(gate_, CallKind::kUpdate, resp, Authenticate(ctx, &who));
  if (!admission.ok()) return admission.refusal();
  // An admin's empties the store; anyone else's, their own namespace (and never forced).
  if (req->force() && !who->admin()) return Deny(who, "a forced RemoveAll");
  RemoveCountResult r = who->admin() ? state_->RemoveAll({req->force()})
                                     : state_->RemoveScoped({PrefixOf(who), false, "", false});
  resp->set_code(Code(r.status));
  resp->set_removed(r.removed);
  resp->set_skipped(r.skipped);
  // Even with nothing removed here: an earlier master's objects may still be cached.
  resp->set_settle_ms(static_cast<uint64_t>(state_->SettleAllMs()));
  return admission.Finish();
}

}  // namespace granary::master
