#include "master/policy/offload_planner.h"

#include <algorithm>
#include <tuple>

namespace granary::master {

Result<Persistence> ParsePersistence(const std::string& name) {
  if (name == "eager") return Persistence::kEager;
  if (name == "lazy") return Persistence::kLazy;
  if (name == "none") return Persistence::kNone;
  return Status(ErrorCode::INVALID_PARAMS,
                "persistence '" + name.substr(0, 64) + "' is none of eager, lazy, none");
}

Persistence EffectivePersistence(PutPersistence put, Persistence policy) {
  switch (put) {
    case PutPersistence::kEager: return Persistence::kEager;
    case PutPersistence::kLazy: return Persistence::kLazy;
    case PutPersistence::kNone: return Persistence::kNone;
    case PutPersistence::kDefault: break;
  }
  return policy;
}

std::vector<std::string> OffloadPlanner::Plan(const std::string& node_id, size_t max_keys,
                                              uint64_t max_bytes) const {
  if (max_keys == 0 || max_bytes == 0) return {};
  // Read once: an object committed meanwhile waits for the next round, like any other.
  const bool overrides = state_->explicit_persistence_count() > 0;
  if (!overrides && policy_.persistence == Persistence::kNone) return {};
  const std::vector<uint64_t> own = state_->segments().SegmentsOf(node_id);
  if (own.empty()) return {};
  uint64_t used = 0, capacity = 0;
  for (const auto& u : state_->segments().Usage()) {
    if (std::find(own.begin(), own.end(), u.identity->id) == own.end()) continue;
    used += u.stats.used_bytes;
    capacity += u.stats.capacity;
  }
  const bool lazy_due =
      capacity > 0 &&
      static_cast<double>(used) >= policy_.offload_watermark * static_cast<double>(capacity);
  if (!overrides && policy_.persistence == Persistence::kLazy && !lazy_due) return {};
  // (class, order, key, bytes): eager (class 0) by queue position (commit order) before lazy
  // (class 1) by last read.
  std::vector<std::tuple<int, int64_t, std::string, uint64_t>> candidates;
  for (size_t s = 0; s < state_->shard_count(); ++s) {
    state_->ScanShard(s, [&](const std::string& key, const ObjectMeta& meta) {
      if (!meta.committed || meta.demotion) return;
      const Version& v = *meta.committed;
      const Persistence wanted = EffectivePersistence(v.persistence, policy_.persistence);
      if (wanted == Persistence::kNone) return;
      if (wanted == Persistence::kLazy && !lazy_due) return;
      if (v.offload_declined) return;  // a disk evicted it already
      if (std::any_of(v.disk.begin(), v.disk.end(),
                      [&](const DiskReplica& d) { return d.node_id == node_id; })) {
        return;
      }
      if (std::none_of(v.replicas.begin(), v.replicas.end(), [&](const Extent& e) {
            return std::find(own.begin(), own.end(), e.segment_id) != own.end();
          })) {
        return;
      }
      if (wanted == Persistence::kEager) {
        candidates.emplace_back(0, meta.queue_stamp, key, v.size);
      } else {
        candidates.emplace_back(1, meta.last_access_ms, key, v.size);
      }
    });
  }
  std::sort(candidates.begin(), candidates.end());
  std::vector<std::string> plan;
  uint64_t bytes = 0;
  for (auto& [rank, order, key, size] : candidates) {
    if (plan.size() >= max_keys || bytes >= max_bytes) break;
    plan.push_back(std::move(key));
    bytes += size;
  }
  return plan;
}

}  // namespace granary::master
