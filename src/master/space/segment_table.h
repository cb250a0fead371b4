// master/space/segment_table.h - the mounted segments and their offset allocators.
//
// Promise: a segment is known from Mount until Unmount; its id is never reused, so a replica that
// names an unmounted segment can never alias a newer one. A segment mounted without `fresh` (a
// remount of memory an earlier mount handed out) allocates nothing until its quarantine ends:
// late readers and writers of the old mount may still touch it until then. Allocation and free on a segment are
// serialised by that segment's own mutex; the table itself by a shared mutex (lookups shared).
// Lock order (see master_state.h): shard -> table -> segment. Unmount never holds the table lock
// while taking a shard lock.
// Ownership: the table owns the segments; SegmentIdentity is shared, immutable and outlives
// Unmount for whoever still holds it (e.g. a reply being built).
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "granary/status.h"
#include "master/space/offset_allocator.h"
#include "security/capability.h"

namespace granary::master {

// What a client needs to reach a segment; fixed at mount.
struct SegmentIdentity {
  uint64_t id = 0;
  std::string name;
  std::string client_id;  // the process that contributed the memory
  std::string endpoint;   // its data-plane address
  uint64_t size = 0;
  std::string shm_name;   // for clients on the same host
  std::string host_id;
  uint64_t token = 0;     // per mount; guards the data plane against stale metadata
  std::string capability_key;  // per mount: signs capabilities (never answered)
  std::shared_ptr<const security::CapabilitySigner> signer;  // of capability_key; null if empty
  bool capabilities_required = false;  // the node serves READ / WRITE under capabilities only
  int64_t usable_from_ms = 0;  // no allocation before this (quarantine of a remount)
};

// What a node says about a segment when it mounts it.
struct SegmentSpec {
  std::string name;
  uint64_t size = 0;
  std::string endpoint;
  std::string shm_name;
  std::string host_id;
  uint64_t token = 0;
  bool fresh = false;
  std::string capability_key;  // security::kCapabilityKeyBytes, or empty (an older node)
  bool capabilities_required = false;  // needs capability_key  // memory never handed out by any mount: no quarantine
};

struct SegmentUsage {
  std::shared_ptr<const SegmentIdentity> identity;
  OffsetAllocator::Stats stats;
  uint64_t replica_count = 0;
  bool draining = false;
};

// A segment being drained (or drained: `done`, unmounted, its name refused until undrained).
struct DrainMark {
  bool drop = false;
  int64_t start_ms = 0;
  bool done = false;
};

// The largest segment MountSegment takes: 1 PiB.
inline constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 50;

// One replica's bytes inside a segment. Its offset and length also name its allocation: the
// allocator keeps nothing per allocation (OffsetAllocator), so this is all an object's replica
// costs the master.
struct Extent {
  uint64_t segment_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;  // the object's size; it occupies OffsetAllocator::AllocationSize(length)
  friend bool operator==(const Extent&, const Extent&) = default;
};
static_assert(sizeof(Extent) == 24);

class SegmentTable {
 public:
  // Ids count up from first_id. The master passes the wall clock in ms << 16 (see
  // DefaultSegmentIdBase), so a restarted master never hands out an id that a client may still
  // have cached for another segment; a standby replaying the operations uses the same base.
  explicit SegmentTable(uint64_t first_id) : next_id_(first_id) {}
  static uint64_t DefaultSegmentIdBase();

  // Mounts a segment. Same name, same client, same size and token: returns the existing id
  // (idempotent remount). Same name otherwise: SEGMENT_ALREADY_EXISTS. A spec that is not fresh
  // allocates nothing before now_ms + quarantine_ms.
  Result<uint64_t> Mount(const std::string& client_id, const SegmentSpec& spec, int64_t now_ms,
                         int64_t quarantine_ms);
  // Removes the segment; its extents become invalid. SEGMENT_NOT_FOUND or ILLEGAL_CLIENT on misuse
  // (an empty client_id skips the owner check, for the master's own expiry of dead clients).
  Result<uint64_t> Unmount(const std::string& client_id, const std::string& name);

