#include "master/policy/replica_planner.h"

#include <algorithm>

namespace granary::master {

void ReplicaPlanner::ScanIfDue(int64_t now_ms) {
  const uint64_t epoch = state_->replica_epoch();
  const bool moved = !scanned_ || epoch != scanned_epoch_;
  // Work the last scan found may have moved on only if copies were under way or handed out
  // since: an object no node can take (all hold it, no room) waits for the epoch instead.
  const bool recheck = work_found_ && (inflight_at_scan_ || handed_since_scan_ > 0) &&
                       now_ms - scanned_ms_ >= kRescanMs;
  if (!moved && !recheck) return;
  scanned_ = true;
  scanned_epoch_ = epoch;  // read before the scan: a change during it scans again
  scanned_ms_ = now_ms;
  backlog_.clear();
  backlog_bytes_ = 0;
  work_found_ = false;
  inflight_at_scan_ = state_->copies_in_flight() > 0;
  handed_since_scan_ = 0;
  std::map<std::string, DrainProgress> drains;
  for (const auto& [name, mark] : state_->segments().Drains()) {
    if (!mark.done) drains[name];
  }
  std::map<uint64_t, std::string> draining_ids;  // segment id -> name
  std::map<std::string, std::string> draining_nodes;  // node -> one draining segment's name
  for (const auto& u : state_->segments().Usage()) {
    if (!u.draining) continue;
    draining_ids[u.identity->id] = u.identity->name;
    draining_nodes[u.identity->client_id] = u.identity->name;
  }
  state_->ScanCopyCandidates([&](std::string_view key, const ObjectMeta& meta) {
    work_found_ = true;
    const Version& v = *meta.committed;
    // Drain progress: every draining segment (or node's disk) the object is held on.
    for (const Extent& e : v.replicas) {
      if (auto d = draining_ids.find(e.segment_id); d != draining_ids.end()) {
        DrainProgress& p = drains[d->second];
        p.objects++;
        p.bytes += v.size;
      }
    }
    if (v.replicas.empty()) {
      for (const DiskReplica& d : v.disk) {
        if (auto n = draining_nodes.find(d.node_id); n != draining_nodes.end()) {
          DrainProgress& p = drains[n->second];
          p.objects++;
          p.bytes += v.size;
        }
      }
    }
    if (meta.promotion()) return;  // a copy (or promotion) is under way: counted, not handed out
    if (v.replicas.empty() && v.disk.empty()) return;
    Item item{std::string(key), v.size, {}};
    for (const Extent& e : v.replicas) {
      if (auto seg = state_->segments().Find(e.segment_id)) item.holders.push_back(seg->client_id);
    }
    backlog_bytes_ += v.size;
    backlog_.push_back(std::move(item));
  });
  stats_.scans++;
  stats_.drains = std::move(drains);
}

std::vector<std::string> ReplicaPlanner::Take(const std::string& node_id, size_t max_keys,
                                              int64_t now_ms) {
  std::lock_guard lock(mu_);
  if (mbps_ <= 0 || max_keys == 0) return {};
  ScanIfDue(now_ms);
  if (backlog_.empty()) return {};
  const double rate = mbps_ * 1e6 / 1000.0;  // bytes per ms
  if (budget_ms_ == 0) budget_ms_ = now_ms;
  budget_bytes_ = std::min(budget_bytes_ + rate * static_cast<double>(now_ms - budget_ms_),
                           rate * 1000.0);
  budget_ms_ = now_ms;
  std::vector<std::string> keys;
  // Look at a bounded part of the backlog per call: entries this node already holds stay for
  // another node.
  constexpr size_t kMaxExamined = 16384;
  size_t examined = 0;
  for (auto it = backlog_.begin();
       it != backlog_.end() && keys.size() < max_keys && budget_bytes_ > 0 &&
       examined < kMaxExamined;
       ++examined) {
    if (std::find(it->holders.begin(), it->holders.end(), node_id) != it->holders.end()) {
      ++it;
      continue;
    }
    budget_bytes_ -= static_cast<double>(it->size);
    backlog_bytes_ -= it->size;
    handed_since_scan_++;
    keys.push_back(std::move(it->key));
    it = backlog_.erase(it);
  }
  return keys;
}

std::vector<std::string> ReplicaPlanner::FinishedDrains(int64_t now_ms) {
  std::lock_guard lock(mu_);
  const auto drains = state_->segments().Drains();
  if (std::none_of(drains.begin(), drains.end(),
                   [](const auto& d) { return !d.second.done && !d.second.drop; })) {
    return {};  // no drain under way: no scan for its sake
  }
  ScanIfDue(now_ms);
  std::vector<std::string> finished;
  for (const auto& [name, mark] : drains) {
    if (mark.done || mark.drop) continue;
    auto seg = state_->segments().FindByName(name);
    if (!seg) {  // gone (its node died): nothing of it to wait for
      finished.push_back(name);
      continue;
    }
    // Only a scan made after the drain began can say it holds nothing needed.
    if (scanned_ms_ < mark.start_ms || !scanned_ || state_->replica_epoch() != scanned_epoch_) {
      continue;
    }
    auto p = stats_.drains.find(name);
    if (p == stats_.drains.end() || p->second.objects == 0) finished.push_back(name);
  }
  return finished;
}

ReplicaPlanner::Stats ReplicaPlanner::GetStats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.backlog_objects = backlog_.size();
  s.backlog_bytes = backlog_bytes_;
  return s;
}

}  // namespace granary::master
