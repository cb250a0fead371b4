// master/evictor.h - decides which objects to evict, by the master's eviction policy.
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
// Either way scans replace a global list, so the read path only bumps fields under its shard lock.
// Thread safety: any thread; calls are serialised by an internal mutex.
#pragma once

#include <cstdint>
#include <mutex>

#include "master/master_state.h"

namespace granary::master {

class Evictor {
 public:
  explicit Evictor(MasterState* state) : state_(state) {}

  // Evicts the least recently used objects worth at least target_bytes.
  EvictResult EvictBytes(uint64_t target_bytes);
  // Evicts down below the high watermark, plus eviction_ratio of the capacity, if usage is above
  // the watermark; otherwise does nothing.
  EvictResult RunIfAboveWatermark();
  // After allocations of `needed` bytes in all (the largest `largest_request`) failed: unless
  // that space has come free meanwhile, frees max(needed, ratio * capacity), capped at
  // max(ratio, 1/4) of the capacity.
  EvictResult EvictForAllocation(uint64_t needed, uint64_t largest_request);

  uint64_t runs() const { return runs_; }

 private:
  EvictResult EvictPass(uint64_t target_bytes, bool allow_soft_pinned);
  EvictResult S3FifoPass(uint64_t target_bytes, bool allow_soft_pinned);

  MasterState* state_;
  std::mutex mu_;
  uint64_t runs_ = 0;
};

}  // namespace granary::master