  // Allocates `size` bytes on one segment from `candidates`, tried in order, skipping `exclude`d
  // ids, segments in quarantine at now_ms and draining ones. Returns nullopt when none has room.
  std::optional<Extent> AllocateOn(const std::vector<uint64_t>& candidates, uint64_t size,
                                   const std::vector<uint64_t>& exclude, int64_t now_ms);
  // Drains (see DrainOp in master/state/operations.h), by segment name. StartDrain needs the
  // segment mounted (SEGMENT_NOT_FOUND) and not draining already (OBJECT_ALREADY_EXISTS).
  // A mount of a name whose drain is done is refused (UNAVAILABLE_IN_CURRENT_STATUS); of a name
  // whose drain is under way, mounted draining.
  Status StartDrain(const std::string& name, bool drop, int64_t now_ms);
  Status StopDrain(const std::string& name);  // SEGMENT_NOT_FOUND: no drain of that name
  void MarkDrained(const std::string& name);
  std::map<std::string, DrainMark> Drains() const;
  // Whether some drain is not done: one atomic read (hot paths ask before looking closer).
  bool AnyDrainUnderWay() const { return drains_under_way_.load(std::memory_order_relaxed) > 0; }
  bool IsDraining(uint64_t id) const;
  // Free bytes over capacity (0 for a segment not mounted): placement's load measure.
  double FreeShare(uint64_t id) const;
  // The largest segment's capacity: a request above it can never be placed.
  uint64_t LargestCapacity() const;
  // Frees an extent; a no-op if its segment is gone (its memory went with it).
  void Free(const Extent& extent);
  // Trims a live extent to `length` bytes (OffsetAllocator::Shrink): its end is free at once and
  // extent.length becomes `length`. False, changing nothing, if its segment is gone or the
  // allocator refuses (length 0 or above the extent's).
  bool Shrink(Extent& extent, uint64_t length);

  // Candidate order for new objects: the mounted preferred names first (in order), then every
  // other segment, starting from a rotating position so load spreads.
  struct Placement {
    std::vector<uint64_t> ids;
    size_t preferred = 0;  // how many leading ids are preferred segments
  };
  Placement PlacementOrder(const std::vector<std::string>& preferred);

  std::shared_ptr<const SegmentIdentity> Find(uint64_t id) const;
  std::shared_ptr<const SegmentIdentity> FindByName(const std::string& name) const;
  bool IsMounted(uint64_t id) const;
  std::vector<uint64_t> SegmentsOf(const std::string& client_id) const;
  std::vector<std::string> NamesOf(const std::string& client_id) const;
  std::vector<SegmentUsage> Usage() const;
  // The free blocks of one segment by address (empty if it is not mounted).
  std::vector<OffsetAllocator::Block> FreeBlocks(uint64_t id) const;

  uint64_t total_capacity() const { return total_capacity_.load(std::memory_order_relaxed); }
  uint64_t used_bytes() const { return used_bytes_.load(std::memory_order_relaxed); }
  size_t segment_count() const;
  // Bumped by every mount and unmount, so clients can tell their segment view is stale.
  uint64_t view_version() const { return view_version_.load(std::memory_order_relaxed); }

  // The whole table (identities, allocators, id counter, rotation), for a master snapshot.
  // The caller excludes every mutation meanwhile (MasterState holds its apply lock).
  void Encode(Encoder& out) const;
  bool Decode(Decoder& in);

 private:
  struct Segment {
    std::shared_ptr<const SegmentIdentity> identity;
    mutable std::mutex mu;
    OffsetAllocator allocator;
    std::atomic<uint64_t> replica_count{0};
    bool draining = false;  // under the table's mutex
    Segment(std::shared_ptr<const SegmentIdentity> id, uint64_t size)
        : identity(std::move(id)), allocator(size) {}
  };

  mutable std::shared_mutex mu_;
  std::map<uint64_t, std::unique_ptr<Segment>> segments_;  // ordered: stable placement order
  std::unordered_map<std::string, uint64_t> by_name_;
  std::map<std::string, DrainMark> drains_;  // ordered: canonical encoding
  uint64_t next_id_;
  std::atomic<uint64_t> rotation_{0};
  std::atomic<uint64_t> total_capacity_{0};
  std::atomic<uint64_t> used_bytes_{0};
  std::atomic<uint64_t> view_version_{0};
  std::atomic<size_t> drains_under_way_{0};  // drains_ not done; set under mu_ (CountDrains)
  void CountDrains();                           // mu_ held exclusively
};

}  // namespace granary::master
