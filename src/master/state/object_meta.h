// master/state/object_meta.h - what the master knows about one key.
//
// An object has at most one committed version (readable) and at most one pending write (a put or
// an upsert between start and end). Keeping both lets an upsert run while readers still see the
// old bytes; the old extents are retired at commit and freed once no read lock can cover them.
// Tiers: a version's copies are memory replicas (extents of mounted segments) and disk replicas
// (the SSD tier: a node's own location). A demotion (the committed version being copied to a
// node's disk) is tracked apart from the pending write, so an upsert and a demotion of one
// object run at once: the memory a demotion reads from is held until the demotion resolves, and
// the disk copy is attached only if the version it copied is still the committed one. A promotion
// (a disk-only version copied back into memory) is tracked apart the same way.
// Ownership: held by value in its entry of a shard's ObjectTable; guarded by that shard's mutex.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/inline_vector.h"
#include "common/rare_optional.h"
#include "common/rare_vector.h"
#include "master/space/segment_table.h"

namespace granary::master {

// The largest object a put takes (and a snapshot holds).
inline constexpr uint64_t kMaxObjectBytes = uint64_t{1} << 40;  // 1 TiB

// What extents occupy in their segments: the unit eviction counts in, the same as segment usage.
inline uint64_t OccupiedBytes(std::span<const Extent> extents) {
  uint64_t total = 0;
  for (const auto& e : extents) total += OffsetAllocator::AllocationSize(e.length);
  return total;
}
inline uint64_t OccupiedBytes(std::initializer_list<Extent> extents) {
  return OccupiedBytes(std::span<const Extent>(extents.begin(), extents.size()));
}

// S3-FIFO's frequency cap: an object survives at most this many passes of the main queue unread.
inline constexpr uint8_t kMaxQueueReads = 3;

// A deterministic FIFO position from an operation's time and a key's index in it. Bits 14-15
// stay clear: the prefix policy keeps a probation class there (PrefixQueueStamp).
inline int64_t QueueStamp(int64_t now_ms, size_t index) {
  return (now_ms << 16) | static_cast<int64_t>(std::min<size_t>(index, 0x3FFF));
}

// The prefix policy's queue position of key `index` of a put batch of `batch_size` keys, with
// the order in which it leaves probation (ProbationClass: lower leaves first). An engine puts a
// request's missing blocks in prefix order, so on the conversation trace (docs/eviction.md):
// - the batch's last key is the chain's tail, the block with the prompt's partial last tokens,
//   which the next turn re-hashes: about 1% are read again (class 0);
// - a long batch is a long new stretch of prompt (a pasted document): 21-28% are read again
//   beyond 32 keys (class 1), 24-30% beyond 8 (class 2), against 33-51% for shorter ones (3).
// Within a batch, keys queue in reverse, so a chain leaves from its tail and a head that stays
// cached keeps serving shorter matches.
inline int64_t PrefixQueueStamp(int64_t now_ms, size_t index, size_t batch_size) {
  int probation_class = 3;
  if (batch_size > 1 && index + 1 == batch_size) {
    probation_class = 0;
  } else if (batch_size > 32) {
    probation_class = 1;
  } else if (batch_size > 8) {
    probation_class = 2;
  }
  const size_t from_tail = index < batch_size ? batch_size - 1 - index : 0;
  return (now_ms << 16) | (static_cast<int64_t>(3 - probation_class) << 14) |
         static_cast<int64_t>(std::min<size_t>(from_tail, 0x3FFF));
}
// The class PrefixQueueStamp gave a stamp; 3 (the last to leave) for a plain QueueStamp.
inline int ProbationClass(int64_t stamp) { return 3 - static_cast<int>((stamp >> 14) & 3); }

// A copy on a node's local disk. The node chose `location` (a bucket and offset, a file...); the
// master names it back to readers and removals, never interprets it.
struct DiskReplica {
  std::string node_id;  // the node process (client id) that holds it
  uint64_t location = 0;
  uint64_t length = 0;
  // The disk itself (a node's --disk-dir), the same across the node's restarts while node_id
  // changes: a restarted node's copies are found, and told to go, by it.
  uint64_t disk_id = 0;
};

// A put's own persistence (ReplicateConfig.persistence): whether the offload planner copies this
// version to disk. kDefault follows the master's --persistence; the others override it.
enum class PutPersistence : uint8_t { kDefault = 0, kEager = 1, kLazy = 2, kNone = 3 };
inline constexpr uint8_t kMaxPutPersistence = 3;

struct Version {
  uint64_t size = 0;
  uint64_t checksum = 0;
  uint64_t gen = 0;               // the put generation that wrote it: names this version
  // Memory replicas: almost always one, held inline. Disk replicas: most versions have none.
  InlineVector<Extent> replicas;
  RareVector<DiskReplica> disk;
  // A node's disk evicted a copy of this version: it is not offloaded again (with a disk smaller
  // than the memory, eager offload would otherwise rewrite what the disk just evicted, forever).
  bool offload_declined = false;
  // As its put (or upsert) asked: each version carries its own, an upsert does not inherit it.
  PutPersistence persistence = PutPersistence::kDefault;
  // Memory replicas it should have: its put's replica_num, or Replicate's. A version with fewer
  // (a node died or is draining) gets copies made (ReplicaCopyStartOp). Eviction of its memory
  // sets it to 0: the cache let those go, nothing was lost.
  uint8_t want_replicas = 0;
  // Whether the OptionalVersion holding it holds a version, in what would be padding. It belongs
  // to the slot, not the value: copies start unset, and assigning a Version leaves it alone, so
  // `*meta.committed = v` keeps the object's version held. Never encoded.
  struct SlotFlag {
    bool set = false;
    SlotFlag() = default;
    SlotFlag(const SlotFlag&) {}
    SlotFlag& operator=(const SlotFlag&) { return *this; }
  } held_by_optional;
};

// std::optional<Version> without optional's flag and the 7 bytes of padding after it (80 bytes,
// not 88: every object has one): whether it holds a version is Version::held_by_optional.
// Promise: behaves as std::optional<Version> for the calls it offers.
class OptionalVersion {
 public:
  using OptionalFieldTag = void;  // encodes as std::optional<Version> (binary_codec.h)
  OptionalVersion() = default;
  OptionalVersion(std::nullopt_t) {}  // NOLINT: as std::optional
  OptionalVersion(Version v) : value_(std::move(v)) { Hold(true); }  // NOLINT: as std::optional
  OptionalVersion(const OptionalVersion& other) : value_(other.value_) { Hold(other.has_value()); }
  OptionalVersion(OptionalVersion&& other) noexcept : value_(std::move(other.value_)) {
    Hold(other.has_value());
  }
  OptionalVersion& operator=(const OptionalVersion& other) {
    value_ = other.value_;
    Hold(other.has_value());
    return *this;
  }
  OptionalVersion& operator=(OptionalVersion&& other) noexcept {
    value_ = std::move(other.value_);
    Hold(other.has_value());
    return *this;
  }
  OptionalVersion& operator=(std::nullopt_t) {
    reset();
    return *this;
  }
  OptionalVersion& operator=(Version v) {
    value_ = std::move(v);
    Hold(true);
    return *this;
  }
  Version& emplace() {
    value_ = Version{};
    Hold(true);
    return value_;
  }
  void reset() {  // frees the replica lists now, as optional would
    value_ = Version{};
    Hold(false);
  }

