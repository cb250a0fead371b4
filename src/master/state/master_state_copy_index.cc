// MasterState: the re-replication planner's index (master_state.h, Shard::copy_candidates).
//
// Why an index: the planner looks for objects short of memory replicas whenever the replica
// epoch moves (every mount, unmount, drain, raised count, failed copy) and every two seconds
// while copies are under way. A walk over every object made each of those cost the whole master
// (10M objects: seconds, many times during one node's re-replication) although only the objects
// a lost node or a drain touched need anything. The index lists the objects that may need copies
// where they can come to: a walk that finds one needing none drops it, so a healthy object costs
// nothing and a re-replicated one costs one more visit. What a drain puts in need (all that its
// segment, or its node's disk, alone holds) is found by one walk over every object, the first
// after the drain began: on the planner's thread, shard by shard, not in the apply path.
#include "master/state/master_state.h"

namespace granary::master {

void MasterState::NoteCopyCandidate(Shard& shard, ObjectIter it) {
  const ObjectMeta& meta = it->second;
  if (!meta.committed) return;
  // Without a drain under way CopiesNeeded is what the replicas lack of the wanted count: no
  // segment lookups on the commit path, nor per object of a load.
  const bool needs = segments_.AnyDrainUnderWay()
                         ? CopiesNeeded(meta) > 0
                         : meta.committed->replicas.size() < meta.committed->want_replicas;
  if (needs) shard.copy_candidates.insert(it->first);
}

void MasterState::ScanCopyCandidates(const CopyVisit& fn) const {
  // Taken before the walk: a drain that begins meanwhile makes the next walk a full one too.
  const bool every_object = copy_walk_pending_.exchange(false);
  for (const auto& shard_ptr : shards_) {
    const Shard& shard = *shard_ptr;
    std::lock_guard lock(shard.mu);
    auto& keys = shard.copy_candidates;
    if (every_object) {
      for (const auto& [key, meta] : shard.objects) {
        if (CopiesNeeded(meta) > 0) keys.insert(key);
      }
    }
    for (auto key = keys.begin(); key != keys.end();) {
      // Erased keys leave the index first (EraseIfEmpty): the view is always found.
      auto object = shard.objects.find(*key);
      if (object == shard.objects.end() || CopiesNeeded(object->second) == 0) {
        key = keys.erase(key);
        continue;
      }
      fn(object->first, object->second);
      ++key;
    }
  }
}

size_t MasterState::copy_index_size() const {
  size_t n = 0;
  for (const auto& shard_ptr : shards_) {
    std::lock_guard lock(shard_ptr->mu);
    n += shard_ptr->copy_candidates.size();
  }
  return n;
}

}  // namespace granary::master
