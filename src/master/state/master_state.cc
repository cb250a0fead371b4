#include "master/state/master_state.h"

#include <re2/re2.h>
#include <xxhash.h>

#include <algorithm>
#include <limits>

#include "master/state/state_codec.h"
#include "master/state/state_internal.h"

namespace granary::master {

using namespace internal;

namespace {
template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace

Status ValidateKey(std::string_view key) {
  if (key.empty()) return Status(ErrorCode::INVALID_KEY, "key is empty");
  // A held key that begins with the mark is a tenant's, "\0" NAME "\0" KEY (key_namespace.h).
  if (key.front() == kNamespaceMark) {
    const size_t end = key.find(kNamespaceMark, 1);
    if (end == std::string_view::npos || end == 1 || end + 1 == key.size()) {
      return Status(ErrorCode::INVALID_KEY,
                    "a key may not begin with a NUL byte (it marks tenants' namespaces)");
    }
  }
  if (key.size() > kMaxKeyBytes) {
    return Status(ErrorCode::INVALID_KEY, "key of " + std::to_string(key.size()) +
                                              " bytes exceeds the limit of " +
                                              std::to_string(kMaxKeyBytes));
  }
  return Status::Ok();
}

MasterState::MasterState(MasterPolicy policy, const Clock* clock, uint64_t segment_id_base)
    : policy_(policy),
      clock_(clock),
      segment_id_base_(segment_id_base),
      segments_(segment_id_base),
      garbage_(policy.disk_garbage_max_entries, policy.disk_garbage_max_key_bytes),
      next_put_gen_(std::max<uint64_t>(segment_id_base, 1)) {
  if (policy_.shard_count == 0) policy_.shard_count = 1;
  shards_.reserve(policy_.shard_count);
  for (uint32_t i = 0; i < policy_.shard_count; ++i) shards_.push_back(std::make_unique<Shard>());
}

void MasterState::AddObserver(Observer observer) { observers_.push_back(std::move(observer)); }

namespace {
thread_local uint64_t tls_last_seq = 0;
thread_local uint64_t tls_applied = 0;
}  // namespace

OpResult MasterState::Apply(Operation op) { return ApplyPrepared(std::move(op), nullptr); }

OpResult MasterState::ApplyPrepared(Operation op, PreparedEntries* prepared) {
  OpResult result;
  // A PutStart with its groups made may be applied in a group (ApplyPutStartGroup).
  PutStartCall call{&op, prepared, &result};
  const bool groupable = prepared != nullptr && prepared->groups.has_value() &&
                         std::holds_alternative<PutStartOp>(op.body);
  // Under contention another caller's thread may apply op (ApplyCombiner): the seq is read
  // back from op here, on this thread, for LastSeqOnThisThread.
  combiner_.Run([&] { result = ApplyNext(op, prepared); }, groupable ? &call : nullptr);
  tls_last_seq = op.seq;
  tls_applied++;
  return result;
}

void MasterState::StampNext(Operation& op) const {
  op.seq = last_seq_ + 1;
  op.now_ms = std::max(op.now_ms, last_now_ms_);
}

OpResult MasterState::ApplyNext(Operation& op, PreparedEntries* prepared) {
  StampNext(op);
  return ApplyLocked(op, prepared);
}

Result<OpResult> MasterState::Replay(const Operation& op) {
  std::lock_guard lock(apply_mu_);
  if (op.seq != last_seq_ + 1) {
    return Status(ErrorCode::INVALID_PARAMS, "operation " + std::to_string(op.seq) +
                                                 " does not follow " + std::to_string(last_seq_));
  }
  if (op.now_ms < last_now_ms_) {
    return Status(ErrorCode::INVALID_PARAMS, "operation " + std::to_string(op.seq) +
                                                 " goes back in time");
  }
  tls_last_seq = op.seq;
  tls_applied++;
  return ApplyLocked(op);
}

uint64_t MasterState::last_seq() const {
  std::lock_guard lock(apply_mu_);
  return last_seq_;
}

uint64_t MasterState::LastSeqOnThisThread() { return tls_last_seq; }
uint64_t MasterState::AppliedOnThisThread() { return tls_applied; }

OpResult MasterState::ApplyLocked(const Operation& op, PreparedEntries* prepared) {
  last_seq_ = op.seq;
  last_now_ms_ = op.now_ms;
  const int64_t now = op.now_ms;
  OpResult result = std::visit(
      Overloaded{
          [&](const MountSegmentOp& o) -> OpResult { return ApplyMount(o, now); },
          [&](const UnmountSegmentOp& o) -> OpResult { return ApplyUnmount(o, now); },
          [&](const PingOp& o) -> OpResult { return ApplyPing(o, now); },
          [&](const ExpireClientOp& o) -> OpResult { return ApplyExpireClient(o, now); },
          [&](const PutStartOp& o) -> OpResult { return ApplyPutStart(o, now, prepared); },
          [&](const PutEndOp& o) -> OpResult { return ApplyPutEnd(o, now); },
          [&](const PutRevokeOp& o) -> OpResult { return ApplyPutRevoke(o, now); },
          [&](const GetReplicaListOp& o) -> OpResult { return ApplyGetReplicaList(o, now); },
          [&](const FinishReadOp& o) -> OpResult { return ApplyFinishRead(o, now); },
          [&](const RemoveOp& o) -> OpResult { return ApplyRemove(o, now); },
          [&](const RemoveByRegexOp& o) -> OpResult { return ApplyRemoveByRegex(o, now); },
          [&](const RemoveAllOp& o) -> OpResult {
            return ApplyRemoveMatching([](std::string_view) { return true; }, o.force, now);
          },
          [&](const EvictOp& o) -> OpResult { return ApplyEvict(o, now); },
          [&](const SweepOp& o) -> OpResult { return ApplySweep(o, now); },
          [&](const DemoteStartOp& o) -> OpResult { return ApplyDemoteStart(o, now); },
          [&](const DemoteEndOp& o) -> OpResult { return ApplyDemoteEnd(o, now); },
          [&](const DemoteAbortOp& o) -> OpResult { return ApplyDemoteAbort(o, now); },
          [&](const DiskRegisterOp& o) -> OpResult { return ApplyDiskRegister(o, now); },
          [&](const DiskDropOp& o) -> OpResult { return ApplyDiskDrop(o, now); },
          [&](const DiskGarbageAckOp& o) -> OpResult { return ApplyDiskGarbageAck(o); },
          [&](const PromoteStartOp& o) -> OpResult { return ApplyPromoteStart(o, now); },
          [&](const PromoteEndOp& o) -> OpResult { return ApplyPromoteEnd(o); },
          [&](const ReserveOp& o) -> OpResult { return ApplyReserve(o, now); },
          [&](const PutCommitOp& o) -> OpResult { return ApplyPutCommit(o, now); },
          [&](const ReleaseReservationsOp& o) -> OpResult { return ApplyReleaseReservations(o); },
          [&](const RemoveScopedOp& o) -> OpResult { return ApplyRemoveScoped(o, now); },
          [&](const SetReplicasOp& o) -> OpResult { return ApplySetReplicas(o, now); },
          [&](const ReplicaCopyStartOp& o) -> OpResult { return ApplyReplicaCopyStart(o, now); },
          [&](const ReplicaCopyEndOp& o) -> OpResult { return ApplyReplicaCopyEnd(o); },
          [&](const DrainOp& o) -> OpResult { return ApplyDrain(o, now); },
          [&](const DrainFinishOp& o) -> OpResult { return ApplyDrainFinish(o, now); },
      },
      op.body);
  for (const auto& observer : observers_) observer(op, result);
  return result;
}

size_t MasterState::ShardOf(std::string_view key) const {
  return XXH3_64bits(key.data(), key.size()) % shards_.size();
}

MasterState::ShardGroups::ShardGroups(std::vector<uint64_t> tagged) : tagged_(std::move(tagged)) {
  std::sort(tagged_.begin(), tagged_.end());  // by shard, then by index: the batch's order
  indices_.reserve(tagged_.size());
  for (uint64_t t : tagged_) indices_.push_back(static_cast<uint32_t>(t));
}

namespace {
// Between two calls a shard's lock and map header have usually left the cache (a batch of 128
// touches ~120 of 1024 shards): asking for them while grouping overlaps those misses.
template <typename Keys, typename ShardOfFn, typename ShardPtrs>
std::vector<uint64_t> TagAndPrefetch(const Keys& keys, ShardOfFn shard_of, const ShardPtrs& shards) {
  std::vector<uint64_t> tagged;
  tagged.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t shard = shard_of(keys[i]);
    const char* p = reinterpret_cast<const char*>(shards[shard].get());
    __builtin_prefetch(p);
    __builtin_prefetch(p + 64);
    tagged.push_back(uint64_t{shard} << 32 | i);
  }
  return tagged;
}
}  // namespace

MasterState::ShardGroups MasterState::GroupByShard(const std::vector<std::string>& keys) const {
  return ShardGroups(
      TagAndPrefetch(keys, [this](std::string_view k) { return ShardOf(k); }, shards_));
}

MasterState::ShardGroups MasterState::GroupByShard(std::span<const std::string_view> keys) const {
  return ShardGroups(
      TagAndPrefetch(keys, [this](std::string_view k) { return ShardOf(k); }, shards_));
}

MasterState::PreparedEntries MasterState::PrepareEntries(
    const std::vector<std::string>& keys) const {
  const size_t shard_count = shards_.size();
  PreparedEntries prepared;
  prepared.entries.reserve(keys.size());
  prepared.hashes.reserve(keys.size());
  std::vector<uint64_t> tagged;
  tagged.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    prepared.entries.push_back(ObjectTable::MakeEntry(keys[i]));
    const uint64_t hash = XXH3_64bits(keys[i].data(), keys[i].size());
    prepared.hashes.push_back(hash);
    tagged.push_back(uint64_t{hash % shard_count} << 32 | i);  // as ShardOf
  }
  prepared.groups.emplace(std::move(tagged));
  prepared.shard_count = shard_count;
  return prepared;
}

