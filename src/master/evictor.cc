#include "master/evictor.h"

#include <xxhash.h>

#include <algorithm>
#include <deque>
#include <unordered_map>
#include <vector>

namespace granary::master {

namespace {
constexpr uint64_t kExactScanLimit = 1 << 20;

}  // namespace

EvictResult Evictor::EvictBytes(uint64_t target_bytes) {
  std::lock_guard lock(mu_);
  runs_++;
  EvictResult total = EvictPass(target_bytes, /*allow_soft_pinned=*/false);
  // s3fifo's victims can be saved by a read between choice and apply, and its passes move read
  // objects along: go round again (bounded: each object holds at most kMaxQueueReads credits)
  // before anything soft-pinned is touched.
  for (int round = 0; round < kMaxQueueReads + 1 && total.bytes < target_bytes &&
                      state_->policy().eviction_policy == EvictionPolicy::kS3Fifo;
       ++round) {
    EvictResult more = EvictPass(target_bytes - total.bytes, /*allow_soft_pinned=*/false);
    if (more.bytes == 0 && more.objects == 0) break;
    total.objects += more.objects;
    total.bytes += more.bytes;
  }
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

EvictResult Evictor::EvictForAllocation(uint64_t needed, uint64_t largest_request) {
  {
    // Re-check under the lock: a put that failed while another thread's eviction ran may find
    // the space already there, and must not evict a second share of the cache for it.
    std::lock_guard lock(mu_);
    uint64_t free_bytes = 0, largest_free = 0;
    for (const auto& u : state_->segments().Usage()) {
      if (u.identity->usable_from_ms > state_->clock()->NowMs()) continue;
      free_bytes += u.stats.free_bytes;
      largest_free = std::max(largest_free, u.stats.largest_free_block);
    }
    if (free_bytes >= needed && largest_free >= largest_request) return {};
  }
  const double capacity = static_cast<double>(state_->segments().total_capacity());
  uint64_t by_ratio = static_cast<uint64_t>(state_->policy().eviction_ratio * capacity);
  // One allocation never flushes more than a quarter of the cache (or the eviction ratio).
  uint64_t cap = std::max(by_ratio, static_cast<uint64_t>(capacity / 4));
  return EvictBytes(std::min(std::max(needed, by_ratio), cap));
}

EvictResult Evictor::EvictPass(uint64_t target_bytes, bool allow_soft_pinned) {
  if (target_bytes == 0) return {};
  if (state_->policy().eviction_policy == EvictionPolicy::kS3Fifo) {
    return S3FifoPass(target_bytes, allow_soft_pinned);
  }
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

EvictResult Evictor::S3FifoPass(uint64_t target_bytes, bool allow_soft_pinned) {
  const int64_t now = state_->clock()->NowMs();
  struct Entry {
    int64_t stamp;
    uint64_t hash;
    uint64_t bytes;
    uint8_t reads;
  };
  // Pass 1: both queues' evictable objects, and their bytes per queue.
  std::vector<Entry> small, main;
  uint64_t small_bytes = 0, total_bytes = 0;
  for (size_t s = 0; s < state_->shard_count(); ++s) {
    state_->ScanShard(s, [&](const std::string& key, const ObjectMeta& meta) {
      // Only what could go counts toward the queues' shares: pinned or locked bytes never leave
      // probation, and counting them would make every pass drain it first.
      if (!meta.IsEvictable(now, allow_soft_pinned)) return;
      // The soft pass runs after the unpinned ones: it takes soft-pinned objects only.
      if (allow_soft_pinned && !meta.IsSoftPinned(now)) return;
      const uint64_t bytes = OccupiedBytes(meta.committed->replicas);
      total_bytes += bytes;
      if (!meta.in_main) small_bytes += bytes;
      (meta.in_main ? main : small)
          .push_back({meta.queue_stamp, XXH3_64bits(key.data(), key.size()), bytes, meta.reads});
    });
  }
  auto by_stamp = [](const Entry& a, const Entry& b) {
    return a.stamp != b.stamp ? a.stamp < b.stamp : a.hash < b.hash;
  };
  std::sort(small.begin(), small.end(), by_stamp);
  std::sort(main.begin(), main.end(), by_stamp);

  // S3-FIFO over the snapshot. Each pop evicts, or promotes (once per object), or spends one of
  // at most kMaxQueueReads reads, so the loop ends.
  std::deque<Entry> main_queue(main.begin(), main.end());
  std::unordered_map<uint64_t, uint32_t> requeue;  // hash -> times passed over
  std::vector<uint64_t> requeue_order;
  std::unordered_map<uint64_t, bool> victims;  // hash -> chosen
  uint64_t chosen = 0;
  size_t next_small = 0;
  const double small_share = state_->policy().eviction_small_ratio;
  auto pass_over = [&](const Entry& e) {
    if (requeue[e.hash]++ == 0) requeue_order.push_back(e.hash);
  };
  while (chosen < target_bytes) {
    const bool from_small =
        next_small < small.size() &&
        (main_queue.empty() || static_cast<double>(small_bytes) > small_share * total_bytes);
    if (from_small) {
      Entry e = small[next_small++];
      small_bytes -= e.bytes;
      if (e.reads > 0) {  // read while on probation: promoted, starting with no reads
        pass_over(e);
        e.reads = 0;
        main_queue.push_back(e);
        continue;
      }
      victims[e.hash] = true;
      chosen += e.bytes;
      total_bytes -= e.bytes;
    } else if (!main_queue.empty()) {
      Entry e = main_queue.front();
      main_queue.pop_front();
      if (e.reads > 0) {
        pass_over(e);
        e.reads--;
        main_queue.push_back(e);
        continue;
      }
      victims[e.hash] = true;
      chosen += e.bytes;
      total_bytes -= e.bytes;
    } else {
      break;
    }
  }
  if (victims.empty() && requeue.empty()) return {};

  // Pass 2: the keys of the chosen hashes.
  EvictOp op;
  op.allow_soft_pinned = allow_soft_pinned;
  std::unordered_map<uint64_t, std::string> requeue_keys;
  for (size_t s = 0; s < state_->shard_count(); ++s) {
    state_->ScanShard(s, [&](const std::string& key, const ObjectMeta& meta) {
      if (!meta.committed) return;
      const uint64_t hash = XXH3_64bits(key.data(), key.size());
      if (victims.contains(hash)) op.keys.push_back(key);
      if (requeue.contains(hash)) requeue_keys.emplace(hash, key);
    });
  }
  for (uint64_t hash : requeue_order) {
    auto found = requeue_keys.find(hash);
    if (found == requeue_keys.end()) continue;
    for (uint32_t i = 0; i < requeue[hash]; ++i) op.requeue.push_back(found->second);
  }
  return state_->Evict(std::move(op));
}

}  // namespace granary::master