  bool has_value() const { return value_.held_by_optional.set; }
  explicit operator bool() const { return has_value(); }
  Version& operator*() { return value_; }
  const Version& operator*() const { return value_; }
  Version* operator->() { return &value_; }
  const Version* operator->() const { return &value_; }

 private:
  void Hold(bool held) { value_.held_by_optional.set = held; }
  Version value_;
};
static_assert(sizeof(OptionalVersion) == sizeof(Version));

// The committed version `version_gen` being copied to `node_id`'s disk.
struct Demotion {
  std::string node_id;
  uint64_t version_gen = 0;
  int64_t start_ms = 0;
  // Memory the demotion may still be reading although the version left it (an upsert committed,
  // or a remove): freed when the demotion ends, aborts or times out.
  std::vector<Extent> held;
  int64_t hold_until_ms = 0;  // read locks the held memory had when it was retired
  uint64_t disk_id = 0;       // the disk being written
};

// A disk-only committed version `version_gen` being copied back to memory by `node_id` (the node
// holding the disk copy at `location`), into `extent` of its own segment: a memory replica that is
// not complete, never named to a reader, attached by PromoteEnd only if the version is still the
// committed one. The node is its only writer, so it is freed only when the node says its write is
// over (PromoteEnd), by the node's next offload round (rounds are serial), or with the segment.
// The same record tracks a re-replication copy (`copy`): a node copying a committed version from
// another replica (memory or disk, any node's) into its own segment, for the same reasons and
// under the same rules; the node's copy rounds are counted apart from its offload rounds.
struct Promotion {
  std::string node_id;
  uint64_t version_gen = 0;
  Extent extent;
  uint64_t location = 0;  // the disk copy it reads
  uint64_t round = 0;     // the node's offload round that named it (copy round for a copy)
  int64_t start_ms = 0;
  bool copy = false;      // a re-replication copy, not a promotion
};

// Space a client holds for its next puts (ReserveOp): one extent of exactly extent.length bytes,
// its own until it commits a key into it, releases it, or expires_ms passes.
struct HeldReservation {
  std::string client_id;
  Extent extent;
  int64_t expires_ms = 0;
};

struct PinConfig {
  bool hard = false;
  bool soft = false;
  int64_t soft_ttl_ms = 0;
};

struct PendingWrite {
  std::string client_id;  // the only client that may end or revoke it...
  uint64_t gen = 0;       // ...quoting this generation (a later put of the key has another)
  Version version;
  PinConfig pin;
  int64_t start_ms = 0;
  bool writer_expired = false;  // its client was declared dead: a new put may take the key over
};

// A read lock held by one client; counted, because a client may read a key from several threads.
// An entry whose count is 0 is the client's cache lease instead (docs/control-path.md, "Gets
// without the master's round trip"): until expiry_ms the client may read the version it was
// last answered from the replicas it was named, with no call to the master. It holds the
// object's space as a lock does (eviction, frees); it does not make a remove "being read".
struct ReadLock {
  std::string client_id;
  uint32_t count = 0;
  int64_t expiry_ms = 0;
};

// A soft pin (PlacementConfig.with_soft_pin): eviction takes the object last while now < until_ms;
// each read renews it by ttl_ms.
struct SoftPin {
  int64_t until_ms = 0;
  int64_t ttl_ms = 0;
};

// What few objects have at any moment: a pending write, a demotion, a promotion, read locks, a
// soft pin. ObjectMeta keeps them in one block behind one pointer, made when the first of them
// comes and freed when the last goes (issue 23: five pointers in every object were 40 of its 144
// bytes). The block is 72 bytes: the large records (100-170 bytes each) have their own blocks,
// so a soft-pinned or read-locked object does not carry the room of a pending write.
struct ObjectRare {
  RareOptional<PendingWrite> pending;
  RareOptional<Demotion> demotion;
  RareOptional<Promotion> promotion;
  std::vector<ReadLock> readers;
  std::optional<SoftPin> soft_pin;