std::vector<PutStartKeyResult> MasterState::PutStart(PutStartOp op) {
  PreparedEntries prepared = PrepareEntries(op.keys);
  return std::get<std::vector<PutStartKeyResult>>(
      ApplyPrepared(Operation{clock_->NowMs(), 0, std::move(op)}, &prepared));
}

// Segments and clients: master_state_clients.cc.

// ---------------------------------------------------------------------------------------------
// Writes

Status MasterState::PutStartBatchError(const PutStartOp& op) const {
  if (op.keys.size() != op.sizes.size()) {
    return Status(ErrorCode::INVALID_PARAMS, "keys and sizes differ in length");
  }
  Status batch_error;
  if (op.client_id.empty()) batch_error = Status(ErrorCode::INVALID_PARAMS, "client id is empty");
  if (Status s = BatchLimit(op.keys.size()); !s.ok()) batch_error = s;
  if (op.config.replica_num > kMaxReplicas) {
    batch_error = Status(ErrorCode::INVALID_PARAMS, "replica_num " +
                                                        std::to_string(op.config.replica_num) +
                                                        " exceeds " + std::to_string(kMaxReplicas));
  }
  if (Status s = PersistenceError(op.config.persistence); !s.ok()) batch_error = s;
  return batch_error;
}

std::vector<PutStartKeyResult> MasterState::ApplyPutStart(const PutStartOp& op, int64_t now,
                                                        PreparedEntries* prepared) {
  std::vector<PutStartKeyResult> results(op.keys.size());
  if (Status bad = PutStartBatchError(op); !bad.ok()) {
    for (auto& r : results) r.status = bad;
    return results;
  }
  const SegmentTable::Placement order = segments_.PlacementOrder(op.config.preferred_segments);
  const uint64_t first_gen = next_put_gen_;  // this operation's keys get this one and later
  std::optional<ShardGroups> own_groups;
  const ShardGroups* groups = PreparedGroups(prepared);
  if (groups == nullptr) groups = &own_groups.emplace(GroupByShard(op.keys));
  for (const auto& [shard_index, indices] : *groups) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      ObjectTable::EntryHandle* entry =
          prepared != nullptr && i < prepared->entries.size() ? &prepared->entries[i] : nullptr;
      results[i] = StartOne(shard, op.keys[i], op.sizes[i], op, order, i, now, first_gen, entry);
    }
  }
  return results;
}

