#include "disk/disk_store_impl.h"

#include <algorithm>
#include <cstring>

#include "common/checksum.h"
#include "common/logging.h"

namespace granary::disk {

namespace {

Status KeyStatus(std::string_view key) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return Status(ErrorCode::INVALID_KEY,
                  "disk key of " + std::to_string(key.size()) + " bytes: expected 1 to 4096");
  }
  return Status::Ok();
}

std::string Shown(std::string_view key) {
  std::string out;
  for (char c : key.substr(0, 80)) out += (c >= 0x20 && c < 0x7F) ? c : '?';
  return key.size() > 80 ? out + "..." : out;
}

}  // namespace

DiskStoreImpl::DiskStoreImpl(DiskStoreOptions options, std::unique_ptr<FileHandle> dir_lock,
                             std::unique_ptr<DiskIo> io, std::unique_ptr<Layout> layout, uint64_t capacity,
                             bool direct_io)
    : options_(std::move(options)),
      dir_lock_(std::move(dir_lock)),
      io_(std::move(io)),
      layout_(std::move(layout)),
      capacity_(capacity),
      direct_io_(direct_io),
      evict_copies_(options_.eviction == EvictionPolicy::kLru && layout_->ReleasesCopySpace()) {}

DiskStoreImpl::~DiskStoreImpl() {
  // No read can be in flight in a store being destroyed: delete what eviction and removes left,
  // so that what stays on disk is exactly the index, and let the layout record that.
  if (!loaded_) return;  // recovery failed: the index is not what the disk holds
  (void)ReclaimVictims(std::chrono::milliseconds(0));
  std::vector<RecoveredObject> live;
  for (auto& shard : shards_) {
    std::lock_guard lock(shard.mu);
    for (const auto& [key, e] : shard.entries) live.push_back(RecoveredObject{key, e.gen, e.size, e.checksum, e.placement});
  }
  layout_->SaveOnClose(live);
}

DiskStoreImpl::Shard& DiskStoreImpl::ShardOf(std::string_view key) const {
  return shards_[KeyHash{}(key) % kShards];
}

StoredObject DiskStoreImpl::ToStored(std::string_view key, const Entry& e) {
  return StoredObject{std::string(key), e.gen, e.size, e.checksum, e.placement.location,
                      e.placement.length};
}

Status DiskStoreImpl::LoadRecovery() {
  auto scan = layout_->Recover();
  if (!scan.ok()) return scan.status();
  recovery_ = std::move(scan->report);
  std::sort(scan->units.begin(), scan->units.end(),
            [](const RecoveredUnit& a, const RecoveredUnit& b) { return a.unit_id < b.unit_id; });
  std::vector<uint64_t> empty_units;
  for (auto& ru : scan->units) {
    std::lock_guard units_lock(units_mu_);
    Unit& unit = units_[ru.unit_id];
    unit.bytes = ru.bytes;
    unit.committing = false;
    used_ += ru.bytes;
  }
  // Units in creation order: of two copies of a key, the higher generation wins, then the later.
  // (Writes and removes forget the copies they drop, so two copies only meet here after a crash
  // between a write and that.)
  std::vector<RecoveredObject> losers;
  for (auto& ru : scan->units) {
    for (auto& ro : ru.objects) {
      Shard& shard = ShardOf(ro.key);
      std::lock_guard shard_lock(shard.mu);
      auto it = shard.entries.find(ro.key);
      if (it != shard.entries.end() && it->second.gen > ro.gen) {
        losers.push_back(ro);
        continue;
      }
      std::lock_guard units_lock(units_mu_);
      if (it != shard.entries.end()) {
        const Entry& old = it->second;
        losers.push_back(RecoveredObject{ro.key, old.gen, old.size, old.checksum, old.placement});
        Unit& old_unit = units_[old.placement.unit_id];
        old_unit.live--;
        EndCopyLocked(old_unit, old.placement.slot);
      }
      Unit& unit = units_[ru.unit_id];
      unit.live++;
      const uint32_t slot = ro.placement.slot;
      if (unit.keys.size() <= slot) unit.keys.resize(slot + 1);
      unit.keys[slot] = ro.key;
      NoteCopyLocked(unit, slot, ro.size);  // recovered, unused since: first to go, oldest first
      shard.entries[ro.key] = Entry{ro.gen, ro.size, ro.checksum, ro.placement};
    }
  }
  // A loser in a unit that stays must not outlive the winner: were the winner removed, it would
  // come back at the next open. (A unit of losers only is deleted whole below.)
  std::vector<ForgottenCopy> forget;
  {
    std::lock_guard units_lock(units_mu_);
    for (const auto& l : losers) {
      if (units_[l.placement.unit_id].live > 0) forget.push_back(ForgottenCopy{l.key, l.gen, l.placement});
    }
  }
  if (Status st = layout_->Forget(forget); !st.ok()) {
    return Status(st.code(), "recovery could not retire a superseded copy: " + st.message());
  }
  {
    std::lock_guard units_lock(units_mu_);
    for (auto& [id, unit] : units_) {
      if (unit.live == 0 && DoomLocked(id, unit, true)) empty_units.push_back(id);
    }
  }
  (void)DestroyUnits(empty_units);  // they held only superseded copies (logged on failure)
  if (evict_copies_) {
    std::lock_guard units_lock(units_mu_);
    read_tick_ = std::max<uint64_t>(read_tick_, 1);  // uses above 1 are newer than recovery's
    for (const auto& [id, unit] : units_) OrderUnitLocked(id, unit);
  }
  for (auto& shard : shards_) recovery_.objects += shard.entries.size();
  loaded_ = true;
  return Status::Ok();
}

