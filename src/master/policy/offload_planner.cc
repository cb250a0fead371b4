#include "master/policy/offload_planner.h"

#include <algorithm>
#include <optional>
#include <queue>
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

std::optional<std::pair<int, int64_t>> LazyOffloadOrder(const ObjectMeta& meta,
                                                        EvictionPolicy policy) {
  if (policy != EvictionPolicy::kPrefix) return std::pair<int, int64_t>{1, meta.last_access_ms};
  // Memory eviction's own order: probation by class (1, 2, 3), then main, all by queue stamp.
  if (meta.in_main) return std::pair<int, int64_t>{4, meta.queue_stamp};
  const int probation_class = ProbationClass(meta.queue_stamp);
  // A batch's unread tail (class 0) is read again about 1% of the time: its copy would take the
  // disk space of blocks that are (the simulator: +0.7-1.1% hit rate on both traces). Once
  // read, it goes to the main queue at eviction's next pass, and is copied as one of main's.
  if (probation_class == 0) {
    if (meta.reads == 0) return std::nullopt;
    return std::pair<int, int64_t>{4, meta.queue_stamp};
  }
  return std::pair<int, int64_t>{probation_class, meta.queue_stamp};
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
  // The put persistences worth visiting now (the index keeps them apart): lazy ones only while
  // due, the master's default by its policy.
  std::vector<PutPersistence> classes = {PutPersistence::kEager};
  if (lazy_due) classes.push_back(PutPersistence::kLazy);
  if (policy_.persistence == Persistence::kEager ||
      (policy_.persistence == Persistence::kLazy && lazy_due)) {
    classes.push_back(PutPersistence::kDefault);
  }
  // The max_keys first of (class, order, key, bytes): eager (class 0) by queue position (commit
  // order) before lazy (class 1) by last read. A max-heap of the best so far: its top is the
  // worst kept, and a key is copied only when it gets in.
  using Candidate = std::tuple<int, int64_t, std::string, uint64_t>;
  std::priority_queue<Candidate> best;
  auto visit = [&](uint64_t segment, std::string_view key, const ObjectMeta& meta) {
    if (!meta.committed) return false;
    const Version& v = *meta.committed;
    if (v.offload_declined || v.persistence == PutPersistence::kNone) return false;
    auto own_replica = [&](const Extent& e) {
      return std::find(own.begin(), own.end(), e.segment_id) != own.end();
    };
    auto first_own = std::find_if(v.replicas.begin(), v.replicas.end(), own_replica);
    if (std::none_of(v.replicas.begin(), v.replicas.end(),
                     [&](const Extent& e) { return e.segment_id == segment; })) {
      return false;  // its memory left this segment
    }
    if (std::any_of(v.disk.begin(), v.disk.end(),
                    [&](const DiskReplica& d) { return d.node_id == node_id; })) {
      return false;  // this node holds its disk copy
    }
    if (meta.demotion()) return true;                   // under way (or given up: then next round)
    if (first_own->segment_id != segment) return true;  // met through its first own segment
    const Persistence wanted = EffectivePersistence(v.persistence, policy_.persistence);
    if (wanted == Persistence::kNone || (wanted == Persistence::kLazy && !lazy_due)) return true;
    const std::optional<std::pair<int, int64_t>> place =
        wanted == Persistence::kEager
            ? std::pair<int, int64_t>{0, meta.queue_stamp}
            : LazyOffloadOrder(meta, state_->policy().eviction_policy);
    if (!place) return true;  // kept listed: a read may yet move it to the main queue
    const auto [rank, order] = *place;
    if (best.size() < max_keys) {
      best.emplace(rank, order, key, v.size);
      return true;
    }
    const Candidate& worst = best.top();
    if (std::tie(rank, order) < std::tie(std::get<0>(worst), std::get<1>(worst)) ||
        (rank == std::get<0>(worst) && order == std::get<1>(worst) && key < std::get<2>(worst))) {
      best.pop();
      best.emplace(rank, order, key, v.size);
    }
    return true;
  };
  state_->ScanOffloadCandidates(own, classes, visit);
  std::vector<Candidate> ranked;
  ranked.reserve(best.size());
  while (!best.empty()) {
    ranked.push_back(best.top());
    best.pop();
  }
  std::reverse(ranked.begin(), ranked.end());
  std::vector<std::string> plan;
  uint64_t bytes = 0;
  for (auto& [rank, order, key, size] : ranked) {
    if (bytes >= max_bytes) break;
    plan.push_back(std::move(key));
    bytes += size;
  }
  return plan;
}

}  // namespace granary::master