Status MasterState::PutStartKeyError(std::string_view key, uint64_t size) {
  if (Status s = ValidateKey(key); !s.ok()) return s;
  if (size == 0) return Status(ErrorCode::INVALID_PARAMS, "object size is 0");
  if (size > kMaxObjectBytes) {
    return Status(ErrorCode::INVALID_PARAMS, "object size " + std::to_string(size) +
                                                 " exceeds the maximum of " +
                                                 std::to_string(kMaxObjectBytes));
  }
  return Status::Ok();
}

PutStartKeyResult MasterState::StartOne(Shard& shard, const std::string& key, uint64_t size,
                                        const PutStartOp& op, const SegmentTable::Placement& order,
                                        size_t rotation, int64_t now, uint64_t op_first_gen,
                                        ObjectTable::EntryHandle* entry) {
  if (Status s = PutStartKeyError(key, size); !s.ok()) return {s, {}};
  // One lookup: a new key's entry is made now (the one PutStart made before the lock, if it
  // did) and erased again if the put fails.
  ObjectIter it;
  if (entry != nullptr && *entry != nullptr) {
    it = shard.objects.insert(*entry).first;
  } else {
    it = shard.objects.try_emplace(key).first;
  }
  if (Status s = MayWrite(shard, it, op.upsert, now, op.client_id, op_first_gen); !s.ok()) {
    return {s, {}};
  }
  PutStartKeyResult result = PlacePut(op, size, order, rotation, now);
  if (!result.status.ok()) {
    EraseIfEmpty(shard, it);
    return result;
  }
  SetPending(shard, it, MakePending(op, size, result, now));
  return result;
}

