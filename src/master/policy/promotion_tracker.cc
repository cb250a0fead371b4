#include "master/policy/promotion_tracker.h"

#include <algorithm>

namespace granary::master {

void PromotionTracker::NoteRead(const std::string& key, const ReadKeyResult& answer) {
  if (!enabled()) return;
  if (!answer.status.ok() || !answer.replicas.empty() || answer.disk.empty()) return;
  std::lock_guard lock(mu_);
  // A hint: at the bound, forget every count rather than grow (hot keys count up again fast).
  if (counts_.size() >= kMaxTracked && !counts_.contains(key)) counts_.clear();
  Count& c = counts_[key];
  if (c.version_gen != answer.version_gen) c = {answer.version_gen, 0};
  if (++c.reads < promote_after_) return;
  counts_.erase(key);
  if (due_.size() >= kMaxNodes && !due_.contains(answer.disk.front().node_id)) {
    due_.clear();
    due_total_ = 0;
  }
  if (due_total_ >= kMaxDueTotal) return;
  Due& due = due_[answer.disk.front().node_id];
  if (due.keys.size() >= kMaxDuePerNode || due.set.contains(key)) return;
  due.keys.push_back(key);
  due.set.insert(key);
  ++due_total_;
}

std::vector<std::string> PromotionTracker::Take(const std::string& node_id, size_t max_keys) {
  std::lock_guard lock(mu_);
  auto it = due_.find(node_id);
  if (it == due_.end()) return {};
  Due& due = it->second;
  const size_t n = std::min(max_keys, due.keys.size());
  std::vector<std::string> taken(std::make_move_iterator(due.keys.begin()),
                                 std::make_move_iterator(due.keys.begin() + n));
  due.keys.erase(due.keys.begin(), due.keys.begin() + n);
  for (const auto& key : taken) due.set.erase(key);
  due_total_ -= n;
  if (due.keys.empty()) due_.erase(it);
  return taken;
}

size_t PromotionTracker::due(const std::string& node_id) const {
  std::lock_guard lock(mu_);
  auto it = due_.find(node_id);
  return it == due_.end() ? 0 : it->second.keys.size();
}

size_t PromotionTracker::due_total() const {
  std::lock_guard lock(mu_);
  return due_total_;
}

uint32_t PromotionTracker::reads(const std::string& key, uint64_t version_gen) const {
  std::lock_guard lock(mu_);
  auto it = counts_.find(key);
  return it != counts_.end() && it->second.version_gen == version_gen ? it->second.reads : 0;
}

}  // namespace granary::master