std::vector<Result<StoredObject>> DiskStoreImpl::Write(std::span<const ObjectWrite> objects) {
  std::vector<Result<StoredObject>> results(
      objects.size(), Result<StoredObject>(ErrorCode::INTERNAL_ERROR, "not written"));
  std::vector<PreparedObject> prepared;
  std::vector<size_t> origin;        // prepared[j] is objects[origin[j]]
  std::vector<uint64_t> footprints;  // charged to reserved_
  for (size_t i = 0; i < objects.size(); ++i) {
    const ObjectWrite& w = objects[i];
    if (Status st = KeyStatus(w.key); !st.ok()) {
      results[i] = st;
      continue;
    }
    if (w.value.size() > options_.max_object_size) {
      results[i] = Status(ErrorCode::INVALID_PARAMS,
                          "object '" + Shown(w.key) + "' of " + std::to_string(w.value.size()) +
                              " bytes exceeds the disk tier's max_object_size " +
                              std::to_string(options_.max_object_size));
      continue;
    }
    uint64_t checksum = Checksum(w.value);
    if (w.checksum && *w.checksum != checksum) {
      results[i] = Status(ErrorCode::CHECKSUM_MISMATCH,
                          "object '" + Shown(w.key) + "': its bytes do not hash to the checksum given");
      continue;
    }
    if (auto existing = Lookup(w.key); existing && existing->gen == w.gen) {
      results[i] = *existing;  // written once: the same version is already here
      continue;
    }
    uint64_t footprint = layout_->Footprint(static_cast<uint32_t>(w.key.size()), w.value.size());
    {
      std::lock_guard lock(units_mu_);
      if (used_ + reserved_ + footprint > capacity_) {
        results[i] = Status(ErrorCode::NO_AVAILABLE_HANDLE,
                            "disk budget full: '" + Shown(w.key) + "' needs " + std::to_string(footprint) +
                                " bytes, " + std::to_string(used_ + reserved_) + " of " +
                                std::to_string(capacity_) + " in use (evict first)");
        continue;
      }
      reserved_ += footprint;
    }
    prepared.push_back(PreparedObject{w.key, w.gen, w.value, checksum});
    origin.push_back(i);
    footprints.push_back(footprint);
  }
  if (prepared.empty()) return results;

  LayoutWrite written = layout_->Write(prepared);

  uint64_t charged = 0;
  for (uint64_t f : footprints) charged += f;
  {
    std::lock_guard lock(units_mu_);
    reserved_ -= charged;
    for (const WrittenUnit& wu : written.units) {
      Unit& unit = units_[wu.unit_id];
      unit.bytes = wu.bytes;
      used_ += wu.bytes;
    }
  }
  std::vector<uint64_t> destroy;
  std::vector<Leaving> replaced;  // older copies of keys this batch wrote
  for (size_t j = 0; j < prepared.size(); ++j) {
    Result<Placement>& placed = written.placements[j];
    if (!placed.ok()) {
      results[origin[j]] = placed.status();
      continue;
    }
    const PreparedObject& p = prepared[j];
    Entry entry{p.gen, p.value.size(), p.checksum, *placed};
    Shard& shard = ShardOf(p.key);
    std::lock_guard shard_lock(shard.mu);
    std::lock_guard units_lock(units_mu_);
    auto it = shard.entries.find(p.key);
    if (it != shard.entries.end()) {
      Leaving old{std::string(p.key), it->second.gen, it->second.placement};
      if (LeaveLocked(old)) replaced.push_back(std::move(old));
      it->second = entry;
    } else {
      shard.entries.emplace(std::string(p.key), entry);
    }
    Unit& unit = units_[placed->unit_id];
    unit.live++;
    if (unit.keys.size() <= placed->slot) unit.keys.resize(placed->slot + 1);
    unit.keys[placed->slot] = std::string(p.key);
    NoteCopyLocked(unit, placed->slot, p.value.size());  // its use is set at commit, below
    results[origin[j]] = ToStored(p.key, entry);
  }
  {
    std::lock_guard lock(units_mu_);
    for (const WrittenUnit& wu : written.units) {
      Unit& unit = units_[wu.unit_id];
      unit.committing = false;
      unit.last_read = ++read_tick_;  // a write is a use: new units are not the first to go
      for (CopySlot& c : unit.slots) {
        if (c.last_use != 0) c.last_use = unit.last_read;
      }
      OrderUnitLocked(wu.unit_id, unit);
      // Every object of it replaced by a later one of the same batch: nothing left to keep.
      if (unit.live == 0 && DoomLocked(wu.unit_id, unit, true)) destroy.push_back(wu.unit_id);
    }
  }
  (void)DestroyUnits(destroy);
  // The new copies are written: a failure here leaves an old copy beside a new one, of which
  // recovery keeps the higher generation (then the later) and forgets the other.
  if (Status st = ForgetCopies(replaced); !st.ok()) {
    GLOG_WARN("disk tier: a replaced copy stays on disk: {}", st.ToString());
  }
  return results;
}

