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
// Ownership: owns the layout and the I/O engine. Thread safety: see DiskStore.
#pragma once

#include <array>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
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
  struct Unit {
    uint64_t bytes = 0;
    uint32_t live = 0;          // index entries pointing here
    uint32_t readers = 0;       // reads in flight
    uint64_t last_read = 0;     // read_tick_ of its last write or read; 0: recovered, unused since
    bool committing = true;     // being filled by Write: not a victim yet
    bool doomed = false;        // out of the index (evicted / emptied): destroy when unread
    bool destroying = false;    // claimed by the one thread that destroys it
    std::shared_ptr<FileHandle> handle;
    std::vector<std::string> keys;  // every key placed here (some may have moved on)
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
  bool ReleaseEntryLocked(uint64_t unit_id);
  // Removes `key` if its entry still lives in `unit_id`; appends units to destroy.
  void DropEntry(std::string_view key, uint64_t unit_id, std::vector<uint64_t>* destroy);
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
};

}  // namespace granary::disk
