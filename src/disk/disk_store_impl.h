// disk/disk_store_impl.h - the DiskStore every backend shares: the key index, the units
// (eviction's granularity) with their read pins, the budget, eviction and the read path. The
// on-disk format is the Layout's business (layout.h); this class never builds a path.
//
// Locking: the key index is split in kShards shards, each under its own mutex, so lookups of
// different keys do not meet; units, the budget and the read pins are under units_mu_. Order:
// a shard's mutex, then units_mu_; never the other way round, and no I/O under either.
// A unit is destroyed exactly once, by whoever first sees it doomed (evicted, or without live
// objects) with no read pinning it - a finishing read, Remove, or ReclaimVictims - except that
// SelectVictims never destroys (phase one does no I/O).
// A copy that leaves the index by Remove or a replacing write leaves the disk too before the
// call returns: its unit is destroyed then, or (when the unit stays: other live copies, reads)
// pinned like a read while the layout forgets the copy (Layout::Forget), so that the unit
// cannot be destroyed, and its space reused, under that.
// Copy-grained lru (evict_copies_: the lru policy on a layout that ReleasesCopySpace): eviction
// takes the least recently used copy, not the unit holding it. Each unit keeps, per slot, its
// copy's last use and reads in flight; copy_order_ holds, per unit, a lower bound of its least
// recent live copy's use (a read only raises uses, so a stale bound is corrected when met). A
// copy leaves the reads' reach (its slot's use becomes 0) under units_mu_ before its space is
// queued as a hole; a hole is given back (Layout::ReleaseSpace) only once its tombstone is
// written and no read of that slot is in flight.
// Ownership: owns the layout and the I/O engine. Thread safety: see DiskStore.
#pragma once

#include <array>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "disk/disk_store.h"
#include "disk/layout.h"

namespace granary::disk {

class DiskStoreImpl final : public DiskStore {
 public:
  // dir_lock: the held flock of <dir>/LOCK, released when the store is destroyed.
  DiskStoreImpl(DiskStoreOptions options, std::unique_ptr<FileHandle> dir_lock, std::unique_ptr<DiskIo> io,
                std::unique_ptr<Layout> layout, uint64_t capacity, bool direct_io);
  ~DiskStoreImpl() override;

  // Fills the index from the layout's recovery scan. Called once, by Open.
  Status LoadRecovery();

  std::vector<Result<StoredObject>> Write(std::span<const ObjectWrite> objects) override;
  std::vector<ReadResult> Read(std::span<const ReadRequest> requests) override;
  Status Remove(std::string_view key, uint64_t location) override;
  std::optional<StoredObject> Lookup(std::string_view key) const override;
  std::vector<StoredObject> ListObjects() const override;
  DiskUsage Usage() const override;
  const RecoveryReport& recovery() const override { return recovery_; }
  std::vector<StoredObject> SelectVictims(uint64_t bytes) override;
  Status ReclaimVictims(std::chrono::milliseconds max_wait) override;
  IoMode io_mode() const override { return io_->mode(); }
  bool direct_io() const override { return direct_io_; }
  DiskBackend backend() const override { return layout_->kind(); }

 private:
  struct Entry {
    uint64_t gen = 0, size = 0, checksum = 0;
    Placement placement;
  };
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    mutable std::mutex mu;
    std::unordered_map<std::string, Entry, KeyHash, std::equal_to<>> entries;
  };
  // A copy's place in its unit, for copy-grained lru.
  struct CopySlot {
    uint64_t last_use = 0;  // read_tick_ of its write or last read; 0: no live copy here
    uint32_t readers = 0;   // reads in flight of this copy
    uint32_t blocks = 0;    // its value's 4 KiB blocks
  };
  // A copy gone from the index whose value space is still held.
  struct Hole {
    std::string key;
    uint64_t gen = 0;
    Placement placement;
    ValueRange range;
    bool forgotten = false;  // its tombstone is written (Remove); else evicted, not yet
  };
  struct Unit {
    uint64_t bytes = 0;
    uint32_t live = 0;          // index entries pointing here
    uint32_t readers = 0;       // reads in flight
    uint64_t last_read = 0;     // read_tick_ of its last write or read; 0: recovered, unused since
    bool committing = true;     // being filled by Write: not a victim yet
    bool doomed = false;        // out of the index (evicted / emptied): destroy when unread
    bool destroying = false;    // claimed by the one thread that destroys it
    std::shared_ptr<FileHandle> handle;
    std::vector<std::string> keys;  // by slot, every key placed here (some may have moved on)
    std::vector<CopySlot> slots;    // by slot (copy-grained lru only)
    std::vector<Hole> holes;        // waiting for their slot's reads (copy-grained lru only)
    uint64_t hole_bytes = 0;        // of holes queued or being given back, while not doomed
  };
  static constexpr size_t kShards = 16;
  // Open descriptors kept with units between reads (buckets): beyond this many, the oldest cached
  // one is dropped (it closes once no read holds it), so many small buckets cannot exhaust fds.
  static constexpr size_t kMaxCachedHandles = 1024;