PutStartKeyResult MasterState::PlacePut(const PutStartOp& op, uint64_t size,
                                        const SegmentTable::Placement& order, size_t rotation,
                                        int64_t now) {
  // Preferred segments keep their order; the rest rotate per key so a batch spreads out:
  // the rest from `rotation` on, then those before it.
  const std::vector<uint64_t>& ids = order.ids;
  const auto rest_begin = ids.begin() + static_cast<ptrdiff_t>(order.preferred);
  const size_t rest = ids.size() - order.preferred;
  std::vector<uint64_t>& candidates = candidates_scratch_;
  candidates.assign(ids.begin(), rest_begin);
  if (rest > 0) {
    const auto pivot = rest_begin + static_cast<ptrdiff_t>(rotation % rest);
    candidates.insert(candidates.end(), pivot, ids.end());
    candidates.insert(candidates.end(), rest_begin, pivot);
  }
  // Load-aware first choice: of the rotation's pick and one other (chosen by the put's
  // generation, so replay picks the same), the segment with the larger free share goes first.
  // An empty node that joins gets about twice its share until it catches up, not every put.
  if (rest >= 2) {
    const size_t first = order.preferred;
    const size_t other = first + SecondChoice(next_put_gen_, rest);
    if (segments_.FreeShare(candidates[other]) > segments_.FreeShare(candidates[first])) {
      std::swap(candidates[first], candidates[other]);
    }
  }

  const uint32_t wanted = std::max<uint32_t>(op.config.replica_num, 1);
  PutStartKeyResult result;
  std::vector<uint64_t>& used = used_scratch_;
  used.clear();
  for (uint32_t r = 0; r < wanted; ++r) {
    auto extent = segments_.AllocateOn(candidates, size, used, now);
    if (!extent) break;
    used.push_back(extent->segment_id);
    result.replicas.push_back(*extent);
  }
  if (result.replicas.empty()) {
    result.status = Status(ErrorCode::NO_AVAILABLE_HANDLE,
                           "no segment has " + std::to_string(size) + " free bytes");
    return result;
  }
  result.put_gen = next_put_gen_++;
  return result;
}

PendingWrite MasterState::MakePending(const PutStartOp& op, uint64_t size,
                                      const PutStartKeyResult& placed, int64_t now) const {
  PendingWrite pending;
  pending.client_id = op.client_id;
  pending.gen = placed.put_gen;
  pending.version.size = size;
  pending.version.replicas = InlineVector<Extent>(placed.replicas);
  pending.version.persistence = op.config.persistence;
  pending.version.want_replicas =
      static_cast<uint8_t>(std::max<uint32_t>(op.config.replica_num, 1));
  pending.pin.hard = op.config.with_hard_pin;
  pending.pin.soft = op.config.with_soft_pin;
  pending.pin.soft_ttl_ms =
      op.config.soft_pin_ttl_ms > 0 ? op.config.soft_pin_ttl_ms : policy_.soft_pin_ttl_ms;
  pending.start_ms = now;
  return pending;
}

