// disk/disk_store_copy_eviction.cc - DiskStoreImpl's copy-grained lru (disk_store_impl.h): the
// per-slot uses, the order of units by their least recent copy, the choice of victims, and the
// holes given back once their tombstones are written and no read of their copy is in flight.
// Called only when evict_copies_ (the helpers return at once otherwise).
#include <algorithm>
#include <unordered_map>

#include "common/logging.h"
#include "disk/disk_store_impl.h"

namespace granary::disk {

void DiskStoreImpl::NoteCopyLocked(Unit& unit, uint32_t slot, uint64_t size) {
  if (!evict_copies_) return;
  if (unit.slots.size() <= slot) unit.slots.resize(slot + 1);
  unit.slots[slot].last_use = 1;  // live, and older than any use since the open
  unit.slots[slot].blocks = static_cast<uint32_t>(AlignUp(size) / kBlockSize);
}

void DiskStoreImpl::EndCopyLocked(Unit& unit, uint32_t slot) {
  if (evict_copies_ && slot < unit.slots.size()) unit.slots[slot].last_use = 0;
}

std::optional<DiskStoreImpl::OldestCopies> DiskStoreImpl::OldestCopy(const Unit& unit) {
  std::optional<OldestCopies> oldest;
  for (uint32_t slot = 0; slot < unit.slots.size(); ++slot) {
    const uint64_t use = unit.slots[slot].last_use;
    if (use == 0) continue;
    if (!oldest) {
      oldest = OldestCopies{use, slot, 0};
    } else if (use < oldest->use) {
      oldest = OldestCopies{use, slot, oldest->use};
    } else if (oldest->next_use == 0 || use < oldest->next_use) {
      oldest->next_use = use;
    }
  }
  return oldest;
}

void DiskStoreImpl::OrderUnitLocked(uint64_t unit_id, const Unit& unit) {
  if (!evict_copies_ || unit.doomed || unit.committing) return;
  if (auto oldest = OldestCopy(unit)) copy_order_.emplace(oldest->use, unit_id);
}

bool DiskStoreImpl::SlotReadLocked(const Unit& unit, uint32_t slot) {
  return slot < unit.slots.size() && unit.slots[slot].readers > 0;
}

void DiskStoreImpl::QueueHoleLocked(Unit& unit, std::string key, uint64_t gen, const Placement& placement,
                                    bool forgotten) {
  if (placement.slot >= unit.slots.size()) return;
  const uint64_t length = uint64_t{unit.slots[placement.slot].blocks} * kBlockSize;
  if (length == 0) return;
  unit.hole_bytes += length;
  reclaiming_ += length;
  unit.holes.push_back(Hole{std::move(key), gen, placement, ValueRange{placement.value_offset, length}, forgotten});
}

std::vector<StoredObject> DiskStoreImpl::SelectCopyVictims(uint64_t bytes) {
  struct Victim {
    uint64_t unit_id;
    uint32_t slot;
    std::string key;
  };
  std::vector<Victim> victims;
  {
    std::lock_guard lock(units_mu_);
    uint64_t freed = 0;
    std::unordered_map<uint64_t, uint64_t> counted;  // per unit, its copies this call counted
    while (freed < bytes && !copy_order_.empty()) {
      const auto [bound, id] = *copy_order_.begin();
      copy_order_.erase(copy_order_.begin());
      auto it = units_.find(id);
      if (it == units_.end() || it->second.doomed || it->second.committing) continue;
      Unit& unit = it->second;
      const auto oldest = OldestCopy(unit);
      if (!oldest) continue;
      if (oldest->use > bound) {  // read since it was ordered: its place is further on
        copy_order_.emplace(oldest->use, id);
        continue;
      }
      const uint32_t slot = oldest->slot;
      unit.slots[slot].last_use = 0;  // out of the reads' reach from here on
      const std::string& key = slot < unit.keys.size() ? unit.keys[slot] : std::string();
      victims.push_back(Victim{id, slot, key});
      if (oldest->next_use != 0) {
        const uint64_t value = uint64_t{unit.slots[slot].blocks} * kBlockSize;
        freed += value;
        counted[id] += value;
        copy_order_.emplace(oldest->next_use, id);
      } else {  // its last copy: the unit goes whole, less what this call counted of it already
        const uint64_t held = unit.bytes > unit.hole_bytes ? unit.bytes - unit.hole_bytes : 0;
        freed += held > counted[id] ? held - counted[id] : 0;
      }
    }
  }
  std::vector<StoredObject> evicted;
  for (auto& v : victims) {
    Shard& shard = ShardOf(v.key);
    std::lock_guard shard_lock(shard.mu);
    auto it = shard.entries.find(v.key);
    // Removed or replaced meanwhile (their caller queues the hole), or dropped after a failed read.
    if (it == shard.entries.end() || it->second.placement.unit_id != v.unit_id ||
        it->second.placement.slot != v.slot) {
      continue;
    }
    const Entry entry = it->second;
    evicted.push_back(ToStored(v.key, entry));
    shard.entries.erase(it);
    std::lock_guard units_lock(units_mu_);
    auto u = units_.find(v.unit_id);
    if (u == units_.end()) continue;
    Unit& unit = u->second;
    if (unit.live > 0) unit.live--;
    if (unit.doomed) continue;
    if (unit.live == 0 && !unit.committing) {
      DoomLocked(v.unit_id, unit, /*destroy_now=*/false);  // phase one does no I/O
      continue;
    }
    QueueHoleLocked(unit, std::move(v.key), entry.gen, entry.placement, false);
  }
  return evicted;
}

Status DiskStoreImpl::ReleaseHoles() {
  // A claimed hole pins its unit as a read would, so the unit is not destroyed while its
  // tombstones are appended (Layout::Forget's contract) or its holes punched.
  struct Claimed {
    uint64_t unit_id;
    Hole hole;
  };
  std::vector<Claimed> claimed;  // grouped by unit
  std::vector<uint64_t> pinned;
  {
    std::lock_guard lock(units_mu_);
    for (auto& [id, unit] : units_) {
      if (unit.holes.empty() || unit.doomed) continue;
      std::vector<Hole> waiting;
      const size_t before = claimed.size();
      for (Hole& h : unit.holes) {
        if (SlotReadLocked(unit, h.placement.slot)) {
          waiting.push_back(std::move(h));
        } else {
          claimed.push_back(Claimed{id, std::move(h)});
        }
      }
      unit.holes = std::move(waiting);
      if (claimed.size() > before) {
        unit.readers++;
        pinned.push_back(id);
      }
    }
  }
  Status first = Status::Ok();
  // In chunks: the tombstones of one chunk fit the log's reserve (a full filesystem still takes
  // them), and each chunk's punches give space back before the next appends.
  for (size_t begin = 0; begin < claimed.size(); begin += kHolesPerAppend) {
    const size_t end = std::min(claimed.size(), begin + kHolesPerAppend);
    std::vector<ForgottenCopy> unforgotten;
    for (size_t i = begin; i < end; ++i) {
      const Hole& h = claimed[i].hole;
      if (!h.forgotten) unforgotten.push_back(ForgottenCopy{h.key, h.gen, h.placement});
    }
    const Status forgot = layout_->Forget(unforgotten);
    if (!forgot.ok() && first.ok()) first = forgot;
    for (size_t run = begin; run < end;) {
      const uint64_t id = claimed[run].unit_id;
      size_t run_end = run;
      std::vector<ValueRange> ranges;
      uint64_t released_bytes = 0;  // asked to be punched: no longer waiting either way
      while (run_end < end && claimed[run_end].unit_id == id) {
        const Hole& h = claimed[run_end].hole;
        if (h.forgotten || forgot.ok()) {
          ranges.push_back(h.range);
          released_bytes += h.range.length;
        }
        ++run_end;
      }
      const uint64_t given_back = layout_->ReleaseSpace(id, ranges);
      std::lock_guard lock(units_mu_);
      auto it = units_.find(id);
      if (it != units_.end()) {
        Unit& unit = it->second;
        const uint64_t freed = std::min(given_back, unit.bytes);
        unit.bytes -= freed;
        used_ -= freed;
        if (unit.doomed) {
          reclaiming_ -= freed;  // doomed meanwhile: all of unit.bytes was being reclaimed
        } else {
          unit.hole_bytes -= released_bytes;
          reclaiming_ -= released_bytes;
          // Not tombstoned (the append failed): queued again, still charged, for a later call.
          for (size_t i = run; i < run_end; ++i) {
            if (!claimed[i].hole.forgotten && !forgot.ok()) unit.holes.push_back(std::move(claimed[i].hole));
          }
        }
      }
      run = run_end;
    }
  }
  std::vector<uint64_t> destroy;
  {
    std::lock_guard lock(units_mu_);
    for (uint64_t id : pinned) {
      auto it = units_.find(id);
      if (it == units_.end()) continue;
      UnpinLocked(id, it->second, &destroy);
    }
    units_cv_.notify_all();
  }
  (void)DestroyUnits(destroy);
  if (!first.ok()) {
    GLOG_WARN("disk tier: evicted copies keep their space until their tombstones are written: {}", first.ToString());
  }
  return first;
}

}  // namespace granary::disk