bool DiskStoreImpl::DoomLocked(uint64_t unit_id, Unit& unit, bool destroy_now) {
  if (!unit.doomed) {
    unit.doomed = true;
    // Its queued holes go with it: the whole unit is being reclaimed now.
    reclaiming_ += unit.bytes - unit.hole_bytes;
    unit.holes.clear();
    unit.hole_bytes = 0;
  }
  if (destroy_now && unit.readers == 0 && !unit.destroying) {
    unit.destroying = true;
    return true;
  }
  return false;
}

void DiskStoreImpl::UnpinLocked(uint64_t unit_id, Unit& unit, std::vector<uint64_t>* destroy) {
  unit.readers--;
  if (unit.readers == 0 && unit.doomed && !unit.destroying) {
    unit.destroying = true;
    destroy->push_back(unit_id);
  }
}

bool DiskStoreImpl::ReleaseEntryLocked(uint64_t unit_id, uint32_t slot) {
  auto it = units_.find(unit_id);
  if (it == units_.end()) return false;
  Unit& unit = it->second;
  if (unit.live > 0) unit.live--;
  EndCopyLocked(unit, slot);
  if (unit.live > 0 || unit.committing) return false;
  return DoomLocked(unit_id, unit, true);
}

void DiskStoreImpl::DropEntry(std::string_view key, uint64_t unit_id, std::vector<uint64_t>* destroy) {
  Shard& shard = ShardOf(key);
  std::lock_guard shard_lock(shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end() || it->second.placement.unit_id != unit_id) return;
  const uint32_t slot = it->second.placement.slot;
  shard.entries.erase(it);
  std::lock_guard units_lock(units_mu_);
  if (ReleaseEntryLocked(unit_id, slot)) destroy->push_back(unit_id);
}

bool DiskStoreImpl::LeaveLocked(Leaving& leaving) {
  const uint64_t id = leaving.placement.unit_id;
  auto it = units_.find(id);
  if (it == units_.end()) return false;
  Unit& unit = it->second;
  if (unit.live > 0) unit.live--;
  EndCopyLocked(unit, leaving.placement.slot);
  if (unit.live == 0 && !unit.committing && DoomLocked(id, unit, true)) {
    leaving.going = true;
  } else {
    unit.readers++;
  }
  return true;
}

