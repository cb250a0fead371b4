// MasterState: replica counts, re-replication copies and drains (operations.h: SetReplicasOp,
// ReplicaCopyStartOp, ReplicaCopyEndOp, DrainOp, DrainFinishOp).
//
// A copy reuses the promotion record (object_meta.h, Promotion with `copy`): one allocation of
// the object's size on the copying node's own segment, never named to a reader until its end
// attaches it to the version it copied, freed when the node says its write is over, when its
// next copy round starts (rounds are serial), or with the segment.
#include <algorithm>
#include <map>
#include <tuple>

#include "master/state/master_state.h"
#include "master/state/state_internal.h"

namespace granary::master {

using namespace internal;

bool MasterState::NodeDraining(const std::string& node_id) const {
  const std::vector<uint64_t> own = segments_.SegmentsOf(node_id);
  if (own.empty()) return false;
  return std::all_of(own.begin(), own.end(), [&](uint64_t id) { return segments_.IsDraining(id); });
}

uint32_t MasterState::CopiesNeeded(const ObjectMeta& meta) const {
  if (!meta.committed) return 0;
  const Version& v = *meta.committed;
  uint32_t live = 0;
  bool on_draining = false;
  for (const Extent& e : v.replicas) {
    if (segments_.IsDraining(e.segment_id)) {
      on_draining = true;
    } else {
      live++;
    }
  }
  uint32_t want = v.want_replicas;
  // What only a draining segment holds in memory keeps one copy at least.
  if (on_draining) want = std::max<uint32_t>(want, 1);
  // A disk-only object (its memory was evicted) whose every disk copy is on a draining node:
  // one memory copy, else the drain would take its last copy away.
  if (v.replicas.empty() && !v.disk.empty() &&
      std::all_of(v.disk.begin(), v.disk.end(),
                  [&](const DiskReplica& d) { return NodeDraining(d.node_id); })) {
    want = std::max<uint32_t>(want, 1);
  }
  return want > live ? want - live : 0;
}

std::vector<Status> MasterState::ApplySetReplicas(const SetReplicasOp& op, int64_t now) {
  std::vector<Status> results(op.keys.size());
  Status batch_error = BatchLimit(op.keys.size());
  if (op.replica_num == 0 || op.replica_num > kMaxReplicas) {
    batch_error = Status(ErrorCode::INVALID_PARAMS,
                         "replica count " + std::to_string(op.replica_num) +
                             " is outside 1.." + std::to_string(kMaxReplicas));
  }
  if (!batch_error.ok()) {
    std::fill(results.begin(), results.end(), batch_error);
    return results;
  }
  std::map<uint64_t, double> fullness;  // segment id -> used share, read once if needed
  for (const auto& [shard_index, indices] : GroupByShard(op.keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      if (Status s = ValidateKey(op.keys[i]); !s.ok()) {
        results[i] = s;
        continue;
      }
      auto it = shard.objects.find(op.keys[i]);
      if (it == shard.objects.end() || !it->second.committed) {
        results[i] = NotFound(op.keys[i]);
        continue;
      }
      ObjectMeta& meta = it->second;
      Version& v = *meta.committed;
      if (op.replica_num > v.want_replicas) replica_epoch_++;
      v.want_replicas = static_cast<uint8_t>(op.replica_num);
      NoteCopyCandidate(shard, it);
      if (v.replicas.size() <= op.replica_num) continue;  // copies follow (ReplicaCopyStart)
      // The surplus goes: draining segments' replicas first, then the fullest segments'; ties
      // by segment id, so replay drops the same ones.
      if (fullness.empty()) {
        for (const auto& u : segments_.Usage()) {
          fullness[u.identity->id] =
              u.stats.capacity == 0 ? 0.0
                                    : static_cast<double>(u.stats.used_bytes) /
                                          static_cast<double>(u.stats.capacity);
        }
      }
      std::vector<std::tuple<bool, double, uint64_t, size_t>> order;
      for (size_t r = 0; r < v.replicas.size(); ++r) {
        const Extent& e = v.replicas[r];
        order.emplace_back(!segments_.IsDraining(e.segment_id), -fullness[e.segment_id],
                           e.segment_id, r);
      }
      std::sort(order.begin(), order.end());
      std::vector<size_t> drop;
      for (size_t k = 0; k < v.replicas.size() - op.replica_num; ++k) {
        drop.push_back(std::get<3>(order[k]));
      }
      std::sort(drop.begin(), drop.end(), std::greater<>());
      std::vector<Extent> retired;
      for (size_t r : drop) {
        retired.push_back(v.replicas[r]);
        v.replicas.erase(v.replicas.begin() + static_cast<std::ptrdiff_t>(r));
      }
      // Readers named them until now: the space waits for their locks. A demotion reading one
      // holds it until it resolves.
      if (meta.demotion()) {
        meta.HoldForDemotion(retired);
      } else if (meta.IsReadLocked(now)) {
        FreeLater(retired, meta.LatestLockExpiry(), now);
      } else {
        FreeExtents(retired);
      }
    }
  }
  return results;
}

std::vector<ReplicaCopyKeyResult> MasterState::ApplyReplicaCopyStart(
    const ReplicaCopyStartOp& op, int64_t now) {
  std::vector<ReplicaCopyKeyResult> results(op.keys.size());
  Status batch_error = BatchLimit(op.keys.size());
  if (op.node_id.empty()) batch_error = Status(ErrorCode::INVALID_PARAMS, "node id is empty");
  if (op.round == 0) batch_error = Status(ErrorCode::INVALID_PARAMS, "round is 0");
  if (!batch_error.ok()) {
    for (auto& r : results) r.status = batch_error;
    return results;
  }
  // The node's earlier copy rounds are over: what it did not report, it no longer writes.
  EndEarlierRounds(op.node_id, op.round, /*copies=*/true);
  const std::vector<uint64_t> own = segments_.SegmentsOf(op.node_id);
  for (const auto& [shard_index, indices] : GroupByShard(op.keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      ReplicaCopyKeyResult& out = results[i];
      auto it = shard.objects.find(op.keys[i]);
      if (it == shard.objects.end() || !it->second.committed) {
        out.status = NotFound(op.keys[i]);
        continue;
      }
      ObjectMeta& meta = it->second;
      if (meta.promotion()) {
        out.status = Status(ErrorCode::OBJECT_ALREADY_EXISTS, "object is being copied already");
        continue;
      }
      if (CopiesNeeded(meta) == 0) {
        out.status = Status(ErrorCode::OBJECT_ALREADY_EXISTS, "object has its replicas");
        continue;
      }
      const Version& v = *meta.committed;
      if (std::any_of(v.replicas.begin(), v.replicas.end(), [&](const Extent& e) {
            return std::find(own.begin(), own.end(), e.segment_id) != own.end();
          })) {
        out.status = Status(ErrorCode::OBJECT_ALREADY_EXISTS, "this node holds a replica already");
        continue;
      }
      auto extent = AllocateForPromotion(op.node_id, v.size, now);  // skips draining segments
      if (!extent) {
        out.status = Status(ErrorCode::NO_AVAILABLE_HANDLE,
                            "no segment of the node takes it below the eviction watermark");
        continue;
      }
      meta.set_promotion(Promotion{op.node_id, v.gen, *extent, 0, op.round, now, /*copy=*/true});
      shard.promoting_keys.insert(it->first);
      copies_in_flight_++;
      // Its sources are not reused before the copy ends or this lease does (DropCommitted and
      // SetReplicas free locked memory only after the locks' expiry).
      meta.DropExpiredLocks(now);
      meta.TakeReadLock(op.node_id, now + policy_.lease_ttl_ms);
      out = {Status::Ok(), v.gen, v.size, v.checksum, v.replicas.ToVector(), v.disk.ToVector(),
             *extent};
    }
  }
  return results;
}

std::vector<Status> MasterState::ApplyReplicaCopyEnd(const ReplicaCopyEndOp& op) {
  return EndMemoryCopies(op.node_id, op.round, op.keys, op.version_gens, op.copied,
                         /*copies=*/true);
}

size_t MasterState::CopiesOf(const std::string& node_id) const {
  if (copies_in_flight() == 0) return 0;
  size_t count = 0;
  for (const auto& shard_ptr : shards_) {
    std::lock_guard lock(shard_ptr->mu);
    for (std::string_view key : shard_ptr->promoting_keys) {
      const Promotion& p = *shard_ptr->objects.find(key)->second.promotion();
      count += p.copy && p.node_id == node_id;
    }
  }
  return count;
}

void MasterState::ClearCopy(Shard& shard, ObjectIter it, bool free_extent) {
  ObjectMeta& meta = it->second;
  if (!meta.promotion()) return;
  const std::string node = meta.promotion()->node_id;
  meta.ReleaseReadLock(node);
  ClearPromotion(shard, it, free_extent);
}

DrainResult MasterState::ApplyDrain(const DrainOp& op, int64_t now) {
  replica_epoch_++;
  if (op.undrain) return {segments_.StopDrain(op.name), 0};
  if (Status s = segments_.StartDrain(op.name, op.drop, now); !s.ok()) return {s, 0};
  if (!op.drop) {
    // What the segment (or its node's disk) alone holds needs copies: the next walk finds it.
    copy_walk_pending_ = true;
    return {Status::Ok(), 0};
  }
  // Nothing is copied for its sake: it goes now, as a dead node's would.
  return ApplyDrainFinish(DrainFinishOp{op.name}, now);
}

DrainResult MasterState::ApplyDrainFinish(const DrainFinishOp& op, int64_t now) {
  const auto drains = segments_.Drains();
  auto it = drains.find(op.name);
  if (it == drains.end() || it->second.done) {
    return {Status(ErrorCode::SEGMENT_NOT_FOUND, "segment '" + op.name + "' is not draining"), 0};
  }
  UnmountResult unmounted = ApplyUnmount(UnmountSegmentOp{"", op.name}, now);
  segments_.MarkDrained(op.name);
  return {Status::Ok(), unmounted.dropped_replicas};
}

}  // namespace granary::master
