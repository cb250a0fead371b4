// granary-bench trace --simulate with --disk-tokens: a storage node's SSD tier as the simulator
// needs it, driven against the master's own code (MasterState, OffloadPlanner, PromotionTracker).
//
// Promise: the master sees the operations a real node sends it. Each offload interval runs up to
// kRoundsPerInterval rounds back to back, each as node/disk_tier.cc's OffloadOnce does, in this
// order: garbage named by the master is deleted and acknowledged (the real node acknowledges in
// its next round), due promotions are started and ended (PromoteStart, PromoteEnd: the real node
// ends them after its offload answer), the planner's keys are demoted (DemoteStart), room is made
// on the disk by its eviction policy, never taking a unit of this round (the store's committing
// ones), with DiskDrop told to the master before the space is reused, and the copies are reported
// (DemoteEnd). A read answered from disk
// touches the copy (copy_eviction) or its unit (lru) and is counted by the promotion tracker, as
// the service counts it.
// What is not modelled: bytes, I/O time and the offload bandwidth. A round takes no trace time,
// so this is the pace at which offload keeps up, not a flat-out replay. The caller runs the
// intervals (trace_sim.cc: at request arrivals, at most one per arrival).
// The disk: units of up to unit_max_keys copies written together (the bucket backend's bucket,
// or 1 for file-per-key); a removed copy's space comes back only with its unit, as in a bucket,
// unless copy_eviction (then with the copy, as the store's punched holes give it back).
// Ownership: borrows the state for its lifetime. Thread safety: one thread.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "disk/disk_store.h"
#include "granary/status.h"
#include "master/policy/offload_planner.h"
#include "master/policy/promotion_tracker.h"
#include "master/state/master_state.h"

namespace granary::bench {

struct SimDiskOptions {
  uint64_t capacity_bytes = 0;
  bool lru_eviction = true;         // the node's --disk-eviction: lru (or lru-units), else fifo
  // lru per copy (the bucket backend's lru where the filesystem punches holes): the least
  // recently used copy goes, its value's space back at once, its unit's header and entry stay
  // until the unit's last copy goes. False: lru over whole units (lru-units).
  bool copy_eviction = false;
  uint32_t unit_max_keys = disk::DiskStoreOptions{}.bucket_max_keys;  // bucket backend; file-per-key: 1
  uint64_t unit_max_bytes = 0;      // of values; 0: the bucket backend's for this capacity
  uint32_t round_max_keys = 500;    // DiskTierOptions::offload_max_keys
  uint64_t round_max_bytes = 256ull << 20;
  uint32_t promote_after = 2;       // the master's --promote-after (0: never)
  master::Persistence persistence = master::Persistence::kLazy;  // the master's --persistence
};

struct SimDiskCounters {
  uint64_t rounds = 0;
  uint64_t offloaded = 0;     // copies written and accepted (DemoteEnd OK)
  uint64_t disk_evicted = 0;  // copies dropped by the disk's eviction
  uint64_t promoted = 0;
  uint64_t disk_reads = 0;    // reads answered from disk only
  uint64_t lost = 0;          // disk reads of a copy the disk no longer holds: always 0
};

class SimDiskTier {
 public:
  static constexpr int kRoundsPerInterval = 8;  // DiskTier::OffloadLoop

  SimDiskTier(master::MasterState* state, std::string node_id, SimDiskOptions options);

  // Registers the (empty) disk with the master: the SSD tier is in use from here on.
  Status Register();
  // One offload interval: rounds until one does nothing, at most kRoundsPerInterval.
  void OffloadInterval();
  // The answers a GetReplicaList gave for keys[0..n), as the service and the node see them.
  void NoteReads(const std::vector<std::string>& keys,
                 const std::vector<master::ReadKeyResult>& answers, size_t n);

  const SimDiskCounters& counters() const { return counters_; }
  uint64_t used_bytes() const { return used_; }

 private:
  struct Unit {
    uint64_t bytes = 0;                                   // all its copies, live or removed
    uint32_t slots = 0;                                   // copies written into it
    uint64_t data_bytes = 0;                              // their values, 4 KiB-aligned
    std::vector<std::pair<std::string, uint64_t>> live;   // (key, location) still indexed
    std::unordered_map<uint64_t, uint64_t> aligned;       // copy_eviction: location -> value bytes
    uint64_t stamp = 0;                                   // order of eviction, lowest first
  };
  // Returns the number of copies written, promoted or deleted (0: an idle round).
  size_t OffloadOnce();
  size_t DeleteGarbage();
  size_t Promote();
  void MakeRoom(uint64_t bytes);
  uint64_t Write(const std::string& key, uint64_t size);  // the copy's location
  void Forget(const std::string& key, uint64_t location);
  void Touch(uint64_t location);
  // The copy leaves its unit: its value's space goes back now under copy_eviction, else with
  // the unit's last copy.
  void DropCopy(uint64_t location);
  void MakeRoomByCopies(uint64_t bytes);

  master::MasterState* state_;
  const std::string node_id_;
  const SimDiskOptions options_;
  const uint64_t unit_max_bytes_;
  master::OffloadPlanner planner_;
  master::PromotionTracker promotions_;
  static constexpr uint64_t kDiskId = 1;
  uint64_t round_ = 0;
  uint64_t used_ = 0;
  uint64_t next_unit_ = 1;
  uint64_t use_tick_ = 0;   // orders units by their last write or read
  uint64_t round_first_unit_ = 0;  // units from this id on were written this round
  uint64_t open_unit_ = 0;  // the unit this round writes into (0: none yet)
  std::map<uint64_t, Unit> units_;
  std::set<std::pair<uint64_t, uint64_t>> order_;  // (stamp, unit id)
  std::unordered_map<std::string, uint64_t> index_;  // key -> its copy's location
  std::set<std::pair<uint64_t, uint64_t>> copy_order_;  // copy_eviction: (last use, location)
  std::unordered_map<uint64_t, uint64_t> copy_use_;     // copy_eviction: location -> last use
  SimDiskCounters counters_;
};

}  // namespace granary::bench
