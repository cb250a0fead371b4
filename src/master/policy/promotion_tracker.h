// master/policy/promotion_tracker.h - counts reads of disk-only objects and says which are due to come
// back to memory (promotion, `--promote-after N`).
//
// Promise: NoteRead counts a GetReplicaList answer only when it is disk-only (OK, no memory
// replica, a disk replica), per key and version: a new version starts from zero. When a key's
// count reaches N it is queued once for the node holding its first disk replica and its count
// is forgotten, so if the promotion cannot start (no space, replaced meanwhile) it takes N more
// reads. N = 0 disables all of it. Take hands the queued keys to that node's offload round,
// which turns them into a PromoteStart operation that re-checks each key.
// This is a hint, not state: it is not in the history or the snapshot (a standby or a restarted
// master counts from zero), and it is bounded (kMaxTracked counts, kMaxDuePerNode queued keys per
// node, kMaxNodes queues; beyond them the counts are dropped, or new keys are not queued).
// Thread safety: any thread; one mutex, held briefly.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "master/state/operations.h"

namespace granary::master {

class PromotionTracker {
 public:
  static constexpr size_t kMaxTracked = 1 << 20;
  static constexpr size_t kMaxDuePerNode = 1 << 16;
  static constexpr size_t kMaxDueTotal = 1 << 18;
  static constexpr size_t kMaxNodes = 4096;  // queues of nodes long gone are dropped past it

  explicit PromotionTracker(uint32_t promote_after) : promote_after_(promote_after) {}

  bool enabled() const { return promote_after_ > 0; }
  uint32_t promote_after() const { return promote_after_; }
  // One answer of GetReplicaList for `key`, as the client was told it (a status the service
  // refused counts as not OK).
  void NoteRead(const std::string& key, const ReadKeyResult& answer);
  // Up to max_keys keys due on `node_id`'s disk, oldest first; they leave the queue.
  std::vector<std::string> Take(const std::string& node_id, size_t max_keys);
  // Keys queued for `node_id`, and for all nodes (for tests and metrics).
  size_t due(const std::string& node_id) const;
  size_t due_total() const;
  // Reads counted so far of `key`'s version `version_gen` (0 if none, or another version's).
  uint32_t reads(const std::string& key, uint64_t version_gen) const;

 private:
  struct Count {
    uint64_t version_gen = 0;
    uint32_t reads = 0;
  };
  struct Due {
    std::vector<std::string> keys;       // in the order they came due
    std::unordered_set<std::string> set; // the same keys, to queue each once
  };

  const uint32_t promote_after_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Count> counts_;
  std::unordered_map<std::string, Due> due_;  // node id -> keys
  size_t due_total_ = 0;                      // keys in all queues
};

}  // namespace granary::master