Status DiskStoreImpl::ForgetCopies(const std::vector<Leaving>& leaving) {
  Status first = Status::Ok();
  std::vector<ForgottenCopy> staying;
  for (const Leaving& l : leaving) {
    if (!l.going) staying.push_back(ForgottenCopy{l.key, l.gen, l.placement});
  }
  if (!staying.empty()) first = layout_->Forget(staying);
  std::vector<uint64_t> unpinned;  // doomed units this unpin leaves unread
  {
    std::lock_guard lock(units_mu_);
    for (const Leaving& l : leaving) {
      if (l.going) continue;
      auto it = units_.find(l.placement.unit_id);
      if (it == units_.end()) continue;
      Unit& unit = it->second;
      // Forgotten for good: its space can go back while the unit stays.
      if (evict_copies_ && first.ok() && !unit.doomed) QueueHoleLocked(unit, l.key, l.gen, l.placement, true);
      UnpinLocked(it->first, unit, &unpinned);
    }
    units_cv_.notify_all();
  }
  for (const Leaving& l : leaving) {
    if (!l.going) continue;
    Status st = DestroyUnits({l.placement.unit_id});
    if (!st.ok()) {
      // Its files (some of them) stayed: the copy must be forgotten in them instead.
      ForgottenCopy copy{l.key, l.gen, l.placement};
      if (layout_->Forget(std::span(&copy, 1)).ok()) st = Status::Ok();
    }
    if (!st.ok() && first.ok()) first = st;
  }
  (void)DestroyUnits(unpinned);  // their copies are forgotten already: a failure only keeps space
  return first;
}

Status DiskStoreImpl::DestroyUnits(const std::vector<uint64_t>& unit_ids) {
  Status first = Status::Ok();
  for (uint64_t id : unit_ids) {
    std::shared_ptr<FileHandle> handle;
    {
      std::lock_guard lock(units_mu_);
      auto it = units_.find(id);
      if (it == units_.end()) continue;
      handle = std::move(it->second.handle);
      if (handle) --cached_handles_;
    }
    handle.reset();  // no read pins the unit: this was the last holder, the fd closes here
    if (Status st = layout_->Destroy(id); !st.ok()) {
      GLOG_WARN("disk tier: deleting unit {}: {}", id, st.ToString());
      if (first.ok()) first = std::move(st);
    }
    std::lock_guard lock(units_mu_);
    auto it = units_.find(id);
    if (it == units_.end()) continue;
    used_ -= it->second.bytes;
    if (it->second.doomed) reclaiming_ -= it->second.bytes;
    units_.erase(it);
    units_cv_.notify_all();
  }
  return first;
}

