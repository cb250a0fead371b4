#include "master/offload_planner.h"

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

std::vector<std::string> OffloadPlanner::Plan(const std::string& node_id, size_t max_keys,
                                              uint64_t max_bytes) const {
  if (policy_.persistence == Persistence::kNone || max_keys == 0 || max_bytes == 0) return {};
  const std::vector<uint64_t> own = state_->segments().SegmentsOf(node_id);
  if (own.empty()) return {};
  if (policy_.persistence == Persistence::kLazy) {
    uint64_t used = 0, capacity = 0;
    for (const auto& u : state_->segments().Usage()) {
      if (std::find(own.begin(), own.end(), u.identity->id) == own.end()) continue;
      used += u.stats.used_bytes;
      capacity += u.stats.capacity;
    }
    if (capacity == 0 ||
        static_cast<double>(used) < policy_.offload_watermark * static_cast<double>(capacity)) {
      return {};
    }
  }
  // (order, key, bytes): eager orders by queue position (commit order), lazy by last read.
  std::vector<std::tuple<int64_t, std::string, uint64_t>> candidates;
  for (size_t s = 0; s < state_->shard_count(); ++s) {
    state_->ScanShard(s, [&](const std::string& key, const ObjectMeta& meta) {
      if (!meta.committed || meta.demotion) return;
      const Version& v = *meta.committed;
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
      const int64_t order =
          policy_.persistence == Persistence::kEager ? meta.queue_stamp : meta.last_access_ms;
      candidates.emplace_back(order, key, v.size);
    });
  }
  std::sort(candidates.begin(), candidates.end());
  std::vector<std::string> plan;
  uint64_t bytes = 0;
  for (auto& [order, key, size] : candidates) {
    if (plan.size() >= max_keys || bytes >= max_bytes) break;
    plan.push_back(std::move(key));
    bytes += size;
  }
  return plan;
}

}  // namespace granary::master
