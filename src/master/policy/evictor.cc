#include "master/policy/evictor.h"

#include <xxhash.h>

#include <algorithm>
#include <deque>
#include <unordered_map>
#include <vector>

namespace granary::master {

namespace {
constexpr uint64_t kExactScanLimit = 1 << 20;

// The bytes an object's memory replicas occupy, all of them or only those in `segment`.
uint64_t BytesIn(const ObjectMeta& meta, std::optional<uint64_t> segment) {
  if (!segment) return OccupiedBytes(meta.committed->replicas);
  uint64_t total = 0;
  for (const auto& e : meta.committed->replicas) {
    if (e.segment_id == *segment) total += OffsetAllocator::AllocationSize(e.length);
  }
  return total;
}

}  // namespace

EvictResult Evictor::EvictBytes(uint64_t target_bytes, std::optional<uint64_t> segment) {
  std::lock_guard lock(mu_);
  runs_++;
  EvictResult total = EvictPass(target_bytes, /*allow_soft_pinned=*/false, segment);
  // s3fifo's victims can be saved by a read between choice and apply, and its passes move read
  // objects along: go round again (bounded: each object holds at most kMaxQueueReads credits)
  // before anything soft-pinned is touched.
  for (int round = 0; round < kMaxQueueReads + 1 && total.bytes < target_bytes &&
                      UsesQueues(state_->policy().eviction_policy);
       ++round) {
    EvictResult more = EvictPass(target_bytes - total.bytes, /*allow_soft_pinned=*/false, segment);
    if (more.bytes == 0 && more.objects == 0) break;
    total.objects += more.objects;
    total.bytes += more.bytes;
  }
  if (total.bytes < target_bytes && state_->policy().allow_evict_soft_pinned) {
    EvictResult more = EvictPass(target_bytes - total.bytes, /*allow_soft_pinned=*/true, segment);
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

Evictor::Room Evictor::FreeRoom() const {
  Room room;
  const int64_t now = state_->clock()->NowMs();
  for (const auto& u : state_->segments().Usage()) {
    if (u.identity->usable_from_ms > now) continue;
    room.free_bytes += u.stats.free_bytes;
    room.largest_free = std::max(room.largest_free, u.stats.largest_free_block);
  }
  return room;
}

EvictResult Evictor::EvictForAllocation(uint64_t needed, uint64_t largest_request) {
  Room room;
  {
    // Re-check under the lock: a put that failed while another thread's eviction ran may find
    // the space already there, and must not evict a second share of the cache for it.
    std::lock_guard lock(mu_);
    room = FreeRoom();
  }
  if (room.free_bytes >= needed && room.largest_free >= largest_request) return {};
  const double capacity = static_cast<double>(state_->segments().total_capacity());
  uint64_t by_ratio = static_cast<uint64_t>(state_->policy().eviction_ratio * capacity);
  // One allocation never flushes more than a quarter of the cache (or the eviction ratio).
  uint64_t cap = std::max(by_ratio, static_cast<uint64_t>(capacity / 4));
  EvictResult total;
  if (room.free_bytes < needed) total = EvictBytes(std::min(std::max(needed, by_ratio), cap));
  // Bytes enough, but scattered: the largest request needs one segment with a block that large.
  const uint64_t budget = cap;
  if (FreeRoom().largest_free < largest_request && total.bytes < budget) {
    EvictResult more = EvictOnShortSegment(largest_request, budget - total.bytes);
    total.objects += more.objects;
    total.bytes += more.bytes;
  }
  return total;
}

EvictResult Evictor::EvictOnShortSegment(uint64_t request, uint64_t budget) {
  std::lock_guard lock(mu_);
  runs_++;
  const int64_t now = state_->clock()->NowMs();
  // The open segment that can hold the request and is closest to it: the most free bytes.
  std::optional<SegmentUsage> target;
  for (auto& u : state_->segments().Usage()) {
    if (u.identity->usable_from_ms > now || u.stats.capacity < request) continue;
    if (!target || u.stats.free_bytes > target->stats.free_bytes) target = std::move(u);
  }
  if (!target || target->stats.largest_free_block >= request) return {};
  const uint64_t segment = target->identity->id;

  // The segment by address: its free blocks and the extents of objects that may be evicted.
  struct Span {
    uint64_t offset, size;
    int64_t access;  // the object's last access; INT64_MIN for free space
    size_t key;      // index into keys; unused for free space
  };
  std::vector<Span> spans;
  std::vector<std::string> keys;
  for (const auto& b : state_->segments().FreeBlocks(segment)) {
    spans.push_back({b.offset, b.size, INT64_MIN, 0});
  }
  for (size_t s = 0; s < state_->shard_count(); ++s) {
    state_->ScanShard(s, [&](std::string_view key, const ObjectMeta& meta) {
      if (!meta.IsEvictable(now, /*allow_soft_pinned=*/false)) return;
      for (const auto& e : meta.committed->replicas) {
        if (e.segment_id != segment) continue;
        spans.push_back({e.offset, OffsetAllocator::AllocationSize(e.length),
                         meta.last_access_ms, keys.size()});
        keys.emplace_back(key);
      }
    });
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& x, const Span& y) { return x.offset < y.offset; });

  // The window of adjacent spans covering `want` bytes whose most recently read object is the
  // oldest. A block within 1/8 above the request may sit behind others of its size class in the
  // allocator (see offset_allocator.h): ask for that margin first, the bare request if none.
  std::optional<std::pair<size_t, size_t>> best;
  const uint64_t exact = OffsetAllocator::AllocationSize(request);
  for (uint64_t want : {OffsetAllocator::AllocationSize(exact + exact / 8), exact}) {
    if (want > budget) continue;
    int64_t best_cost = INT64_MAX;
    size_t run_start = 0;
    while (run_start < spans.size()) {
      size_t run_end = run_start + 1;  // spans[run_start, run_end) touch end to start
      while (run_end < spans.size() &&
             spans[run_end].offset == spans[run_end - 1].offset + spans[run_end - 1].size) {
        ++run_end;
      }
      std::deque<size_t> newest;  // indices in [i, j), access decreasing: front is the window's max
      uint64_t covered = 0;
      for (size_t i = run_start, j = run_start; i < run_end; ++i) {
        while (j < run_end && covered < want) {
          while (!newest.empty() && spans[newest.back()].access <= spans[j].access) newest.pop_back();
          newest.push_back(j);
          covered += spans[j++].size;
        }
        if (covered < want) break;
        const int64_t cost = spans[newest.front()].access;
        if (cost < best_cost) {
          best_cost = cost;
          best = {i, j};
        }
        covered -= spans[i].size;
        if (newest.front() == i) newest.pop_front();
      }
      run_start = run_end;
    }
    if (best) break;
  }
  if (!best) return {};
  EvictOp op;
  op.whole_run = true;
  for (size_t k = best->first; k < best->second; ++k) {
    if (spans[k].access != INT64_MIN) op.keys.push_back(keys[spans[k].key]);
  }
  if (op.keys.empty()) return {};
  return state_->Evict(std::move(op));
}

EvictResult Evictor::EvictPass(uint64_t target_bytes, bool allow_soft_pinned,
                               std::optional<uint64_t> segment) {
  if (target_bytes == 0) return {};
  if (UsesQueues(state_->policy().eviction_policy)) {
    return S3FifoPass(target_bytes, allow_soft_pinned, segment);
  }
  const int64_t now = state_->clock()->NowMs();
  const uint64_t stride = state_->object_count() / kExactScanLimit + 1;

  // Pass 1: the age distribution of what may be evicted.
  std::vector<std::pair<int64_t, uint64_t>> ages;  // (last access, bytes)
  uint64_t seen = 0;
  for (size_t s = 0; s < state_->shard_count(); ++s) {
    state_->ScanShard(s, [&](std::string_view, const ObjectMeta& meta) {
      if (!meta.IsEvictable(now, allow_soft_pinned)) return;
      const uint64_t bytes = BytesIn(meta, segment);
      if (bytes == 0) return;
      if (seen++ % stride == 0) ages.emplace_back(meta.last_access_ms, bytes * stride);
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
    state_->ScanShard(s, [&](std::string_view key, const ObjectMeta& meta) {
      if (!meta.IsEvictable(now, allow_soft_pinned) || meta.last_access_ms > threshold) return;
      const uint64_t bytes = BytesIn(meta, segment);
      if (bytes == 0) return;
      if (meta.last_access_ms < threshold) {
        victims.emplace_back(key);
        chosen += bytes;
      } else {
        ties.emplace_back(key, bytes);
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

EvictResult Evictor::S3FifoPass(uint64_t target_bytes, bool allow_soft_pinned,
                                std::optional<uint64_t> segment) {
  const int64_t now = state_->clock()->NowMs();
  struct Entry {
    int64_t stamp;
    uint64_t hash;
    uint64_t bytes;
    uint8_t reads;
    bool on_disk;  // a disk copy keeps it readable once its memory goes
  };
  // Pass 1: both queues' evictable objects, and their bytes per queue.
  std::vector<Entry> small, main;
  uint64_t small_bytes = 0, total_bytes = 0;
  for (size_t s = 0; s < state_->shard_count(); ++s) {
    state_->ScanShard(s, [&](std::string_view key, const ObjectMeta& meta) {
      // Only what could go counts toward the queues' shares: pinned or locked bytes never leave
      // probation, and counting them would make every pass drain it first.
      if (!meta.IsEvictable(now, allow_soft_pinned)) return;
      // The soft pass runs after the unpinned ones: it takes soft-pinned objects only.
      if (allow_soft_pinned && !meta.IsSoftPinned(now)) return;
      const uint64_t bytes = BytesIn(meta, segment);
      if (bytes == 0) return;
      total_bytes += bytes;
      if (!meta.in_main) small_bytes += bytes;
      (meta.in_main ? main : small)
          .push_back({meta.queue_stamp, XXH3_64bits(key.data(), key.size()), bytes, meta.reads,
                      !meta.committed->disk.empty()});
    });
  }
  auto by_stamp = [](const Entry& a, const Entry& b) {
    return a.stamp != b.stamp ? a.stamp < b.stamp : a.hash < b.hash;
  };
  if (state_->policy().eviction_policy == EvictionPolicy::kPrefix) {
    // Probation empties class by class (PrefixQueueStamp), each in its queue order. With an SSD
    // tier, a key of class 1 or 2 jumps the queue only once it has a disk copy: the oldest have
    // had the time to get one, and a fresh one evicted first would be dropped, not demoted.
    const bool disk_tier = state_->AnyDiskKnown();
    auto rank = [&](const Entry& e) {
      const int c = ProbationClass(e.stamp);
      return c == 0 || !disk_tier || e.on_disk ? c : 3;
    };
    std::sort(small.begin(), small.end(), [&](const Entry& a, const Entry& b) {
      const int ca = rank(a), cb = rank(b);
      return ca != cb ? ca < cb : by_stamp(a, b);
    });
  } else {
    std::sort(small.begin(), small.end(), by_stamp);
  }
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
    state_->ScanShard(s, [&](std::string_view key, const ObjectMeta& meta) {
      if (!meta.committed) return;
      const uint64_t hash = XXH3_64bits(key.data(), key.size());
      if (victims.contains(hash)) op.keys.emplace_back(key);
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
