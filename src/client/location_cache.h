// client/location_cache.h - where this client last read each key, so that a repeat get reads
// the node without asking the master (docs/control-path.md, "Gets without the master's round
// trip").
//
// An entry is the master's answer for one key (size, checksum, memory replicas) and the end of
// the cache lease that answer granted, counted from before the request was sent, less a margin.
// Until then the master keeps the version's space (no eviction, no free), and a writer that
// replaces or removes the version returns only after the lease (its commit's `settle_ms`), so a
// read that finishes its copy before the deadline reads the version no completed write has
// replaced. A read that finishes after it is thrown away: its bytes may be another object's.
// This client's own writes do not wait for its own leases: a put or remove drops the key's entry
// before it is sent and again once it is answered, and each drop moves the key's stamp, so that
// an answer the master gave before the write (a get under way at the same time) is not cached.
// Bounded: the oldest entries go first past `capacity`. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "granary/proto/master.pb.h"

namespace granary::client {

class LocationCache {
 public:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    proto::GetReplicaResult where;
    Clock::time_point deadline;
  };

  explicit LocationCache(size_t capacity) : capacity_(capacity) {}

  // Taken before a get's master call; Insert keeps the answer only if the key's stamp is the same.
  uint64_t Stamp(std::string_view key) const {
    return stamps_[Slot(key)].load(std::memory_order_acquire);
  }
  // Keeps `where` (an answer with memory replicas) until `deadline`, unless the key was written
  // by this client since `stamp` was taken.
  void Insert(const std::string& key, uint64_t stamp, const proto::GetReplicaResult& where,
              Clock::time_point deadline);
  // The key's entry if its deadline is after `now`; an expired one is dropped.
  std::shared_ptr<const Entry> Lookup(const std::string& key, Clock::time_point now);
  // This client writes or removes `key`, or a cached read of it failed: its entry goes.
  void Invalidate(const std::string& key) { InvalidateAll(std::span(&key, 1)); }
  template <typename Keys>
  void InvalidateAll(const Keys& keys) {
    if (capacity_ == 0) return;
    std::lock_guard lock(mu_);
    for (const auto& key : keys) {
      stamps_[Slot(key)].fetch_add(1, std::memory_order_acq_rel);
      if (!entries_.empty()) entries_.erase(key);
    }
  }
  // Every entry goes (a remove of many keys by pattern).
  void Clear();
  size_t size() const;

 private:
  static constexpr size_t kStamps = 4096;
  static size_t Slot(std::string_view key) { return std::hash<std::string_view>{}(key) % kStamps; }

  const size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const Entry>> entries_;
  std::deque<std::string> order_;  // keys in insertion order (some erased since)
  std::array<std::atomic<uint64_t>, kStamps> stamps_{};
};

}  // namespace granary::client