  bool empty() const { return !pending && !demotion && !promotion && readers.empty() && !soft_pin; }
};
static_assert(sizeof(ObjectRare) <= 72);

struct ObjectMeta {
  // Last access and the flags share one word (8 bytes fewer in each object): 48 bits of
  // milliseconds reach the year 6400, and a snapshot's decode refuses what does not fit.
  static constexpr int kAccessBits = 48;
  static bool AccessFits(int64_t ms) {
    const int64_t high = ms >> (kAccessBits - 1);
    return high == 0 || high == -1;
  }

  OptionalVersion committed;
  int64_t last_access_ms : kAccessBits = 0;
  // For the s3fifo eviction policy (kept under both, so switching policy needs no migration).
  uint8_t reads : 8 = 0;        // reads since it entered its queue, capped at kMaxQueueReads
  bool in_main : 1 = false;     // false: the probation queue new objects enter
  bool hard_pinned : 1 = false;
  // Orders each queue first in, first out: QueueStamp(time it entered, index in its op).
  int64_t queue_stamp = 0;

  // The rare fields, read: an absent one reads as empty.
  const RareOptional<PendingWrite>& pending() const { return Rare().pending; }
  const RareOptional<Demotion>& demotion() const { return Rare().demotion; }
  const RareOptional<Promotion>& promotion() const { return Rare().promotion; }
  const std::vector<ReadLock>& readers() const { return Rare().readers; }
  const std::optional<SoftPin>& soft_pin() const { return Rare().soft_pin; }
  // Changed in place: each requires the field to be there.
  PendingWrite& pending_mut() { return *rare_->pending; }
  Demotion& demotion_mut() { return *rare_->demotion; }
  SoftPin& soft_pin_mut() { return *rare_->soft_pin; }
  // Set and reset: the block is made by the first set and freed by the reset that empties it.
  void set_pending(PendingWrite p) { Make().pending = std::move(p); }
  void set_demotion(Demotion d) { Make().demotion = std::move(d); }
  void set_promotion(Promotion p) { Make().promotion = std::move(p); }
  void set_soft_pin(SoftPin p) { Make().soft_pin = p; }
  void reset_pending() { Reset(&ObjectRare::pending); }
  void reset_demotion() { Reset(&ObjectRare::demotion); }
  void reset_promotion() { Reset(&ObjectRare::promotion); }
  void reset_soft_pin() { Reset(&ObjectRare::soft_pin); }
  // A read lock of `client_id` more; its locks now expire at `expiry_ms`.
  void TakeReadLock(const std::string& client_id, int64_t expiry_ms) {
    auto& readers = Make().readers;
    auto holder = std::find_if(readers.begin(), readers.end(), [&](const ReadLock& l) {
      return l.count > 0 && l.client_id == client_id;
    });
    if (holder == readers.end()) {
      readers.push_back({client_id, 1, expiry_ms});
    } else {
      holder->count++;
      holder->expiry_ms = expiry_ms;
    }
  }
  // One read lock of `client_id` less, of those still live at `now_ms` if given; false if it
  // held none.
  bool ReleaseReadLock(std::string_view client_id,
                       int64_t now_ms = std::numeric_limits<int64_t>::min()) {
    if (!rare_) return false;
    auto& readers = rare_->readers;
    auto holder = std::find_if(readers.begin(), readers.end(), [&](const ReadLock& l) {
      return l.count > 0 && l.client_id == client_id && l.expiry_ms > now_ms;
    });
    if (holder == readers.end()) return false;
    if (--holder->count == 0) readers.erase(holder);
    Tidy();
    return true;
  }
  // `client_id`'s cache lease now lasts until at least `until_ms`; true if it had none before
  // (a live or expired one).
  bool TakeCacheLease(const std::string& client_id, int64_t until_ms) {
    auto& readers = Make().readers;
    auto lease = std::find_if(readers.begin(), readers.end(), [&](const ReadLock& l) {
      return l.count == 0 && l.client_id == client_id;
    });
    if (lease != readers.end()) {
      lease->expiry_ms = std::max(lease->expiry_ms, until_ms);
      return false;
    }
    readers.push_back({client_id, 0, until_ms});
    return true;
  }
  // A counted read lock is live: a client is copying the bytes (a remove that is not forced
  // waits for it; a cache lease does not count).
  bool IsBeingRead(int64_t now_ms) const {
    for (const auto& lock : readers()) {
      if (lock.count > 0 && lock.expiry_ms > now_ms) return true;
    }
    return false;
  }
  // Memory the object's demotion may still read although the version left it: held until the
  // demotion resolves, and not before its read locks expire.
  void HoldForDemotion(std::span<const Extent> extents) {
    Demotion& d = demotion_mut();
    d.held.insert(d.held.end(), extents.begin(), extents.end());
    d.hold_until_ms = std::max(d.hold_until_ms, LatestLockExpiry());
  }
  void ClearReadLocks() {
    if (!rare_) return;
    rare_->readers.clear();
    Tidy();
  }
  // The rare fields as one record, for the codec: Rare() reads; SetRare keeps a block only if
  // any field is there.
  const ObjectRare& Rare() const { return rare_ ? *rare_ : kNoRare; }
  void SetRare(ObjectRare rare) {
    if (rare.empty()) {
      rare_.reset();
    } else {
      rare_ = std::move(rare);
    }
  }
  bool has_rare_block() const { return static_cast<bool>(rare_); }

