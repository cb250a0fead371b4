// master/policy/evictor.h - decides which objects to evict, by the master's eviction policy.
//
// Promise: EvictBytes(n) frees at least n bytes if that many evictable bytes exist; it never takes
// an object that is read-locked, being written or hard-pinned, and takes soft-pinned objects only
// after every unpinned one (and only when the policy allows it). The victims are applied as an
// EvictOp, so the state machine re-checks each one under its shard lock.
//
// lru: the oldest last access first. Pass 1 gathers (last access, bytes) of the evictable objects
// (every one up to a million, a uniform stride sample beyond) and finds the access time T below
// which the oldest `n` bytes lie; pass 2 collects the keys older than T, then ties until the bytes
// suffice.
// s3fifo: pass 1 gathers (queue, queue stamp, reads, bytes, key hash) of every evictable object
// and runs S3-FIFO over them: take from the probation queue while it holds more than
// eviction_small_ratio of the evictable bytes (read objects move to main, unread ones are
// evicted), else from the main queue (read objects go round again with one read fewer, unread are
// evicted). Soft-pinned objects are considered only by the soft pass, which runs after the
// unpinned passes (repeated while they free something) fall short.
// Pass 2 turns the chosen hashes back into keys. The moves go into the same EvictOp.
// prefix: s3fifo, but probation empties by the class its put batch gave each key (a batch's
// tail first, then keys of long batches; object_meta.h PrefixQueueStamp), oldest first within one.
// Once a node's disk is registered, a long batch's key jumps the queue only when it has a disk
// copy: evicted before older ones, a fresh key would be dropped where an old one is demoted.
// Either way scans replace a global list, so the read path only bumps fields under its shard lock.
// Thread safety: any thread; calls are serialised by an internal mutex.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>

#include "master/state/master_state.h"

namespace granary::master {

class Evictor {
 public:
  explicit Evictor(MasterState* state) : state_(state) {}

  // Evicts the least recently used objects worth at least target_bytes; with `segment`, only
  // objects that have a replica there, counting the bytes they occupy there.
  EvictResult EvictBytes(uint64_t target_bytes, std::optional<uint64_t> segment = std::nullopt);
  // Evicts down below the high watermark, plus eviction_ratio of the capacity, if usage is above
  // the watermark; otherwise does nothing.
  EvictResult RunIfAboveWatermark();
  // After allocations of `needed` bytes in all (the largest `largest_request`) failed: unless
  // that space has come free meanwhile, frees max(needed, ratio * capacity), capped at
  // max(ratio, 1/4) of the capacity. If the bytes are there but no segment has a block of
  // `largest_request`, it evicts the objects of one adjacent run on the segment with the most
  // free bytes: the run (with free holes) of the request's size whose newest object is oldest.
  EvictResult EvictForAllocation(uint64_t needed, uint64_t largest_request);

  uint64_t runs() const { return runs_; }

 private:
  struct Room {
    uint64_t free_bytes = 0;
    uint64_t largest_free = 0;
  };
  // Free space of the segments open to allocation (not quarantined).
  Room FreeRoom() const;
  // Frees one contiguous range of `request` bytes (evicting at most `budget` bytes) on the
  // segment closest to having it; nothing if no such range holds only evictable objects.
  EvictResult EvictOnShortSegment(uint64_t request, uint64_t budget);
  EvictResult EvictPass(uint64_t target_bytes, bool allow_soft_pinned,
                        std::optional<uint64_t> segment);
  EvictResult S3FifoPass(uint64_t target_bytes, bool allow_soft_pinned,
                         std::optional<uint64_t> segment);

  MasterState* state_;
  std::mutex mu_;
  uint64_t runs_ = 0;
};

}  // namespace granary::master