std::vector<Status> MasterState::ApplyPutEnd(const PutEndOp& op, int64_t now) {
  std::vector<Status> results(op.keys.size());
  if (Status limit = BatchLimit(op.keys.size()); !limit.ok()) {
    std::fill(results.begin(), results.end(), limit);
    return results;
  }
  if (op.checksums.size() != op.keys.size() || op.put_gens.size() != op.keys.size()) {
    std::fill(results.begin(), results.end(),
              Status(ErrorCode::INVALID_PARAMS, "keys, checksums and put generations differ in length"));
    return results;
  }
  for (const auto& [shard_index, indices] : GroupByShard(op.keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      auto it = shard.objects.find(op.keys[i]);
      if (it == shard.objects.end()) {
        results[i] = NotFound(op.keys[i]);
        continue;
      }
      ObjectMeta& meta = it->second;
      if (!meta.pending()) {
        results[i] = Status(ErrorCode::INVALID_WRITE, "object is not being written");
        continue;
      }
      if (meta.pending()->client_id != op.client_id) {
        results[i] = Status(ErrorCode::ILLEGAL_CLIENT, "only the writer may end a put");
        continue;
      }
      if (meta.pending()->gen != op.put_gens[i]) {
        results[i] = Status(ErrorCode::ILLEGAL_CLIENT,
                            "put generation " + std::to_string(op.put_gens[i]) +
                                " is not the pending one: another put of this key took over");
        continue;
      }
      CommitVersion(shard, it, std::move(meta.pending_mut()), op.checksums[i], i, op.keys.size(),
                    now);
    }
  }
  return results;
}

Status MasterState::MayWrite(Shard& shard, ObjectIter it, bool upsert, int64_t now,
                             const std::string& client_id, uint64_t op_first_gen) {
  if (it == shard.objects.end()) return Status::Ok();
  ObjectMeta& meta = it->second;
  if (meta.pending()) {
    const bool retried =
        meta.pending()->client_id == client_id && meta.pending()->gen < op_first_gen;
    if (!retried && !meta.pending()->writer_expired &&
        now - meta.pending()->start_ms < policy_.put_discard_timeout_ms) {
      return Status(ErrorCode::OBJECT_ALREADY_EXISTS, "object is being written");
    }
    // A zombie put: its writer may still scribble into the old extents until the release
    // timeout, so they are not reused before then.
    FreeLater(meta.pending()->version.replicas,
              meta.pending()->start_ms + policy_.put_release_timeout_ms, now);
    ClearPending(shard, it);
  }
  if (meta.committed && !upsert) return Status(ErrorCode::OBJECT_ALREADY_EXISTS, "object exists");
  return Status::Ok();
}

void MasterState::CommitVersion(Shard& shard, ObjectIter it, PendingWrite pending,
                                uint64_t checksum, size_t index, size_t batch_size,
                                int64_t now) {
  ObjectMeta& meta = it->second;
  const std::string_view key = it->first;
  std::optional<Version> replaced;  // what the old version counted, uncounted last
  if (meta.committed) {  // upsert: the old bytes go once no reader can be on them
    NoteCacheLeasesLeaving(key, meta);  // the writer waits for other clients' cached reads
    disk_replica_count_ -= meta.committed->disk.size();
    AddGarbage(key, meta.committed->disk);  // stale copies: their nodes delete them
    if (meta.demotion()) {                  // ...nor the demotion copying them to disk
      meta.HoldForDemotion(meta.committed->replicas);
    } else {
      FreeLater(meta.committed->replicas, meta.LatestLockExpiry(), now);
    }
    replaced.emplace();
    replaced->size = meta.committed->size;
    replaced->persistence = meta.committed->persistence;
    meta.committed.reset();
  } else {  // a new object enters its queue (an upsert keeps its place)
    meta.in_main = UsesQueues(policy_.eviction_policy) && GhostTake(key);
    meta.reads = 0;
    meta.queue_stamp = policy_.eviction_policy == EvictionPolicy::kPrefix
                           ? PrefixQueueStamp(now, index, batch_size)
                           : QueueStamp(now, index);
  }
  meta.committed = std::move(pending.version);
  meta.committed->checksum = checksum;
  meta.committed->gen = pending.gen;
  // A tenant's usage rises before it falls: a quota check of another put (under the tenant's
  // quota lock, not this shard's) never reads it between the pending's uncount and the commit's
  // count, where it would miss these bytes and admit one object too many.
  CountCommitted(key, *meta.committed);
  ClearPending(shard, it);
  if (replaced) UncountCommitted(key, *replaced);
  meta.hard_pinned = pending.pin.hard;
  if (pending.pin.soft) {
    meta.set_soft_pin(
        SoftPin{SaturatingAdd(now, pending.pin.soft_ttl_ms), pending.pin.soft_ttl_ms});
  } else {
    meta.reset_soft_pin();
  }
  meta.last_access_ms = now;
  NoteOffloadCandidate(shard, it);
  NoteCopyCandidate(shard, it);  // placed on fewer segments than it wants, or a draining one
}

