#include "master/state/cache_lease_ledger.h"

#include <algorithm>

#include <xxhash.h>

namespace granary::master {

uint64_t CacheLeaseLedger::HashOf(std::string_view s) {
  const uint64_t h = XXH3_64bits(s.data(), s.size());
  return h == 0 ? 1 : h;  // 0 means "several holders"
}

void CacheLeaseLedger::Note(std::string_view key, std::string_view client, int64_t until_ms,
                            int64_t now_ms) {
  if (until_ms <= now_ms) return;  // over already: nothing can read under it
  const uint64_t holder = HashOf(client);
  std::lock_guard lock(mu_);
  Bucket& b = buckets_[HashOf(key) % kBuckets];
  if (b.until_ms <= now_ms) {
    b = {until_ms, holder};
    return;
  }
  if (b.holder != holder) b.holder = 0;
  b.until_ms = std::max(b.until_ms, until_ms);
}

void CacheLeaseLedger::NoteGrant(int64_t until_ms) {
  std::lock_guard lock(mu_);
  latest_grant_ms_ = std::max(latest_grant_ms_, until_ms);
}

int64_t CacheLeaseLedger::SettleUntil(std::string_view key, std::string_view caller) const {
  const uint64_t me = HashOf(caller);
  std::lock_guard lock(mu_);
  const Bucket& b = buckets_[HashOf(key) % kBuckets];
  return b.holder == me ? 0 : b.until_ms;
}

int64_t CacheLeaseLedger::SettleUntil(const std::vector<std::string>& keys,
                                      std::string_view caller) const {
  const uint64_t me = HashOf(caller);
  std::vector<size_t> slots;
  slots.reserve(keys.size());
  for (const auto& key : keys) slots.push_back(HashOf(key) % kBuckets);  // outside the lock
  int64_t until = 0;
  std::lock_guard lock(mu_);
  for (size_t slot : slots) {
    const Bucket& b = buckets_[slot];
    if (b.holder != me) until = std::max(until, b.until_ms);
  }
  return until;
}

int64_t CacheLeaseLedger::LatestGrant() const {
  std::lock_guard lock(mu_);
  return latest_grant_ms_;
}

void CacheLeaseLedger::AssumeAllUntil(int64_t until_ms) {
  std::lock_guard lock(mu_);
  for (Bucket& b : buckets_) {
    b.holder = 0;
    b.until_ms = std::max(b.until_ms, until_ms);
  }
  latest_grant_ms_ = std::max(latest_grant_ms_, until_ms);
}

}  // namespace granary::master
