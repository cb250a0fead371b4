// master/policy/offload_planner.h - chooses which memory objects a node should copy to its disk (the SSD
// tier's offload), by the master's persistence policy.
//
// Promise: Plan(node) names only complete objects that have a memory replica on one of that
// node's own segments (the node copies from its own memory), no disk replica of that node, and
// no demotion under way, and whose version no node's disk evicted already; at most max_keys of
// them and about max_bytes. It only reads the state:
// the caller turns the plan into a DemoteStart operation, which re-checks each key in order.
// Each object goes by its put's persistence (ReplicateConfig.persistence), or by the master's
// policy when its put left it at default:
//   eager: offloaded soon after its put ends (write-through to disk), oldest commit first.
//   lazy:  only while the node's segments are above `offload_watermark` of their capacity, in
//          the order eviction will reach them (LazyOffloadOrder), so that eviction demotes them
//          instead of dropping them: the least recently read first; under the prefix eviction
//          policy, in its own queue order, and a put batch's tail not while it is unread.
//   none:  never (memory eviction drops it).
// Eager objects come before lazy ones in a plan. While no committed object has a persistence of
// its own, a policy of none (or lazy below the watermark) answers without scanning.
// Cost: it walks the state's offload index (MasterState::ScanOffloadCandidates) for the node's
// segments and the persistences due now, not every object, and keeps the best max_keys in a
// heap: a node whose memory is all on its disk already pays for no object, except, under
// prefix, an unread tail, which stays listed (and visited) while lazy offload is due.
// Thread safety: any thread; Plan holds shard locks one at a time, like the evictor's scans.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "master/state/master_state.h"

namespace granary::master {

enum class Persistence { kEager, kLazy, kNone };

// What one OffloadStart answer names at most (master_service_disk.cc): keys to copy, disk
// garbage to delete (entries and their key bytes), promotions.
inline constexpr uint32_t kMaxOffloadKeys = 4096;
inline constexpr size_t kMaxGarbagePerReply = 1024;
inline constexpr size_t kMaxGarbageKeyBytesPerReply = 1 << 20;
inline constexpr size_t kMaxPromotionsPerRound = 256;

struct OffloadPolicy {
  Persistence persistence = Persistence::kLazy;
  double offload_watermark = 0.80;  // lazy: a node's memory usage above which it offloads
};

class OffloadPlanner {
 public:
  OffloadPlanner(const MasterState* state, OffloadPolicy policy) : state_(state), policy_(policy) {}

  std::vector<std::string> Plan(const std::string& node_id, size_t max_keys,
                                uint64_t max_bytes) const;
  const OffloadPolicy& policy() const { return policy_; }

 private:
  const MasterState* state_;
  OffloadPolicy policy_;
};

// "eager", "lazy" or "none".
Result<Persistence> ParsePersistence(const std::string& name);

// A lazy object's place in a plan, lower first: (1, last read) under lru and s3fifo. Under
// prefix, memory eviction's order: probation classes 1-3 (object_meta.h PrefixQueueStamp), then
// the main queue, each by queue stamp; none (not copied) for a batch's unread tail on probation
// (class 0: about 1% are read again). A tail once read is copied as one of the main queue's.
std::optional<std::pair<int, int64_t>> LazyOffloadOrder(const ObjectMeta& meta,
                                                        EvictionPolicy policy);

// What the planner does with a version of persistence `put` under the master's `policy`.
Persistence EffectivePersistence(PutPersistence put, Persistence policy);

}  // namespace granary::master