std::vector<Status> MasterState::ApplyPutRevoke(const PutRevokeOp& op, int64_t now) {
  std::vector<Status> results(op.keys.size());
  if (Status limit = BatchLimit(op.keys.size()); !limit.ok()) {
    std::fill(results.begin(), results.end(), limit);
    return results;
  }
  if (op.put_gens.size() != op.keys.size()) {
    std::fill(results.begin(), results.end(),
              Status(ErrorCode::INVALID_PARAMS, "keys and put generations differ in length"));
    return results;
  }
  for (const auto& [shard_index, indices] : GroupByShard(op.keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      auto it = shard.objects.find(op.keys[i]);
      if (it == shard.objects.end()) {
        results[i] = NotFound(op.keys[i]);
        continue;
      }
      ObjectMeta& meta = it->second;
      if (!meta.pending()) {
        results[i] = Status(ErrorCode::INVALID_WRITE, "object is not being written");
        continue;
      }
      if (meta.pending()->client_id != op.client_id) {
        results[i] = Status(ErrorCode::ILLEGAL_CLIENT, "only the writer may revoke a put");
        continue;
      }
      if (meta.pending()->gen != op.put_gens[i]) {
        results[i] = Status(ErrorCode::ILLEGAL_CLIENT,
                            "put generation " + std::to_string(op.put_gens[i]) +
                                " is not the pending one: another put of this key took over");
        continue;
      }
      if (op.after_transfer_error) {
        // Bytes of the failed transfer may still reach the node: nobody gets this space before
        // the data plane has given up on them.
        FreeLater(meta.pending()->version.replicas, SaturatingAdd(now, policy_.write_quarantine_ms),
                  now);
      } else {
        FreeExtents(meta.pending()->version.replicas);  // the writer says it no longer writes
      }
      ClearPending(shard, it);
      EraseIfEmpty(shard, it);
    }
  }
  return results;
}

// ---------------------------------------------------------------------------------------------
// Reads

