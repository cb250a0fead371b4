// disk/disk_store_copy_eviction.cc - DiskStoreImpl's copy-grained lru (disk_store_impl.h): the
// per-slot uses, the order of units by their least recent copy, the choice of victims, and the
// holes given back once their tombstones are written and no read of their copy is in flight.
// Called only when evict_copies_ (the helpers return at once otherwise).
#include <algorithm>

#include "common/logging.h"
#include "disk/disk_store_impl.h"

namespace granary::disk {

void DiskStoreImpl::NoteCopyLocked(Unit& unit, uint32_t slot, uint64_t size, uint64_t use) {
  if (!evict_copies_) return;
  if (unit.slots.size() <= slot) unit.slots.resize(slot + 1);
  unit.slots[slot].last_use = use;
  unit.slots[slot].blocks = static_cast<uint32_t>(AlignUp(size) / kBlockSize);
}

void DiskStoreImpl::EndCopyLocked(Unit& unit, uint32_t slot) {
  if (evict_copies_ && slot < unit.slots.size()) unit.slots[slot].last_use = 0;
}

std::optional<std::pair<uint64_t, uint32_t>> DiskStoreImpl::OldestCopy(const Unit& unit) {
  std::optional<std::pair<uint64_t, uint32_t>> oldest;
  for (uint32_t slot = 0; slot < unit.slots.size(); ++slot) {
    const uint64_t use = unit.slots[slot].last_use;
    if (use != 0 && (!oldest || use < oldest->first)) oldest.emplace(use, slot);
  }
  return oldest;
}

void DiskStoreImpl::OrderUnitLocked(uint64_t unit_id, const Unit& unit) {
  if (!evict_copies_ || unit.doomed || unit.committing) return;
  if (auto oldest = OldestCopy(unit)) copy_order_.emplace(oldest->first, unit_id);
}

void DiskStoreImpl::QueueHoleLocked(Unit& unit, Hole hole) {
  if (hole.range.length == 0) return;
  unit.hole_bytes += hole.range.length;
  reclaiming_ += hole.range.length;
  unit.holes.push_back(std::move(hole));
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
    while (freed < bytes && !copy_order_.empty()) {
      const auto [bound, id] = *copy_order_.begin();
      copy_order_.erase(copy_order_.begin());
      auto it = units_.find(id);
      if (it == units_.end() || it->second.doomed || it->second.committing) continue;
      Unit& unit = it->second;
      const auto oldest = OldestCopy(unit);
      if (!oldest) continue;
      if (oldest->first > bound) {  // read since it was ordered: its place is further on
        copy_order_.emplace(oldest->first, id);
        continue;
      }
      const uint32_t slot = oldest->second;
      unit.slots[slot].last_use = 0;  // out of the reads' reach from here on
      const std::string& key = slot < unit.keys.size() ? unit.keys[slot] : std::string();
      victims.push_back(Victim{id, slot, key});
      if (auto next = OldestCopy(unit)) {
        freed += uint64_t{unit.slots[slot].blocks} * kBlockSize;
        copy_order_.emplace(next->first, id);
      } else {
        freed += unit.bytes - unit.hole_bytes;  // its last copy: the unit goes whole
      }
    }
  }
  std::vector<StoredObject> evicted;
  for (auto& v : victims) {
    Shard& shard = ShardOf(v.key);
    std::lock_guard shard_lock(shard.mu);
    auto it = shard.entries.find(v.key);
    // Removed or replaced meanwhile: whoever did it gives the space back.
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
    const uint64_t length = uint64_t{unit.slots[v.slot].blocks} * kBlockSize;
    QueueHoleLocked(unit, Hole{std::move(v.key), entry.gen, entry.placement,
                               ValueRange{entry.placement.value_offset, length}, false});
  }
  return evicted;
}

void DiskStoreImpl::ReleaseHoles(size_t* still_read) {
  struct Claimed {
    uint64_t unit_id;
    std::vector<Hole> holes;
  };
  std::vector<Claimed> claimed;
  {
    std::lock_guard lock(units_mu_);
    for (auto& [id, unit] : units_) {
      if (unit.holes.empty() || unit.doomed) continue;
      Claimed c{id, {}};
      std::vector<Hole> waiting;
      for (Hole& h : unit.holes) {
        const bool read = h.placement.slot < unit.slots.size() && unit.slots[h.placement.slot].readers > 0;
        (read ? waiting : c.holes).push_back(std::move(h));
      }
      *still_read += waiting.size();
      unit.holes = std::move(waiting);
      if (!c.holes.empty()) claimed.push_back(std::move(c));
    }
  }
  if (claimed.empty()) return;
  // Tombstones of the evicted copies first (one append): a hole over a copy recovery would still
  // list would make it a torn copy, not a gone one.
  std::vector<ForgottenCopy> unforgotten;
  for (const Claimed& c : claimed) {
    for (const Hole& h : c.holes) {
      if (!h.forgotten) unforgotten.push_back(ForgottenCopy{h.key, h.gen, h.placement});
    }
  }
  Status forgot = layout_->Forget(unforgotten);
  if (!forgot.ok()) GLOG_WARN("disk tier: evicted copies keep their space (they may come back at the next open): {}", forgot.ToString());
  for (const Claimed& c : claimed) {
    std::vector<ValueRange> ranges;
    uint64_t claimed_bytes = 0;
    for (const Hole& h : c.holes) {
      claimed_bytes += h.range.length;
      if (h.forgotten || forgot.ok()) ranges.push_back(h.range);
    }
    const uint64_t given_back = layout_->ReleaseSpace(c.unit_id, ranges);
    std::lock_guard lock(units_mu_);
    auto it = units_.find(c.unit_id);
    if (it == units_.end()) continue;  // destroyed meanwhile, and all its space with it
    Unit& unit = it->second;
    const uint64_t freed = std::min(given_back, unit.bytes);
    unit.bytes -= freed;
    used_ -= freed;
    if (unit.doomed) {
      reclaiming_ -= freed;  // doomed meanwhile: all of unit.bytes was being reclaimed
    } else {
      unit.hole_bytes -= claimed_bytes;
      reclaiming_ -= claimed_bytes;
    }
    units_cv_.notify_all();
  }
}

}  // namespace granary::disk