  Shard& ShardOf(std::string_view key) const;
  static StoredObject ToStored(std::string_view key, const Entry& e);
  // With units_mu_ held: marks the unit doomed; true when the caller must destroy it now.
  bool DoomLocked(uint64_t unit_id, Unit& unit, bool destroy_now);
  // One index entry leaves a unit (with units_mu_ held). True: destroy it now.
  bool ReleaseEntryLocked(uint64_t unit_id, uint32_t slot);
  // Removes `key` if its entry still lives in `unit_id`; appends units to destroy.
  void DropEntry(std::string_view key, uint64_t unit_id, std::vector<uint64_t>* destroy);
  // A read or a claim leaves the unit (units_mu_ held): appends it to `destroy` when it was the
  // last pin of a doomed unit.
  void UnpinLocked(uint64_t unit_id, Unit& unit, std::vector<uint64_t>* destroy);
  // Copy-grained lru, with units_mu_ held. A copy entered or left its slot.
  void NoteCopyLocked(Unit& unit, uint32_t slot, uint64_t size);
  void EndCopyLocked(Unit& unit, uint32_t slot);
  // The unit's least recently used live copy, and the use of the next one (0: none).
  struct OldestCopies {
    uint64_t use = 0;
    uint32_t slot = 0;
    uint64_t next_use = 0;
  };
  static std::optional<OldestCopies> OldestCopy(const Unit& unit);
  static bool SlotReadLocked(const Unit& unit, uint32_t slot);  // a read of that copy is in flight
  void OrderUnitLocked(uint64_t unit_id, const Unit& unit);
  // Queues the space of a copy gone from the index (unit not doomed).
  void QueueHoleLocked(Unit& unit, std::string key, uint64_t gen, const Placement& placement, bool forgotten);
  std::vector<StoredObject> SelectCopyVictims(uint64_t bytes);
  // Gives back the holes no read holds (tombstones first); a hole whose tombstone could not be
  // written is queued again. The first error.
  Status ReleaseHoles();
  static constexpr size_t kHolesPerAppend = 1024;  // 48 KiB of tombstones: within the log's reserve
  // The first error (every one is logged); the units leave units_ either way.
  Status DestroyUnits(const std::vector<uint64_t>& unit_ids);

  // A copy leaving the index for good. going: its unit goes with it (claimed for destruction);
  // else the unit is pinned (readers) until the layout has forgotten the copy.
  struct Leaving {
    std::string key;
    uint64_t gen = 0;
    Placement placement;
    bool going = false;
  };
  // With units_mu_ held, the entry already out of its shard. False: the unit is gone already.
  bool LeaveLocked(Leaving& leaving);
  // With no lock held: makes the copies durably gone (destroying their units, or Layout::Forget),
  // then unpins. The first error; every copy is attempted.
  Status ForgetCopies(const std::vector<Leaving>& leaving);

  DiskStoreOptions options_;
  std::unique_ptr<FileHandle> dir_lock_;
  std::unique_ptr<DiskIo> io_;
  std::unique_ptr<Layout> layout_;
  const uint64_t capacity_;
  const bool direct_io_;
  const bool evict_copies_;  // copy-grained lru
  RecoveryReport recovery_;
  bool loaded_ = false;  // LoadRecovery completed

  mutable std::array<Shard, kShards> shards_;
  mutable std::mutex units_mu_;
  std::condition_variable units_cv_;  // a read finished or a unit was destroyed
  std::map<uint64_t, Unit> units_;    // by id: creation order
  uint64_t used_ = 0;        // bytes of every unit in units_
  uint64_t reserved_ = 0;    // charged by writes in progress
  uint64_t reclaiming_ = 0;  // of used_: doomed units
  uint64_t read_tick_ = 0;
  size_t cached_handles_ = 0;           // units with a handle
  std::deque<uint64_t> handle_order_;   // units in the order their handle was cached
  std::set<std::pair<uint64_t, uint64_t>> copy_order_;  // (bound of oldest use, unit id)
};

}  // namespace granary::disk
