#include "client/location_cache.h"

namespace granary::client {

void LocationCache::Insert(const std::string& key, uint64_t stamp,
                           const proto::GetReplicaResult& where, Clock::time_point deadline) {
  if (capacity_ == 0 || where.replicas_size() == 0) return;
  auto entry = std::make_shared<const Entry>(Entry{where, deadline});
  std::lock_guard lock(mu_);
  // Under the lock, as Invalidate's move: a write begun since the stamp keeps the answer out.
  if (stamps_[Slot(key)].load(std::memory_order_acquire) != stamp) return;
  auto [it, inserted] = entries_.insert_or_assign(key, std::move(entry));
  if (!inserted) return;
  order_.push_back(key);
  while (entries_.size() > capacity_ && !order_.empty()) {
    entries_.erase(order_.front());
    order_.pop_front();
  }
  if (order_.size() > 2 * capacity_ + 16) {  // erased keys pile up: list the live ones again
    order_.clear();
    for (const auto& [k, e] : entries_) order_.push_back(k);
  }
}

std::shared_ptr<const LocationCache::Entry> LocationCache::Lookup(const std::string& key,
                                                                  Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  if (it->second->deadline <= now) {
    entries_.erase(it);
    return nullptr;
  }
  return it->second;
}


void LocationCache::Clear() {
  std::lock_guard lock(mu_);
  for (auto& s : stamps_) s.fetch_add(1, std::memory_order_acq_rel);
  entries_.clear();
  order_.clear();
}

size_t LocationCache::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace granary::client
