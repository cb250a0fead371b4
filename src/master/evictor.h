// master/evictor.h - decides which objects to evict, least recently accessed first.
//
// Promise: EvictBytes(n) frees at least n bytes if that many evictable bytes exist, taking the
// objects with the oldest last access first; it never takes an object that is read-locked, being
// written or hard-pinned, and takes soft-pinned objects only after every unpinned one (and only
// when the policy allows it). The victims are applied as an EvictOp, so the state machine
// re-checks each one under its shard lock.
//
// How: pass 1 gathers (last access, bytes) of the evictable objects (every one up to a million,
// a uniform stride sample beyond) and finds the access time T below which the oldest `n` bytes
// lie; pass 2 collects the keys older than T, then those at exactly T until the bytes suffice.
// Two scans instead of a global LRU list keep the read path free of list updates under a lock.
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
  // After an allocation of `needed` bytes failed: frees max(needed, ratio * capacity).
  EvictResult EvictForAllocation(uint64_t needed);

  uint64_t runs() const { return runs_; }

 private:
  EvictResult EvictPass(uint64_t target_bytes, bool allow_soft_pinned);

  MasterState* state_;
  std::mutex mu_;
  uint64_t runs_ = 0;
};

}  // namespace granary::master