  bool IsReadLocked(int64_t now_ms) const {
    for (const auto& lock : readers()) {
      if (lock.expiry_ms > now_ms) return true;
    }
    return false;
  }
  int64_t LatestLockExpiry() const {
    int64_t latest = 0;
    for (const auto& lock : readers()) latest = std::max(latest, lock.expiry_ms);
    return latest;
  }
  void DropExpiredLocks(int64_t now_ms) {
    if (!rare_) return;
    erase_if(rare_->readers, [now_ms](const ReadLock& l) { return l.expiry_ms <= now_ms; });
    Tidy();
  }
  // Drops the cache leases over by `now_ms` (nothing else: counted locks go by their release or
  // DropExpiredLocks); true while one is left.
  bool DropEndedCacheLeases(int64_t now_ms) {
    if (!rare_) return false;
    erase_if(rare_->readers,
             [now_ms](const ReadLock& l) { return l.count == 0 && l.expiry_ms <= now_ms; });
    const bool left = std::any_of(rare_->readers.begin(), rare_->readers.end(),
                                  [](const ReadLock& l) { return l.count == 0; });
    Tidy();
    return left;
  }
  bool IsSoftPinned(int64_t now_ms) const { return soft_pin() && soft_pin()->until_ms > now_ms; }
  // Eviction never takes an object being written, read or demoted, nor a hard-pinned one, nor one
  // with no memory to free; soft-pinned ones only when the caller has run out of everything else.
  bool IsEvictable(int64_t now_ms, bool allow_soft_pinned) const {
    if (!committed || hard_pinned) return false;
    if (committed->replicas.empty()) return false;  // on disk only: nothing of memory to free
    if (!rare_) return true;
    if (pending() || demotion() || IsReadLocked(now_ms)) return false;
    return allow_soft_pinned || !IsSoftPinned(now_ms);
  }

 private:
  inline static const ObjectRare kNoRare{};
  ObjectRare& Make() {
    if (!rare_) rare_ = ObjectRare{};
    return *rare_;
  }
  template <typename Field>
  void Reset(Field ObjectRare::*field) {
    if (!rare_) return;
    ((*rare_).*field).reset();
    Tidy();
  }
  void Tidy() {
    if (rare_ && rare_->empty()) rare_.reset();
  }
  RareOptional<ObjectRare> rare_;
};
static_assert(sizeof(ObjectMeta) == 96);

}  // namespace granary::master
