// The simulator's SSD tier (trace_sim_disk.h): node/disk_tier.cc's offload round and the bucket
// store's eviction, with no bytes.
#include "tools/bench/trace_sim_disk.h"

#include <algorithm>

#include "disk/disk_store.h"
#include "node/disk_tier.h"

namespace granary::bench {

namespace {
constexpr uint32_t kSlotBits = 24;  // a location: unit id << 24 | slot (as the bucket layout's)
// What the bucket backend uses for a copy: the value 4 KiB-aligned, its metadata entry and key.
uint64_t StoredBytes(const std::string& key, uint64_t size) {
  return disk::DiskStore::ReadBufferSize(size) + 64 + key.size();
}
}  // namespace

SimDiskTier::SimDiskTier(master::MasterState* state, std::string node_id, SimDiskOptions options)
    : state_(state),
      node_id_(std::move(node_id)),
      options_(options),
      unit_max_bytes_(options.unit_max_bytes
                          ? options.unit_max_bytes
                          : disk::BucketBytes(options.capacity_bytes,
                                              disk::DiskStoreOptions{}.bucket_max_bytes,
                                              options.copy_eviction)),
      planner_(state, master::OffloadPolicy{options.persistence,
                                            master::OffloadPolicy{}.offload_watermark}),
      promotions_(options.promote_after) {}

Status SimDiskTier::Register() {
  std::vector<Status> done = state_->DiskRegister({node_id_, {}, kDiskId, true});
  for (const Status& s : done) {
    if (!s.ok()) return s;
  }
  return state_->DiskKnown(kDiskId) ? Status::Ok()
                                     : Status(ErrorCode::INTERNAL_ERROR, "disk not registered");
}

void SimDiskTier::OffloadInterval() {
  for (int round = 0; round < kRoundsPerInterval; ++round) {
    if (OffloadOnce() == 0) break;
  }
}

void SimDiskTier::NoteReads(const std::vector<std::string>& keys,
                            const std::vector<master::ReadKeyResult>& answers, size_t n) {
  for (size_t i = 0; i < n && i < answers.size(); ++i) {
    const master::ReadKeyResult& r = answers[i];
    if (!r.status.ok()) continue;
    promotions_.NoteRead(keys[i], r);
    // The client reads a memory replica when there is one; else the node reads its disk.
    if (!r.replicas.empty() || r.disk.empty()) continue;
    counters_.disk_reads++;
    const uint64_t location = r.disk.front().location;
    auto copy = index_.find(keys[i]);
    if (copy == index_.end() || copy->second != location) {
      counters_.lost++;
      continue;
    }
    Touch(location);
  }
}

size_t SimDiskTier::OffloadOnce() {
  counters_.rounds++;
  ++round_;
  open_unit_ = 0;
  round_first_unit_ = next_unit_;
  size_t done = DeleteGarbage();
  done += Promote();
  std::vector<std::string> plan =
      planner_.Plan(node_id_, options_.round_max_keys, options_.round_max_bytes);
  if (plan.empty()) return done;
  std::vector<master::DemoteStartKeyResult> started =
      state_->DemoteStart({node_id_, plan, kDiskId});
  uint64_t bytes = 0;
  for (const auto& r : started) {
    if (r.status.ok()) bytes += node::CopyFootprint(r.size);
  }
  MakeRoom(bytes);
  master::DemoteEndOp end{node_id_, {}, {}, {}, kDiskId};
  master::DemoteAbortOp abort{node_id_, {}, {}};
  for (size_t i = 0; i < plan.size(); ++i) {
    const master::DemoteStartKeyResult& r = started[i];
    if (!r.status.ok()) continue;  // changed since the plan: skipped
    // The estimate fell short (a unit's header): one more eviction sized from it, as the node's
    // retry does.
    const uint64_t stored = StoredBytes(plan[i], r.size);
    if (used_ + stored > options_.capacity_bytes) MakeRoom(2 * node::CopyFootprint(r.size));
    if (used_ + stored > options_.capacity_bytes) {
      abort.keys.push_back(plan[i]);
      abort.version_gens.push_back(r.version_gen);
      continue;
    }
    end.keys.push_back(plan[i]);
    end.version_gens.push_back(r.version_gen);
    end.locations.push_back(Write(plan[i], r.size));
  }
  if (!abort.keys.empty()) state_->DemoteAbort(abort);
  if (end.keys.empty()) return done;
  const std::vector<std::string> keys = end.keys;
  const std::vector<uint64_t> locations = end.locations;
  std::vector<Status> ended = state_->DemoteEnd(std::move(end));
  for (size_t i = 0; i < ended.size(); ++i) {
    if (ended[i].ok()) {
      counters_.offloaded++;
      done++;
    } else {
      Forget(keys[i], locations[i]);  // replaced or removed meanwhile: the node removes its copy
    }
  }
  return done;
}

size_t SimDiskTier::DeleteGarbage() {
  std::vector<master::GarbageEntry> garbage =
      state_->DiskGarbageOf(kDiskId, master::kMaxGarbagePerReply,
                            master::kMaxGarbageKeyBytesPerReply);
  if (garbage.empty()) return 0;
  master::DiskGarbageAckOp ack{node_id_, kDiskId, {}};
  for (const master::GarbageEntry& g : garbage) {
    if (g.location != 0) Forget(g.key, g.location);
    ack.ids.push_back(g.id);
  }
  state_->DiskGarbageAck(std::move(ack));
  return garbage.size();
}

size_t SimDiskTier::Promote() {
  if (!promotions_.enabled()) return 0;
  std::vector<std::string> due = promotions_.Take(node_id_, master::kMaxPromotionsPerRound);
  if (due.empty() && state_->PromotionsOf(node_id_) == 0) return 0;
  std::vector<master::PromoteStartKeyResult> started =
      state_->PromoteStart({node_id_, due, kDiskId, round_});
  master::PromoteEndOp end{node_id_, round_, {}, {}, {}};
  for (size_t i = 0; i < due.size(); ++i) {
    const master::PromoteStartKeyResult& r = started[i];
    if (!r.status.ok()) continue;
    auto copy = index_.find(due[i]);
    const bool readable = copy != index_.end() && copy->second == r.location;
    if (readable) Touch(r.location);
    end.keys.push_back(due[i]);
    end.version_gens.push_back(r.version_gen);
    end.copied.push_back(readable ? 1 : 0);
  }
  if (end.keys.empty()) return 0;
  std::vector<Status> ended = state_->PromoteEnd(end);
  size_t promoted = 0;
  for (size_t i = 0; i < ended.size(); ++i) promoted += ended[i].ok() && end.copied[i];
  counters_.promoted += promoted;
  return promoted;
}

// DiskTier::MakeRoom without copy_eviction: whole units by the policy until the estimate fits; the master stops
// naming their copies (DiskDrop) before the space is reused.
void SimDiskTier::MakeRoom(uint64_t bytes) {
  if (options_.copy_eviction) return MakeRoomByCopies(bytes);
  const uint64_t free_bytes = options_.capacity_bytes > used_ ? options_.capacity_bytes - used_ : 0;
  if (free_bytes >= bytes) return;
  uint64_t needed = bytes - free_bytes, freed = 0;
  master::DiskDropOp drop{node_id_, {}, {}};
  for (auto next = order_.begin(); freed < needed && next != order_.end();) {
    const uint64_t id = next->second;
    if (id >= round_first_unit_) {  // written this round, not yet reported: not evictable
      ++next;
      continue;
    }
    next = order_.erase(next);
    Unit& unit = units_[id];
    for (auto& [key, location] : unit.live) {
      auto copy = index_.find(key);
      if (copy != index_.end() && copy->second == location) index_.erase(copy);
      drop.keys.push_back(std::move(key));
      drop.locations.push_back(location);
    }
    counters_.disk_evicted += unit.live.size();
    freed += unit.bytes;
    used_ -= unit.bytes;
    units_.erase(id);
  }
  if (!drop.keys.empty()) state_->DiskDrop(std::move(drop));
}

uint64_t SimDiskTier::Write(const std::string& key, uint64_t size) {
  // A round's copies go into units of at most unit_max_keys, as one Write() fills buckets.
  if (auto old = index_.find(key); old != index_.end()) Forget(key, old->second);
  const uint64_t aligned = disk::DiskStore::ReadBufferSize(size);
  if (open_unit_ == 0 || units_[open_unit_].slots >= options_.unit_max_keys ||
      (units_[open_unit_].slots > 0 &&
       units_[open_unit_].data_bytes + aligned > unit_max_bytes_)) {
    open_unit_ = next_unit_++;
    units_[open_unit_].bytes = disk::kBlockSize;  // the unit's metadata header
    used_ += disk::kBlockSize;
    units_[open_unit_].stamp = ++use_tick_;
    order_.emplace(use_tick_, open_unit_);
  }
  Unit& unit = units_[open_unit_];
  const uint64_t location = (open_unit_ << kSlotBits) | unit.slots++;
  unit.data_bytes += aligned;
  if (options_.copy_eviction) {
    unit.aligned[location] = aligned;
    copy_use_[location] = unit.stamp;  // the store stamps a write's copies at its commit
    copy_order_.emplace(unit.stamp, location);
  }
  unit.live.emplace_back(key, location);
  const uint64_t used = StoredBytes(key, size);
  unit.bytes += used;
  used_ += used;
  index_[key] = location;
  return location;
}

void SimDiskTier::Forget(const std::string& key, uint64_t location) {
  auto copy = index_.find(key);
  if (copy == index_.end() || copy->second != location) return;
  index_.erase(copy);
  DropCopy(location);
}

void SimDiskTier::Touch(uint64_t location) {
  if (!options_.lru_eviction) return;
  if (options_.copy_eviction) {
    auto use = copy_use_.find(location);
    if (use == copy_use_.end()) return;
    copy_order_.erase({use->second, location});
    use->second = ++use_tick_;
    copy_order_.emplace(use->second, location);
    return;
  }
  auto unit = units_.find(location >> kSlotBits);
  if (unit == units_.end()) return;
  order_.erase({unit->second.stamp, unit->first});
  unit->second.stamp = ++use_tick_;
  order_.emplace(use_tick_, unit->first);
}

void SimDiskTier::DropCopy(uint64_t location) {
  if (auto use = copy_use_.find(location); use != copy_use_.end()) {
    copy_order_.erase({use->second, location});
    copy_use_.erase(use);
  }
  auto unit = units_.find(location >> kSlotBits);
  if (unit == units_.end()) return;
  Unit& u = unit->second;
  std::erase_if(u.live, [&](const auto& kl) { return kl.second == location; });
  if (u.live.empty()) {  // its last copy: the unit goes whole
    if (unit->first == open_unit_) open_unit_ = 0;
    order_.erase({u.stamp, unit->first});
    used_ -= u.bytes;
    units_.erase(unit);
    return;
  }
  auto aligned = u.aligned.find(location);
  if (aligned == u.aligned.end()) return;
  u.bytes -= aligned->second;  // the punched value; its metadata entry stays with the unit
  used_ -= aligned->second;
  u.aligned.erase(aligned);
}

// DiskStoreImpl::SelectCopyVictims: the least recently used copies until the estimate fits,
// never one of this round's units; DiskDrop before the space is reused.
void SimDiskTier::MakeRoomByCopies(uint64_t bytes) {
  master::DiskDropOp drop{node_id_, {}, {}};
  for (auto next = copy_order_.begin();
       options_.capacity_bytes - std::min(used_, options_.capacity_bytes) < bytes &&
       next != copy_order_.end();) {
    const uint64_t location = next->second;
    ++next;
    if ((location >> kSlotBits) >= round_first_unit_) continue;  // this round's: not evictable
    auto unit = units_.find(location >> kSlotBits);
    if (unit == units_.end()) continue;
    for (const auto& [key, at] : unit->second.live) {
      if (at != location) continue;
      drop.keys.push_back(key);
      drop.locations.push_back(location);
      if (auto copy = index_.find(key); copy != index_.end() && copy->second == location) {
        index_.erase(copy);
      }
      break;
    }
    counters_.disk_evicted++;
    DropCopy(location);  // erases `location` from copy_order_: `next` is already past it
  }
  if (!drop.keys.empty()) state_->DiskDrop(std::move(drop));
}

}  // namespace granary::bench
