// master/state/cache_lease_ledger.h - how long a key's vanished versions may still be read from
// a client's location cache (docs/control-path.md, "Gets without the master's round trip").
//
// A cache lease lives in its object's read locks (object_meta.h) while the object does. When the
// version it covers leaves (replaced by an upsert, removed, lost with its segment, expired with
// its writer), its live leases are noted here, in a bucket of the key's hash, so that the
// writer, and any later writer of the key, waits them out: the answer to a commit or remove says
// how long (SettleUntil), and the writer returns only then. A bucket keeps the latest end noted and the one client holding all of its
// live leases (or none: several did), so a client's own reads never make its own writes wait;
// the client drops its own cached location before it writes. Buckets overstate (many keys share
// one), never understate.
// Not state: derived from applied operations (their clock), not in snapshots or digests; a load
// assumes every bucket busy until the loaded state's clock plus the longest lease
// (AssumeAllUntil). Thread-safe: Note runs under the apply lock, the queries on service threads.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace granary::master {

class CacheLeaseLedger {
 public:
  // `client` held a cache lease on `key` until `until_ms`, and the key's object is gone; `now_ms`
  // is the operation's clock (a bucket whose end has passed forgets its holder).
  void Note(std::string_view key, std::string_view client, int64_t until_ms, int64_t now_ms);
  // A lease was granted until `until_ms` (anywhere): RemoveAll and regex removes wait for it.
  void NoteGrant(int64_t until_ms);
  // The latest end of a vanished lease on `key`'s bucket held by someone but `caller`.
  int64_t SettleUntil(std::string_view key, std::string_view caller) const;
  // The latest of SettleUntil over `keys`, under one lock.
  int64_t SettleUntil(const std::vector<std::string>& keys, std::string_view caller) const;
  // The latest end of any lease ever granted.
  int64_t LatestGrant() const;
  // After a load: every bucket ends no sooner than `until_ms`, held by several clients.
  void AssumeAllUntil(int64_t until_ms);

  static constexpr size_t kBuckets = 65536;  // 1 MiB: few writers wait for a stranger's lease

 private:
  struct Bucket {
    int64_t until_ms = 0;
    uint64_t holder = 0;  // hash of the client holding every lease noted, 0 when several
  };
  static uint64_t HashOf(std::string_view s);

  mutable std::mutex mu_;
  std::array<Bucket, kBuckets> buckets_{};
  int64_t latest_grant_ms_ = 0;
};

}  // namespace granary::master
