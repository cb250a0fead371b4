// MasterState: eviction, the s3fifo ghost, and the sweep of what expired (master_state.h has
// the contracts).
#include "master/state/master_state.h"

#include <xxhash.h>

#include <algorithm>

#include "master/state/state_internal.h"

namespace granary::master {

using namespace internal;

EvictResult MasterState::ApplyEvict(const EvictOp& op, int64_t now) {
  EvictResult result;
  const bool s3fifo = UsesQueues(policy_.eviction_policy);
  // GroupByShard keeps the op's order within a shard, so repeated requeues apply in order.
  for (const auto& [shard_index, indices] : GroupByShard(op.requeue)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      auto it = shard.objects.find(op.requeue[i]);
      if (it == shard.objects.end() || !it->second.committed) continue;
      ObjectMeta& meta = it->second;
      if (meta.reads == 0) continue;
      if (meta.in_main) {
        meta.reads--;
      } else {
        meta.in_main = true;
        meta.reads = 0;
      }
      meta.queue_stamp = QueueStamp(now, i);
    }
  }
  for (const auto& [shard_index, indices] : GroupByShard(op.keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      auto it = shard.objects.find(op.keys[i]);
      if (it == shard.objects.end()) continue;
      ObjectMeta& meta = it->second;
      if (!meta.IsEvictable(now, op.allow_soft_pinned)) continue;
      // Read since the evictor chose it: under s3fifo that earns it another pass.
      if (s3fifo && meta.reads > 0 && !op.whole_run) continue;
      const bool leaves = meta.committed->disk.empty();  // else it stays, on disk
      if (s3fifo && !meta.in_main && leaves) GhostAdd(op.keys[i]);
      result.objects++;
      result.bytes += EvictMemory(shard, it, now);
    }
  }
  return result;
}

void MasterState::GhostAdd(std::string_view key) {
  const uint64_t hash = XXH3_64bits(key.data(), key.size());
  GhostStripe& g = ghost_[hash >> 60];  // the shard takes the low bits
  const uint32_t fp = GhostFingerprint(hash);
  std::lock_guard lock(g.mu);
  const uint64_t entry = g.next++;
  g.fifo.push_back(fp);
  g.live.Set(fp, static_cast<uint32_t>(entry));
  // The ghost covers eviction_ghost_ratio x the objects held, spread over the stripes.
  const uint64_t held = committed_count_.load(std::memory_order_relaxed);
  const double share = policy_.eviction_ghost_ratio * static_cast<double>(held) / kGhostStripes;
  const uint64_t limit = share >= static_cast<double>(kMaxGhostPerStripe)
                             ? kMaxGhostPerStripe
                             : static_cast<uint64_t>(share) + 1;
  while (g.fifo.size() > limit) {
    const uint32_t old_fp = g.fifo.front();
    const auto old_entry = static_cast<uint32_t>(g.EntryAt(0));
    g.fifo.pop_front();
    if (g.live.Find(old_fp) == old_entry) g.live.Erase(old_fp);
  }
}

bool MasterState::GhostTake(std::string_view key) {
  const uint64_t hash = XXH3_64bits(key.data(), key.size());
  GhostStripe& g = ghost_[hash >> 60];
  std::lock_guard lock(g.mu);
  return g.live.Erase(GhostFingerprint(hash));
}

size_t MasterState::ghost_count() const {
  size_t total = 0;
  for (const auto& g : ghost_) {
    std::lock_guard lock(g.mu);
    total += g.live.size();
  }
  return total;
}

SweepResult MasterState::ApplySweep(const SweepOp&, int64_t now) {
  SweepResult result;
  for (auto& shard_ptr : shards_) {
    Shard& shard = *shard_ptr;
    std::lock_guard lock(shard.mu);
    std::vector<std::string> expired;
    for (std::string_view key : shard.pending_keys) {
      const ObjectMeta& meta = shard.objects.find(key)->second;
      if (meta.pending()->start_ms + policy_.put_release_timeout_ms <= now) {
        expired.emplace_back(key);
      }
    }
    std::sort(expired.begin(), expired.end());  // free order is state: never the set's order
    for (const auto& key : expired) {
      auto it = shard.objects.find(key);
      FreeExtents(it->second.pending()->version.replicas);
      ClearPending(shard, it);
      EraseIfEmpty(shard, it);
      result.discarded_puts++;
    }
    // A demotion that has not ended within the release timeout is given up: its node is stuck.
    std::vector<std::string> stalled;
    for (std::string_view key : shard.demoting_keys) {
      const ObjectMeta& meta = shard.objects.find(key)->second;
      if (meta.demotion()->start_ms + policy_.put_release_timeout_ms <= now) {
        stalled.emplace_back(key);
      }
    }
    std::sort(stalled.begin(), stalled.end());
    for (const auto& key : stalled) {
      ResolveDemotion(shard, shard.objects.find(key), now);
      result.aborted_demotions++;
    }
  }
  // Cache leases over: their read-lock entries go (and with the last, the object's rare block).
  for (auto& shard_ptr : shards_) {
    Shard& shard = *shard_ptr;
    std::lock_guard lock(shard.mu);
    for (auto it = shard.cache_leased.begin(); it != shard.cache_leased.end();) {
      // Only the ended leases go: what else the object holds does not depend on whether the
      // key is listed here, which a snapshot-loaded replica lists differently.
      const bool leased = shard.objects.find(*it)->second.DropEndedCacheLeases(now);
      it = leased ? std::next(it) : shard.cache_leased.erase(it);
    }
  }
  result.expired_reservations = ExpireReservations(now);
  std::vector<Extent> due;
  {
    std::lock_guard lock(deferred_mu_);
    auto split = std::stable_partition(deferred_.begin(), deferred_.end(),
                                       [now](const DeferredFree& d) { return d.release_at_ms > now; });
    for (auto it = split; it != deferred_.end(); ++it) due.push_back(it->extent);
    deferred_.erase(split, deferred_.end());
  }
  FreeExtents(due);
  result.freed_extents = due.size();
  return result;
}

}  // namespace granary::master