std::vector<ReadResult> DiskStoreImpl::Read(std::span<const ReadRequest> requests) {
  std::vector<ReadResult> results(requests.size());
  struct Pinned {
    size_t index;
    Entry entry;
    std::shared_ptr<FileHandle> handle;
  };
  std::vector<Pinned> candidates;
  for (size_t i = 0; i < requests.size(); ++i) {
    const ReadRequest& r = requests[i];
    if (Status st = KeyStatus(r.key); !st.ok()) {
      results[i].status = st;
      continue;
    }
    if (reinterpret_cast<uintptr_t>(r.buffer.data()) % kBlockSize != 0) {
      results[i].status = Status(ErrorCode::INVALID_PARAMS, "disk read buffer is not 4 KiB-aligned");
      continue;
    }
    if (r.location != 0) {
      if (Status st = layout_->CheckLocation(r.location); !st.ok()) {
        results[i].status = st;
        continue;
      }
    }
    Shard& shard = ShardOf(r.key);
    std::unique_lock shard_lock(shard.mu);
    auto it = shard.entries.find(r.key);
    if (it == shard.entries.end() || (r.location != 0 && it->second.placement.location != r.location)) {
      results[i].status = Status(ErrorCode::OBJECT_NOT_FOUND,
                                 "no disk copy of '" + Shown(r.key) + "'" +
                                     (it == shard.entries.end() ? "" : " at that location"));
      continue;
    }
    Entry entry = it->second;
    shard_lock.unlock();
    if (r.buffer.size() < AlignUp(entry.size)) {
      results[i].status = Status(ErrorCode::BUFFER_OVERFLOW,
                                 "disk read of '" + Shown(r.key) + "' needs a buffer of " +
                                     std::to_string(AlignUp(entry.size)) + " bytes, got " +
                                     std::to_string(r.buffer.size()));
      continue;
    }
    candidates.push_back(Pinned{i, entry, nullptr});
  }

  if (options_.test_hook_after_lookup && !candidates.empty()) options_.test_hook_after_lookup();
  std::vector<Pinned> pinned;
  {
    std::lock_guard lock(units_mu_);
    for (auto& c : candidates) {
      auto it = units_.find(c.entry.placement.unit_id);
      const uint32_t slot = c.entry.placement.slot;
      // Copy-grained: the copy itself may have been evicted since the lookup (its space may be
      // going back); a read pinning its slot holds that space until it is done.
      const bool copy_gone = evict_copies_ && it != units_.end() &&
                             (slot >= it->second.slots.size() || it->second.slots[slot].last_use == 0);
      if (it == units_.end() || it->second.doomed || copy_gone) {
        results[c.index].status = Status(ErrorCode::OBJECT_NOT_FOUND,
                                         "disk copy of '" + Shown(requests[c.index].key) + "' was evicted");
        continue;
      }
      it->second.readers++;
      it->second.last_read = ++read_tick_;
      if (evict_copies_) {
        it->second.slots[slot].readers++;
        it->second.slots[slot].last_use = it->second.last_read;
      }
      c.handle = it->second.handle;
      pinned.push_back(std::move(c));
    }
  }

  // Failed reads drop their entry: a torn or corrupt copy is never offered again.
  std::vector<std::pair<size_t, uint64_t>> drops;  // (request, unit)
  std::vector<uint64_t> vanished;                   // units whose file is gone
  for (auto& p : pinned) {
    if (p.handle) continue;
    auto opened = layout_->OpenUnit(p.entry.placement.unit_id);
    if (!opened.ok()) {
      results[p.index].status = opened.status();
      drops.emplace_back(p.index, p.entry.placement.unit_id);
      if (opened.code() == ErrorCode::OBJECT_NOT_FOUND) vanished.push_back(p.entry.placement.unit_id);
      continue;
    }
    p.handle = std::move(*opened);
    if (layout_->CacheHandles()) {
      std::shared_ptr<FileHandle> dropped;  // declared first: released after the lock
      std::lock_guard lock(units_mu_);
      auto it = units_.find(p.entry.placement.unit_id);
      if (it != units_.end() && !it->second.handle) {
        it->second.handle = p.handle;
        ++cached_handles_;
        handle_order_.push_back(it->first);
        while (cached_handles_ > kMaxCachedHandles && !handle_order_.empty()) {
          auto oldest = units_.find(handle_order_.front());
          handle_order_.pop_front();
          if (oldest == units_.end() || !oldest->second.handle || oldest == it) continue;
          dropped = std::move(oldest->second.handle);
          --cached_handles_;
          break;
        }
        if (handle_order_.size() > 2 * kMaxCachedHandles) {  // forget units gone meanwhile
          std::erase_if(handle_order_, [&](uint64_t id) {
            auto u = units_.find(id);
            return u == units_.end() || !u->second.handle;
          });
        }
      }
    }
  }
  if (options_.test_hook_after_pin) options_.test_hook_after_pin();

  std::vector<IoRequest> io;
  std::vector<size_t> io_owner;  // index into pinned
  for (size_t k = 0; k < pinned.size(); ++k) {
    const Pinned& p = pinned[k];
    if (!p.handle || p.entry.size == 0) continue;
    IoRequest req;
    req.fd = p.handle->fd;
    req.buffer = requests[p.index].buffer.data();
    req.length = AlignUp(p.entry.size);
    req.offset = p.entry.placement.value_offset;
    io.push_back(req);
    io_owner.push_back(k);
  }
  io_->Run(io);
  std::vector<int64_t> transferred(pinned.size(), 0);
  for (size_t q = 0; q < io.size(); ++q) transferred[io_owner[q]] = io[q].result;

  for (size_t k = 0; k < pinned.size(); ++k) {
    const Pinned& p = pinned[k];
    if (!p.handle) continue;
    const ReadRequest& r = requests[p.index];
    const int64_t want = static_cast<int64_t>(AlignUp(p.entry.size));
    Status st;
    if (transferred[k] < 0) {
      st = Status(ErrorCode::INVALID_READ, "disk read of '" + Shown(r.key) + "' failed: " +
                                               std::strerror(static_cast<int>(-transferred[k])));
    } else if (transferred[k] != want) {
      st = Status(ErrorCode::INVALID_READ, "torn disk copy of '" + Shown(r.key) + "': read " +
                                               std::to_string(transferred[k]) + " of " +
                                               std::to_string(want) + " bytes (file truncated?)");
    } else if (Checksum(std::span<const std::byte>(r.buffer.data(), p.entry.size)) != p.entry.checksum) {
      st = Status(ErrorCode::CHECKSUM_MISMATCH,
                  "corrupt disk copy of '" + Shown(r.key) + "': checksum mismatch, dropped");
    }
    if (!st.ok()) {
      results[p.index].status = st;
      drops.emplace_back(p.index, p.entry.placement.unit_id);
      continue;
    }
    results[p.index] = ReadResult{Status::Ok(), p.entry.size, p.entry.gen, p.entry.checksum};
  }

  // A unit whose file vanished takes all its objects with it (a bucket holds many), not only the
  // ones this batch asked for. Doomed while still pinned here: the unpin below destroys it.
  std::vector<std::pair<uint64_t, std::vector<std::string>>> vanished_keys;
  if (!vanished.empty()) {
    std::lock_guard lock(units_mu_);
    for (uint64_t id : vanished) {
      auto it = units_.find(id);
      if (it == units_.end() || it->second.doomed) continue;
      DoomLocked(id, it->second, /*destroy_now=*/false);
      vanished_keys.emplace_back(id, std::move(it->second.keys));
      it->second.keys.clear();
    }
  }
  for (const auto& [id, keys] : vanished_keys) {
    for (const auto& key : keys) {
      Shard& shard = ShardOf(key);
      std::lock_guard lock(shard.mu);
      auto it = shard.entries.find(key);
      if (it != shard.entries.end() && it->second.placement.unit_id == id) shard.entries.erase(it);
    }
  }

  std::vector<uint64_t> destroy;
  {
    std::lock_guard lock(units_mu_);
    for (auto& p : pinned) {
      p.handle.reset();
      auto it = units_.find(p.entry.placement.unit_id);
      if (it == units_.end()) continue;
      Unit& unit = it->second;
      if (evict_copies_ && p.entry.placement.slot < unit.slots.size()) {
        unit.slots[p.entry.placement.slot].readers--;
      }
      UnpinLocked(p.entry.placement.unit_id, unit, &destroy);
    }
    units_cv_.notify_all();
  }
  for (const auto& [index, unit_id] : drops) {
    GLOG_WARN("disk tier: {}", results[index].status.ToString());
    DropEntry(requests[index].key, unit_id, &destroy);
  }
  (void)DestroyUnits(destroy);
  return results;
}