std::vector<ReadKeyResult> MasterState::ApplyGetReplicaList(const GetReplicaListOp& op,
                                                            int64_t now) {
  std::vector<ReadKeyResult> results(op.keys.size());
  Status batch_error = BatchLimit(op.keys.size());
  if (op.client_id.empty()) batch_error = Status(ErrorCode::INVALID_PARAMS, "client id is empty");
  if (!batch_error.ok()) {
    for (auto& r : results) r.status = batch_error;
    return results;
  }
  const std::vector<std::string_view> keys(op.keys.begin(), op.keys.end());
  // The op carries the lease granted (the service capped it by --cache-lease): a replica
  // replays it whatever its own flag says.
  const int64_t cache_until = op.cache_ms > 0 ? SaturatingAdd(now, op.cache_ms) : now;
  std::vector<size_t> newly_leased;  // indices of keys whose client had no cache lease on them
  FindEach(keys, [&](size_t i, ObjectMeta* found) {
    ReadKeyResult& out = results[i];
    if (Status s = ValidateKey(op.keys[i]); !s.ok()) {
      out.status = s;
      return;
    }
    if (found == nullptr) {
      out.status = NotFound(op.keys[i]);
      return;
    }
    ObjectMeta& meta = *found;
    if (!meta.committed) {
      out.status = Status(ErrorCode::REPLICA_IS_NOT_READY, "object is being written");
      return;
    }
    meta.DropExpiredLocks(now);
    meta.TakeReadLock(op.client_id, now + policy_.lease_ttl_ms);
    if (cache_until > now && !meta.committed->replicas.empty() &&  // disk only: nothing to cache
        meta.TakeCacheLease(op.client_id, cache_until)) {
      newly_leased.push_back(i);
    }
    meta.last_access_ms = now;
    if (meta.reads < kMaxQueueReads) meta.reads++;
    if (meta.soft_pin() && meta.soft_pin()->ttl_ms > 0) {
      meta.soft_pin_mut().until_ms = SaturatingAdd(now, meta.soft_pin()->ttl_ms);
    }
    out.size = meta.committed->size;
    out.checksum = meta.committed->checksum;
    out.replicas = meta.committed->replicas.ToVector();
    out.disk = meta.committed->disk.ToVector();
    out.version_gen = meta.committed->gen;
  });
  if (cache_until > now) cache_leases_.NoteGrant(cache_until);
  for (size_t i : newly_leased) {  // the sweep's list, which holds views of the stored keys
    Shard& shard = *shards_[ShardOf(op.keys[i])];
    std::lock_guard lock(shard.mu);
    auto it = shard.objects.find(op.keys[i]);
    if (it != shard.objects.end()) shard.cache_leased.insert(it->first);
  }
  return results;
}

std::vector<Status> MasterState::ApplyFinishRead(const FinishReadOp& op, int64_t now) {
  std::vector<Status> results(op.keys.size());
  if (Status limit = BatchLimit(op.keys.size()); !limit.ok()) {
    std::fill(results.begin(), results.end(), limit);
    return results;
  }
  const std::vector<std::string_view> keys(op.keys.begin(), op.keys.end());
  FindEach(keys, [&](size_t i, ObjectMeta* found) {
    if (found == nullptr) {
      results[i] = NotFound(op.keys[i]);
      return;
    }
    if (!found->ReleaseReadLock(op.client_id, now)) {
      results[i] = Status(ErrorCode::LEASE_EXPIRED, "no live read lock held by this client");
    }
  });
  return results;
}

// ---------------------------------------------------------------------------------------------
// Removal and eviction

void MasterState::DropCommitted(Shard& shard, ObjectIter it, int64_t now) {
  ObjectMeta& meta = it->second;
  disk_replica_count_ -= meta.committed->disk.size();
  AddGarbage(it->first, meta.committed->disk);  // their nodes delete them
  if (meta.demotion()) {  // a demotion may still read them: they go when it resolves
    meta.HoldForDemotion(meta.committed->replicas);
  } else if (meta.IsReadLocked(now)) {
    FreeLater(meta.committed->replicas, meta.LatestLockExpiry(), now);
  } else {
    FreeExtents(meta.committed->replicas);
  }
  UncountCommitted(it->first, *meta.committed);
  meta.committed.reset();
  DropReadLocks(it->first, meta);
  EraseIfEmpty(shard, it);
}

std::vector<Status> MasterState::ApplyRemove(const RemoveOp& op, int64_t now) {
  std::vector<Status> results(op.keys.size());
  if (Status limit = BatchLimit(op.keys.size()); !limit.ok()) {
    std::fill(results.begin(), results.end(), limit);
    return results;
  }
  for (const auto& [shard_index, indices] : GroupByShard(op.keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      if (Status s = ValidateKey(op.keys[i]); !s.ok()) {
        results[i] = s;
        continue;
      }
      auto it = shard.objects.find(op.keys[i]);
      if (it == shard.objects.end()) {
        results[i] = NotFound(op.keys[i]);
        continue;
      }
      ObjectMeta& meta = it->second;
      if (!meta.committed) {
        results[i] = Status(ErrorCode::REPLICA_IS_NOT_READY, "object is being written");
        continue;
      }
      if (!op.force && meta.IsBeingRead(now)) {
        results[i] = Status(ErrorCode::OBJECT_HAS_LEASE, "object is being read");
        continue;
      }
      DropCommitted(shard, it, now);
    }
  }
  return results;
}

