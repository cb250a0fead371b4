// master/policy/replica_planner.h - which objects need new memory replicas, and which node copies
// them (re-replication; docs/operations.md).
//
// Promise: Take(node) names keys that need a copy (MasterState::CopiesNeeded > 0), that the node
// holds no memory replica of, at most `max_keys` and about the bytes the rate allows
// (--rereplicate-mbps, one budget for the whole cluster; at least one object per call once the
// budget is positive, so no object is too big to ever go). It does not decide: the node's
// ReplicaCopyStart re-checks every key under the apply order.
// Cost: it finds work by walking the state's index of objects that may need copies
// (MasterState::ScanCopyCandidates: what lost a replica, what a drain holds, what was placed
// short; not every object), only when the state's replica epoch moved since its last walk (a
// mount, an unmount, a drain, a raised replica count...) or, while the last walk found work that
// may have moved on since (copies under way, or handed out), every kRescanMs; between walks it
// serves its backlog. An idle cluster (no loss, no drain), or one whose missing replicas no node
// can take, costs one atomic read per call.
// Drains: each scan also counts, per draining segment, the objects that still need a copy for
// its sake; FinishedDrains names the drains with nothing left (or whose segment is gone).
// Thread safety: every method from any thread (one mutex; Take scans under it).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "master/state/master_state.h"

namespace granary::master {

class ReplicaPlanner {
 public:
  static constexpr int64_t kRescanMs = 2000;
  static constexpr double kDefaultMbps = 200;
  // mbps: megabytes (10^6) per second for all copies together; 0 turns re-replication off
  // (drains without --drop then never finish).
  ReplicaPlanner(MasterState* state, double mbps = kDefaultMbps) : state_(state), mbps_(mbps) {}
  void set_mbps(double mbps) {
    std::lock_guard lock(mu_);
    mbps_ = mbps;
  }

  std::vector<std::string> Take(const std::string& node_id, size_t max_keys, int64_t now_ms);

  struct DrainProgress {
    uint64_t objects = 0;  // still needing a copy because of this segment
    uint64_t bytes = 0;
  };
  struct Stats {
    uint64_t backlog_objects = 0;  // at the last scan, less what was handed out since
    uint64_t backlog_bytes = 0;
    uint64_t scans = 0;
    std::map<std::string, DrainProgress> drains;  // by segment name, as of the last scan
  };
  Stats GetStats() const;
  // Drains not done whose segment holds nothing needed any more, by the scan that followed
  // their start (or whose segment is no longer mounted). Scans first if the state moved.
  std::vector<std::string> FinishedDrains(int64_t now_ms);

 private:
  struct Item {
    std::string key;
    uint64_t size = 0;
    std::vector<std::string> holders;  // nodes with a memory replica: not asked to copy it
  };
  void ScanIfDue(int64_t now_ms);  // mu_ held
  void Refill(int64_t now_ms);     // mu_ held

  MasterState* state_;
  mutable std::mutex mu_;
  double mbps_;
  std::deque<Item> backlog_;
  uint64_t backlog_bytes_ = 0;
  bool scanned_ = false;
  uint64_t scanned_epoch_ = 0;
  int64_t scanned_ms_ = 0;
  bool work_found_ = false;  // the last scan found copies needed (or under way)
  bool inflight_at_scan_ = false;  // copies were under way at the last scan
  uint64_t handed_since_scan_ = 0;
  double budget_bytes_ = 0;  // token bucket, at most one second's worth
  int64_t budget_ms_ = 0;
  Stats stats_;
};

}  // namespace granary::master