Status DiskStoreImpl::Remove(std::string_view key, uint64_t location) {
  if (Status st = KeyStatus(key); !st.ok()) return st;
  if (location != 0) {
    if (Status st = layout_->CheckLocation(location); !st.ok()) return st;
  }
  std::vector<Leaving> leaving;
  {
    Shard& shard = ShardOf(key);
    std::lock_guard shard_lock(shard.mu);
    auto it = shard.entries.find(key);
    if (it == shard.entries.end() || (location != 0 && it->second.placement.location != location)) {
      return Status(ErrorCode::OBJECT_NOT_FOUND, "no disk copy of '" + Shown(key) + "' to remove");
    }
    Leaving copy{std::string(key), it->second.gen, it->second.placement};
    shard.entries.erase(it);
    std::lock_guard units_lock(units_mu_);
    if (LeaveLocked(copy)) leaving.push_back(std::move(copy));
  }
  if (Status st = ForgetCopies(leaving); !st.ok()) {
    return Status(st.code(), "disk copy of '" + Shown(key) +
                                 "' removed from the index, but it may come back at the next open: " + st.message());
  }
  return Status::Ok();
}

std::optional<StoredObject> DiskStoreImpl::Lookup(std::string_view key) const {
  Shard& shard = ShardOf(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.entries.find(key);
  if (it == shard.entries.end()) return std::nullopt;
  return ToStored(key, it->second);
}

std::vector<StoredObject> DiskStoreImpl::ListObjects() const {
  std::vector<StoredObject> out;
  for (auto& shard : shards_) {
    std::lock_guard lock(shard.mu);
    for (const auto& [key, entry] : shard.entries) out.push_back(ToStored(key, entry));
  }
  return out;
}

DiskUsage DiskStoreImpl::Usage() const {
  DiskUsage usage;
  usage.capacity = capacity_;
  for (auto& shard : shards_) {
    std::lock_guard lock(shard.mu);
    usage.objects += shard.entries.size();
  }
  std::lock_guard lock(units_mu_);
  usage.used = used_;
  usage.reclaiming = reclaiming_;
  usage.files = units_.size();
  return usage;
}

std::vector<StoredObject> DiskStoreImpl::SelectVictims(uint64_t bytes) {
  if (evict_copies_) return SelectCopyVictims(bytes);
  struct Victim {
    uint64_t unit_id;
    std::vector<std::string> keys;
  };
  std::vector<Victim> victims;
  {
    std::lock_guard lock(units_mu_);
    std::vector<std::map<uint64_t, Unit>::iterator> order;
    for (auto it = units_.begin(); it != units_.end(); ++it) {
      if (!it->second.doomed && !it->second.committing) order.push_back(it);  // ids ascending: fifo
    }
    if (options_.eviction != EvictionPolicy::kFifo) {
      // Least recently used (written or read) first; recovered units (0) first, by age. Not
      // "never read first": on the conversation trace that evicted every new bucket before it
      // could be read (prefix hit rate 0.18 against 0.31 for fifo, docs/disk.md).
      std::stable_sort(order.begin(), order.end(), [](auto a, auto b) {
        return a->second.last_read < b->second.last_read;
      });
    }
    uint64_t freed = 0;
    for (auto it : order) {
      if (freed >= bytes) break;
      freed += it->second.bytes;
      DoomLocked(it->first, it->second, /*destroy_now=*/false);
      victims.push_back(Victim{it->first, std::move(it->second.keys)});
      it->second.keys.clear();
    }
  }
  std::vector<StoredObject> evicted;
  for (auto& v : victims) {
    for (auto& key : v.keys) {
      Shard& shard = ShardOf(key);
      std::lock_guard lock(shard.mu);
      auto it = shard.entries.find(key);
      if (it == shard.entries.end() || it->second.placement.unit_id != v.unit_id) continue;
      evicted.push_back(ToStored(key, it->second));
      shard.entries.erase(it);
    }
  }
  return evicted;
}

Status DiskStoreImpl::ReclaimVictims(std::chrono::milliseconds max_wait) {
  const auto deadline = std::chrono::steady_clock::now() + max_wait;
  while (true) {
    Status holes = evict_copies_ ? ReleaseHoles() : Status::Ok();
    std::vector<uint64_t> destroy;
    size_t still_read = 0;
    bool holes_ready = false;  // a hole's reads ended since ReleaseHoles looked
    {
      std::unique_lock lock(units_mu_);
      for (auto& [id, unit] : units_) {
        if (!unit.doomed) {
          for (const Hole& h : unit.holes) {
            if (SlotReadLocked(unit, h.placement.slot)) {
              ++still_read;
            } else {
              holes_ready = true;
            }
          }
          continue;
        }
        if (unit.destroying) continue;
        if (unit.readers == 0) {
          unit.destroying = true;
          destroy.push_back(id);
        } else {
          ++still_read;
        }
      }
      // Checked under the lock the readers unpin under: no wakeup is missed.
      if (holes.ok() && destroy.empty() && !holes_ready && still_read > 0) {
        if (units_cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
          return Status(ErrorCode::OBJECT_HAS_LEASE,
                        std::to_string(still_read) + " evicted disk file(s) or copies still being read after " +
                            std::to_string(max_wait.count()) + " ms; call again later");
        }
        continue;
      }
    }
    (void)DestroyUnits(destroy);
    if (!holes.ok()) return holes;  // what could not be tombstoned stays queued for a later call
    if (still_read == 0 && !holes_ready) return Status::Ok();
  }
}

}  // namespace granary::disk