RemoveCountResult MasterState::ApplyRemoveMatching(
    const std::function<bool(std::string_view)>& match, bool force, int64_t now) {
  RemoveCountResult result;
  for (auto& shard_ptr : shards_) {
    Shard& shard = *shard_ptr;
    std::lock_guard lock(shard.mu);
    // Key order, not the hash map's: the order of frees decides the allocators' later choices,
    // and a replica of this state (snapshot-loaded) iterates its maps differently.
    std::vector<std::string> matched;
    for (const auto& [key, meta] : shard.objects) {
      if (match(key)) matched.push_back(key.str());
    }
    std::sort(matched.begin(), matched.end());
    for (const auto& key : matched) {
      auto it = shard.objects.find(key);
      ObjectMeta& meta = it->second;
      if (!meta.committed || (!force && meta.IsBeingRead(now))) {
        result.skipped++;
        continue;
      }
      DropCommitted(shard, it, now);
      result.removed++;
    }
  }
  return result;
}

RemoveCountResult MasterState::ApplyRemoveByRegex(const RemoveByRegexOp& op, int64_t now) {
  auto re = CompilePattern(op.pattern);
  if (!re.ok()) return {re.status(), 0, 0};
  const RE2& pattern = **re;
  return ApplyRemoveMatching(
      [&](std::string_view key) { return RE2::PartialMatch(key, pattern); }, op.force, now);
}

// Eviction, the s3fifo ghost and the sweep: master_state_eviction.cc.

// ---------------------------------------------------------------------------------------------
// Bookkeeping helpers (caller holds the shard lock)

void MasterState::SetPending(Shard& shard, ObjectIter it, PendingWrite pending) {
  if (!it->second.pending()) {
    shard.pending_keys.insert(it->first);
    pending_count_++;
  } else {
    CountTenant(it->first, -static_cast<int64_t>(it->second.pending()->version.size), 0);
  }
  CountTenant(it->first, static_cast<int64_t>(pending.version.size), 0);
  it->second.set_pending(std::move(pending));
}

void MasterState::ClearPending(Shard& shard, ObjectIter it) {
  if (!it->second.pending()) return;
  // CommitVersion calls this on a pending it moved from: a move copies the size (a scalar), so
  // it is still the size that was counted.
  CountTenant(it->first, -static_cast<int64_t>(it->second.pending()->version.size), 0);
  shard.pending_keys.erase(std::string_view(it->first));
  it->second.reset_pending();
  pending_count_--;
}

void MasterState::EraseIfEmpty(Shard& shard, ObjectIter it) {
  if (it->second.committed || it->second.pending() || it->second.demotion() ||
      it->second.promotion()) {
    return;
  }
  NoteCacheLeasesLeaving(it->first, it->second);
  for (auto& [segment_class, keys] : shard.offload) keys.erase(std::string_view(it->first));
  shard.copy_candidates.erase(std::string_view(it->first));
  shard.cache_leased.erase(std::string_view(it->first));
  shard.objects.erase(it);
}

void MasterState::NoteCacheLeasesLeaving(std::string_view key, const ObjectMeta& meta) {
  for (const auto& lock : meta.readers()) {
    if (lock.count == 0) cache_leases_.Note(key, lock.client_id, lock.expiry_ms, last_now_ms_);
  }
}

void MasterState::DropReadLocks(std::string_view key, ObjectMeta& meta) {
  NoteCacheLeasesLeaving(key, meta);
  meta.ClearReadLocks();
}

int64_t MasterState::SettleUntil(std::string_view caller,
                                 const std::vector<std::string>& keys) const {
  return cache_leases_.SettleUntil(keys, caller);
}

void MasterState::FreeExtents(std::span<const Extent> extents) {
  for (const auto& e : extents) segments_.Free(e);
}

void MasterState::FreeLater(std::span<const Extent> extents, int64_t release_at_ms,
                            int64_t now) {
  if (release_at_ms <= now) {
    FreeExtents(extents);
    return;
  }
  std::lock_guard lock(deferred_mu_);
  for (const auto& e : extents) deferred_.push_back({e, release_at_ms});
}

size_t MasterState::deferred_free_count() const {
  std::lock_guard lock(deferred_mu_);
  return deferred_.size();
}

}  // namespace granary::master

