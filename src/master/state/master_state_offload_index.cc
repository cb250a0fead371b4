// MasterState: the offload planner's index (master_state.h, Shard::offload).
//
// Why an index: the planner asks every node with a disk, every second, for the objects on its
// segments that still lack its disk copy. A walk over every object made each call cost the whole
// master (10M objects: seconds per call) although, in a steady state, a call names a few fresh
// objects or none. The index lists, per segment and put persistence, the keys that got memory
// there; the walk drops what it finds no longer qualifying, so an object costs one visit after
// it was offloaded, and persistences the planner does not want now (lazy below the watermark)
// are not visited at all.
#include "master/state/master_state.h"

namespace granary::master {

void MasterState::NoteOffloadCandidate(Shard& shard, ObjectIter it) {
  if (!offload_index_on_) return;
  const ObjectMeta& meta = it->second;
  if (!meta.committed) return;
  const Version& v = *meta.committed;
  if (v.persistence == PutPersistence::kNone || v.offload_declined) return;
  for (const Extent& e : v.replicas) {
    shard.offload[{e.segment_id, v.persistence}].insert(it->first);
  }
}

void MasterState::BuildOffloadIndex() {
  offload_index_on_ = true;
  for (auto& shard_ptr : shards_) {
    Shard& shard = *shard_ptr;
    std::lock_guard lock(shard.mu);
    shard.offload.clear();
    for (auto it = shard.objects.begin(); it != shard.objects.end(); ++it) {
      NoteOffloadCandidate(shard, it);
    }
  }
}

void MasterState::ScanOffloadCandidates(std::span<const uint64_t> segments,
                                        std::span<const PutPersistence> classes,
                                        const OffloadVisit& fn) const {
  for (const auto& shard_ptr : shards_) {
    const Shard& shard = *shard_ptr;
    std::lock_guard lock(shard.mu);
    if (shard.offload.empty()) continue;
    for (uint64_t segment : segments) {
      for (PutPersistence persistence : classes) {
        auto listed = shard.offload.find({segment, persistence});
        if (listed == shard.offload.end()) continue;
        auto& keys = listed->second;
        for (auto key = keys.begin(); key != keys.end();) {
          auto object = shard.objects.find(*key);
          // Erased keys leave the index first (EraseIfEmpty): the view is always found. A key
          // listed by an earlier version of another persistence is met under the current one.
          const bool listed_right = object != shard.objects.end() &&
                                    object->second.committed &&
                                    object->second.committed->persistence == persistence;
          if (listed_right && fn(segment, object->first, object->second)) {
            ++key;
          } else {
            key = keys.erase(key);
          }
        }
        if (keys.empty()) shard.offload.erase(listed);
      }
    }
  }
}

size_t MasterState::offload_index_size() const {
  size_t n = 0;
  for (const auto& shard_ptr : shards_) {
    std::lock_guard lock(shard_ptr->mu);
    for (const auto& [segment_class, keys] : shard_ptr->offload) n += keys.size();
  }
  return n;
}

}  // namespace granary::master
