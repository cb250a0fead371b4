#include "master/evictor.h"

#include <algorithm>
#include <vector>

namespace granary::master {

namespace {
constexpr uint64_t kExactScanLimit = 1 << 20;

}  // namespace

EvictResult Evictor::EvictBytes(uint64_t target_bytes) {
  std::lock_guard lock(mu_);
  runs_++;
  EvictResult total = EvictPass(target_bytes, /*allow_soft_pinned=*/false);
  if (total.bytes < target_bytes && state_->policy().allow_evict_soft_pinned) {
    EvictResult more = EvictPass(target_bytes - total.bytes, /*allow_soft_pinned=*/true);
    total.objects += more.objects;
    total.bytes += more.bytes;
  }
  return total;
}

EvictResult Evictor::RunIfAboveWatermark() {
  const auto& policy = state_->policy();
  const double capacity = static_cast<double>(state_->segments().total_capacity());
  const double used = static_cast<double>(state_->segments().used_bytes());
  if (capacity <= 0 || used < policy.eviction_high_watermark * capacity) return {};
  double target = used - policy.eviction_high_watermark * capacity + policy.eviction_ratio * capacity;
  return EvictBytes(static_cast<uint64_t>(target));
}

EvictResult Evictor::EvictForAllocation(uint64_t needed) {
  const double capacity = static_cast<double>(state_->segments().total_capacity());
  uint64_t by_ratio = static_cast<uint64_t>(state_->policy().eviction_ratio * capacity);
  return EvictBytes(std::max(needed, by_ratio));
}

EvictResult Evictor::EvictPass(uint64_t target_bytes, bool allow_soft_pinned) {
  if (target_bytes == 0) return {};
  const int64_t now = state_->clock()->NowMs();
  const uint64_t stride = state_->object_count() / kExactScanLimit + 1;

  // Pass 1: the age distribution of what may be evicted.
  std::vector<std::pair<int64_t, uint64_t>> ages;  // (last access, bytes)
  uint64_t seen = 0;
  for (size_t s = 0; s < state_->shard_count(); ++s) {
    state_->ScanShard(s, [&](const std::string&, const ObjectMeta& meta) {
      if (!meta.IsEvictable(now, allow_soft_pinned)) return;
      if (seen++ % stride == 0) {
        ages.emplace_back(meta.last_access_ms, OccupiedBytes(meta.committed->replicas) * stride);
      }
    });
  }
  if (ages.empty()) return {};
  std::sort(ages.begin(), ages.end());
  int64_t threshold = ages.back().first;
  uint64_t accumulated = 0;
  for (const auto& [access, bytes] : ages) {
    accumulated += bytes;
    if (accumulated >= target_bytes) {
      threshold = access;
      break;
    }
  }

  // Pass 2: the keys older than the threshold, then ties at it until the target is met.
  std::vector<std::string> victims;
  std::vector<std::pair<std::string, uint64_t>> ties;
  uint64_t chosen = 0;
  for (size_t s = 0; s < state_->shard_count(); ++s) {
    state_->ScanShard(s, [&](const std::string& key, const ObjectMeta& meta) {
      if (!meta.IsEvictable(now, allow_soft_pinned) || meta.last_access_ms > threshold) return;
      if (meta.last_access_ms < threshold) {
        victims.push_back(key);
        chosen += OccupiedBytes(meta.committed->replicas);
      } else {
        ties.emplace_back(key, OccupiedBytes(meta.committed->replicas));
      }
    });
  }
  for (auto& [key, bytes] : ties) {
    if (chosen >= target_bytes) break;
    victims.push_back(std::move(key));
    chosen += bytes;
  }
  return state_->Evict(EvictOp{std::move(victims), allow_soft_pinned});
}

}  // namespace granary::master
