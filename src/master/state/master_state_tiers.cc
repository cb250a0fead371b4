// MasterState: demotion of memory replicas to a node's disk (the SSD tier's share of the core).
#include "master/state/master_state.h"

#include <algorithm>

#include "master/state/state_internal.h"

namespace granary::master {

using namespace internal;

// ---------------------------------------------------------------------------------------------
// Tiers: demotion of memory replicas to a node's disk

std::vector<DemoteStartKeyResult> MasterState::ApplyDemoteStart(const DemoteStartOp& op,
                                                                int64_t now) {
  std::vector<DemoteStartKeyResult> results(op.keys.size());
  Status batch_error = BatchLimit(op.keys.size());
  if (op.node_id.empty()) batch_error = Status(ErrorCode::INVALID_PARAMS, "node id is empty");
  if (op.disk_id == 0) batch_error = Status(ErrorCode::INVALID_PARAMS, "disk id is 0");
  // A copy whose end never reaches the master must not come back as an unknown key later: only a
  // disk whose unknown keys are already refused (it registered) may write new copies.
  if (batch_error.ok() && !DiskKnown(op.disk_id)) {
    batch_error = Status(ErrorCode::ILLEGAL_CLIENT, "the disk has not registered its inventory");
  }
  if (!batch_error.ok()) {
    for (auto& r : results) r.status = batch_error;
    return results;
  }
  for (const auto& [shard_index, indices] : GroupByShard(op.keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      DemoteStartKeyResult& out = results[i];
      auto it = shard.objects.find(op.keys[i]);
      if (it == shard.objects.end() || !it->second.committed) {
        out.status = NotFound(op.keys[i]);
        continue;
      }
      ObjectMeta& meta = it->second;
      if (meta.demotion()) {
        out.status = Status(ErrorCode::OBJECT_ALREADY_EXISTS, "object is being demoted");
        continue;
      }
      const Version& v = *meta.committed;
      if (std::any_of(v.disk.begin(), v.disk.end(),
                      [&](const DiskReplica& d) { return d.disk_id == op.disk_id; })) {
        out.status = Status(ErrorCode::OBJECT_ALREADY_EXISTS, "already on this node's disk");
        continue;
      }
      if (v.replicas.empty()) {
        out.status = Status(ErrorCode::INVALID_PARAMS, "no memory replica to copy from");
        continue;
      }
      meta.set_demotion(Demotion{op.node_id, v.gen, now, {}, 0, op.disk_id});
      shard.demoting_keys.insert(it->first);
      out = {Status::Ok(), v.gen, v.size, v.checksum, v.replicas.ToVector()};
    }
  }
  return results;
}

std::vector<Status> MasterState::ApplyDemoteEnd(const DemoteEndOp& op, int64_t now) {
  const size_t n = op.keys.size();
  if (Status bad = BatchShapeError(n, op.version_gens.size() == n && op.locations.size() == n,
                                   "keys, versions and locations differ in length");
      !bad.ok()) {
    return std::vector<Status>(n, bad);
  }
  std::vector<Status> results(n);
  for (const auto& [shard_index, indices] : GroupByShard(op.keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      const std::string& key = op.keys[i];
      auto it = OwnDemotion(shard, key, op.node_id, op.version_gens[i]);
      if (!it.ok()) {
        results[i] = it.status();
        // The node deletes a copy nobody attached; if that answer is lost, the garbage tells it
        // again (unless this very copy is attached: a repeated end).
        auto found = shard.objects.find(key);
        const bool attached =
            found != shard.objects.end() && found->second.committed &&
            std::any_of(found->second.committed->disk.begin(), found->second.committed->disk.end(),
                        [&](const DiskReplica& d) {
                          return d.disk_id == op.disk_id && d.location == op.locations[i];
                        });
        if (op.disk_id != 0 && !attached) AddGarbage(op.disk_id, key, op.locations[i]);
        continue;
      }
      ObjectMeta& meta = (*it)->second;
      const uint64_t disk_id = meta.demotion()->disk_id;
      if (meta.committed && meta.committed->gen == meta.demotion()->version_gen) {
        meta.committed->disk.push_back({op.node_id, op.locations[i], meta.committed->size, disk_id});
        disk_replica_count_++;
        // A location the disk reused: whatever garbage was there is gone.
        std::lock_guard disk_lock(disk_mu_);
        garbage_.ForgetPlace(disk_id, key, op.locations[i]);
      } else {
        results[i] = Status(ErrorCode::OBJECT_NOT_FOUND,
                            "the demoted version was replaced or removed: delete the disk copy");
        AddGarbage(disk_id, key, op.locations[i]);
      }
      ResolveDemotion(shard, *it, now);
    }
  }
  return results;
}

std::vector<Status> MasterState::ApplyDemoteAbort(const DemoteAbortOp& op, int64_t now) {
  const size_t n = op.keys.size();
  if (Status bad = BatchShapeError(n, op.version_gens.size() == n,
                                   "keys and versions differ in length");
      !bad.ok()) {
    return std::vector<Status>(n, bad);
  }
  std::vector<Status> results(n);
  for (const auto& [shard_index, indices] : GroupByShard(op.keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      auto it = OwnDemotion(shard, op.keys[i], op.node_id, op.version_gens[i]);
      if (it.ok()) {
        ResolveDemotion(shard, *it, now);
      } else {
        results[i] = it.status();
      }
    }
  }
  return results;
}

Result<MasterState::ObjectIter> MasterState::OwnDemotion(Shard& shard, const std::string& key,
                                                         const std::string& node_id,
                                                         uint64_t version_gen) {
  auto it = shard.objects.find(key);
  if (it == shard.objects.end() || !it->second.demotion()) {
    return Status(ErrorCode::INVALID_WRITE, "object is not being demoted");
  }
  if (it->second.demotion()->node_id != node_id ||
      it->second.demotion()->version_gen != version_gen) {
    return Status(ErrorCode::ILLEGAL_CLIENT, "not this node's demotion of this version");
  }
  return it;
}

std::vector<Status> MasterState::ApplyDiskRegister(const DiskRegisterOp& op, int64_t now) {
  std::vector<Status> results(op.entries.size());
  Status batch_error = BatchLimit(op.entries.size());
  if (op.disk_id == 0) batch_error = Status(ErrorCode::INVALID_PARAMS, "disk id is 0");
  if (batch_error.ok()) {
    std::lock_guard lock(clients_mu_);
    // Only a live node: its disk replicas must go when it expires.
    if (!client_last_seen_ms_.contains(op.node_id)) {
      batch_error = Status(ErrorCode::ILLEGAL_CLIENT, "node '" + op.node_id.substr(0, 128) +
                                                          "' is not a live client: ping first");
    }
  }
  if (!batch_error.ok()) {
    std::fill(results.begin(), results.end(), batch_error);
    return results;
  }
  if (!offload_index_on_) BuildOffloadIndex();  // a disk: the offload planner will ask
  // Read once: the batch that completes the inventory is still a first registration.
  const bool known_disk = DiskKnown(op.disk_id);
  std::vector<std::string> keys;
  keys.reserve(op.entries.size());
  for (const auto& e : op.entries) keys.push_back(e.key);
  for (const auto& [shard_index, indices] : GroupByShard(keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      const DiskEntry& entry = op.entries[i];
      if (Status s = ValidateKey(entry.key); !s.ok()) {
        results[i] = s;
        continue;
      }
      if (entry.size == 0 || entry.size > kMaxObjectBytes) {
        results[i] = Status(ErrorCode::INVALID_PARAMS, "disk copy of invalid size");
        continue;
      }
      bool garbage = false;
      {
        std::lock_guard disk_lock(disk_mu_);
        garbage = garbage_.Contains(op.disk_id, entry.key, entry.location);
      }
      if (garbage) {
        results[i] = Status(ErrorCode::OBJECT_NOT_FOUND, "this copy was removed or replaced");
        continue;
      }
      auto refuse = [&](Status why) {
        results[i] = std::move(why);
        AddGarbage(op.disk_id, entry.key, entry.location);
      };
      auto it = shard.objects.find(entry.key);
      if (it == shard.objects.end() || !it->second.committed) {
        if (it != shard.objects.end() && it->second.pending()) {  // new bytes are on their way
          refuse(Status(ErrorCode::OBJECT_ALREADY_EXISTS, "a put of this key is in flight"));
          continue;
        }
        if (known_disk) {
          refuse(Status(ErrorCode::OBJECT_NOT_FOUND,
                        "unknown key on a disk the master knows: removed or replaced since"));
          continue;
        }
        if (it == shard.objects.end()) it = shard.objects.try_emplace(entry.key).first;
        ObjectMeta& meta = it->second;
        meta.committed = Version{entry.size, entry.checksum, next_put_gen_++, {}, {}};
        meta.in_main = false;
        meta.reads = 0;
        meta.queue_stamp = QueueStamp(now, i);
        meta.last_access_ms = now;
        CountCommitted(it->first, *meta.committed);
      } else if (it->second.committed->size != entry.size ||
                 it->second.committed->checksum != entry.checksum) {
        refuse(Status(ErrorCode::OBJECT_ALREADY_EXISTS, "other bytes are committed under this key"));
        continue;
      }
      auto& disk = it->second.committed->disk;
      auto mine = std::find_if(disk.begin(), disk.end(),
                               [&](const DiskReplica& d) { return d.disk_id == op.disk_id; });
      if (mine != disk.end()) {
        // The node knows best where its copy is now, and which process holds it (a restart).
        mine->node_id = op.node_id;
        mine->location = entry.location;
        NoteCopyCandidate(shard, it);
        continue;
      }
      disk.push_back({op.node_id, entry.location, entry.size, op.disk_id});
      disk_replica_count_++;
      NoteCopyCandidate(shard, it);  // a draining node's disk copy does not count
    }
  }
  if (op.complete) {
    std::lock_guard lock(disk_mu_);
    known_disks_.insert(op.disk_id);
  }
  return results;
}

std::vector<Status> MasterState::ApplyDiskDrop(const DiskDropOp& op, int64_t now) {
  const size_t n = op.keys.size();
  if (Status bad = BatchShapeError(n, op.locations.size() == n, "keys and locations differ in length");
      !bad.ok()) {
    return std::vector<Status>(n, bad);
  }
  std::vector<Status> results(n);
  for (const auto& [shard_index, indices] : GroupByShard(op.keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      auto it = shard.objects.find(op.keys[i]);
      if (it == shard.objects.end() || !it->second.committed) {
        results[i] = NotFound(op.keys[i]);
        continue;
      }
      auto& disk = it->second.committed->disk;
      size_t dropped = erase_if(disk, [&](const DiskReplica& d) {
        return d.node_id == op.node_id && d.location == op.locations[i];
      });
      if (dropped == 0) {
        results[i] = Status(ErrorCode::OBJECT_NOT_FOUND, "no such disk copy of this node");
        continue;
      }
      disk_replica_count_ -= dropped;
      it->second.committed->offload_declined = true;
      if (disk.empty() && it->second.committed->replicas.empty()) {
        DropCommitted(shard, it, now);
      } else {
        NoteCopyCandidate(shard, it);  // its other disk copies: a draining node's?
      }
    }
  }
  return results;
}

std::vector<Status> MasterState::ApplyDiskGarbageAck(const DiskGarbageAckOp& op) {
  if (Status limit = BatchLimit(op.ids.size()); !limit.ok()) {
    return std::vector<Status>(op.ids.size(), limit);
  }
  std::vector<Status> results(op.ids.size());
  std::lock_guard lock(disk_mu_);
  for (size_t i = 0; i < op.ids.size(); ++i) {
    if (!garbage_.Ack(op.disk_id, op.ids[i])) {
      results[i] = Status(ErrorCode::OBJECT_NOT_FOUND, "no such garbage entry of this disk");
    }
  }
  return results;
}

void MasterState::AddGarbage(uint64_t disk_id, const std::string& key, uint64_t location) {
  std::lock_guard lock(disk_mu_);
  garbage_.Add(disk_id, key, location);
}

void MasterState::AddGarbage(std::string_view key, std::span<const DiskReplica> copies) {
  if (copies.empty()) return;
  std::lock_guard lock(disk_mu_);
  for (const auto& d : copies) garbage_.Add(d.disk_id, key, d.location);
}

std::vector<GarbageEntry> MasterState::DiskGarbageOf(uint64_t disk_id, size_t max_entries,
                                                     size_t max_key_bytes) const {
  std::lock_guard lock(disk_mu_);
  return garbage_.Oldest(disk_id, max_entries, max_key_bytes);
}

bool MasterState::DiskKnown(uint64_t disk_id) const {
  std::lock_guard lock(disk_mu_);
  return known_disks_.contains(disk_id);
}

bool MasterState::AnyDiskKnown() const {
  std::lock_guard lock(disk_mu_);
  return !known_disks_.empty();
}

size_t MasterState::disk_garbage_count() const {
  std::lock_guard lock(disk_mu_);
  return garbage_.size();
}

uint64_t MasterState::disk_garbage_dropped() const {
  std::lock_guard lock(disk_mu_);
  return garbage_.dropped();
}

// ---------------------------------------------------------------------------------------------
// Tiers: promotion of disk-only objects back to memory

std::vector<PromoteStartKeyResult> MasterState::ApplyPromoteStart(const PromoteStartOp& op,
                                                                  int64_t now) {
  std::vector<PromoteStartKeyResult> results(op.keys.size());
  Status batch_error = BatchLimit(op.keys.size());
  if (op.node_id.empty()) batch_error = Status(ErrorCode::INVALID_PARAMS, "node id is empty");
  if (op.round == 0) batch_error = Status(ErrorCode::INVALID_PARAMS, "round is 0");
  if (!batch_error.ok()) {
    for (auto& r : results) r.status = batch_error;
    return results;
  }
  // The node's earlier rounds are over (it runs one at a time): what it did not report, it no
  // longer writes. A round number not above them (a late or repeated request) ends nothing.
  EndEarlierRounds(op.node_id, op.round, /*copies=*/false);
  for (const auto& [shard_index, indices] : GroupByShard(op.keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      PromoteStartKeyResult& out = results[i];
      auto it = shard.objects.find(op.keys[i]);
      if (it == shard.objects.end() || !it->second.committed) {
        out.status = NotFound(op.keys[i]);
        continue;
      }
      ObjectMeta& meta = it->second;
      if (meta.promotion()) {
        out.status = Status(ErrorCode::OBJECT_ALREADY_EXISTS, "object is being promoted");
        continue;
      }
      const Version& v = *meta.committed;
      if (!v.replicas.empty()) {
        out.status = Status(ErrorCode::OBJECT_ALREADY_EXISTS, "object is in memory already");
        continue;
      }
      auto copy = std::find_if(v.disk.begin(), v.disk.end(), [&](const DiskReplica& d) {
        return d.node_id == op.node_id && d.disk_id == op.disk_id;
      });
      if (copy == v.disk.end()) {
        out.status = Status(ErrorCode::OBJECT_NOT_FOUND, "no copy on this node's disk");
        continue;
      }
      auto extent = AllocateForPromotion(op.node_id, v.size, now);
      if (!extent) {
        out.status = Status(ErrorCode::NO_AVAILABLE_HANDLE,
                            "no segment of the node takes it below the eviction watermark");
        continue;
      }
      meta.set_promotion(Promotion{op.node_id, v.gen, *extent, copy->location, op.round, now});
      shard.promoting_keys.insert(it->first);
      out = {Status::Ok(), v.gen, v.size, v.checksum, copy->location, *extent};
    }
  }
  return results;
}

std::optional<Extent> MasterState::AllocateForPromotion(const std::string& node_id,
                                                        uint64_t size, int64_t now) {
  const std::vector<uint64_t> own = segments_.SegmentsOf(node_id);
  if (own.empty()) return std::nullopt;
  const uint64_t need = OffsetAllocator::AllocationSize(size);
  std::vector<uint64_t> candidates;
  for (const auto& u : segments_.Usage()) {
    if (std::find(own.begin(), own.end(), u.identity->id) == own.end()) continue;
    const double after = static_cast<double>(u.stats.used_bytes + need);
    if (after <= policy_.eviction_high_watermark * static_cast<double>(u.stats.capacity)) {
      candidates.push_back(u.identity->id);
    }
  }
  if (candidates.empty()) return std::nullopt;
  return segments_.AllocateOn(candidates, size, {}, now);
}

std::vector<Status> MasterState::ApplyPromoteEnd(const PromoteEndOp& op) {
  return EndMemoryCopies(op.node_id, op.round, op.keys, op.version_gens, op.copied,
                         /*copies=*/false);
}

void MasterState::EndEarlierRounds(const std::string& node_id, uint64_t round, bool copies) {
  for (auto& shard_ptr : shards_) {
    Shard& shard = *shard_ptr;
    std::lock_guard lock(shard.mu);
    if (shard.promoting_keys.empty()) continue;
    std::vector<std::string> over;
    for (std::string_view key : shard.promoting_keys) {
      const Promotion& p = *shard.objects.find(key)->second.promotion();
      if (p.copy == copies && p.node_id == node_id && p.round < round) over.emplace_back(key);
    }
    std::sort(over.begin(), over.end());  // frees in key order: deterministic
    for (const auto& key : over) {
      auto it = shard.objects.find(key);
      if (copies) {
        ClearCopy(shard, it, /*free_extent=*/true);
      } else {
        ClearPromotion(shard, it, /*free_extent=*/true);
      }
      EraseIfEmpty(shard, it);
    }
  }
}

std::vector<Status> MasterState::EndMemoryCopies(const std::string& node_id, uint64_t round,
                                                 const std::vector<std::string>& keys,
                                                 const std::vector<uint64_t>& version_gens,
                                                 const std::vector<uint8_t>& copied,
                                                 bool copies) {
  const size_t n = keys.size();
  if (Status bad = BatchShapeError(n, version_gens.size() == n && copied.size() == n,
                                   "keys, versions and outcomes differ in length");
      !bad.ok()) {
    return std::vector<Status>(n, bad);
  }
  auto clear = [&](Shard& shard, ObjectIter it, bool free_extent) {
    if (copies) {
      ClearCopy(shard, it, free_extent);
    } else {
      ClearPromotion(shard, it, free_extent);
    }
  };
  std::vector<Status> results(n);
  for (const auto& [shard_index, indices] : GroupByShard(keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      auto it = shard.objects.find(keys[i]);
      if (it == shard.objects.end() || !it->second.promotion() ||
          it->second.promotion()->copy != copies) {
        results[i] = Status(ErrorCode::INVALID_WRITE, copies ? "object is not being copied"
                                                             : "object is not being promoted");
        continue;
      }
      ObjectMeta& meta = it->second;
      const Promotion& p = *meta.promotion();
      if (p.node_id != node_id || p.version_gen != version_gens[i] || p.round != round) {
        // Another round's allocation (this one's was freed by a later round): not ours to touch.
        results[i] = Status(ErrorCode::ILLEGAL_CLIENT, "not this node's copy of this round");
        continue;
      }
      const bool current = meta.committed && meta.committed->gen == p.version_gen &&
                           segments_.IsMounted(p.extent.segment_id);
      if (copied[i] != 0 && current) {
        meta.committed->replicas.push_back(p.extent);  // readable from now on, like a put's end
        if (copies) {
          copies_attached_++;
          copied_bytes_ += meta.committed->size;
        }
        clear(shard, it, /*free_extent=*/false);
        NoteOffloadCandidate(shard, it);
        continue;
      }
      if (copied[i] != 0) {
        results[i] = Status(ErrorCode::OBJECT_NOT_FOUND,
                            "the copied version was replaced or removed meanwhile");
      }
      clear(shard, it, /*free_extent=*/true);  // the node reports: its write is over
      if (copies) {
        replica_epoch_++;  // still short of replicas: the planner looks again
        NoteCopyCandidate(shard, it);
      }
      EraseIfEmpty(shard, it);
    }
  }
  return results;
}

void MasterState::ClearPromotion(Shard& shard, ObjectIter it, bool free_extent) {
  ObjectMeta& meta = it->second;
  if (!meta.promotion()) return;
  // Nobody was ever named this space: no read lock can cover it.
  if (free_extent) FreeExtents(std::span<const Extent>(&meta.promotion()->extent, 1));
  if (meta.promotion()->copy) copies_in_flight_--;
  shard.promoting_keys.erase(std::string_view(it->first));
  meta.reset_promotion();
}

size_t MasterState::PromotionsOf(const std::string& node_id) const {
  size_t count = 0;
  for (const auto& shard_ptr : shards_) {
    std::lock_guard lock(shard_ptr->mu);
    for (std::string_view key : shard_ptr->promoting_keys) {
      const Promotion& p = *shard_ptr->objects.find(key)->second.promotion();
      count += !p.copy && p.node_id == node_id;
    }
  }
  return count;
}

void MasterState::ResolveDemotion(Shard& shard, ObjectIter it, int64_t now) {
  ObjectMeta& meta = it->second;
  if (!meta.demotion()) return;
  // Readers of the replaced version may still be on the held memory too.
  FreeLater(meta.demotion()->held,
            std::max(meta.demotion()->hold_until_ms, meta.LatestLockExpiry()), now);
  shard.demoting_keys.erase(std::string_view(it->first));
  meta.reset_demotion();
  EraseIfEmpty(shard, it);
}

uint64_t MasterState::EvictMemory(Shard& shard, ObjectIter it, int64_t now) {
  ObjectMeta& meta = it->second;
  const uint64_t bytes = OccupiedBytes(meta.committed->replicas);
  if (meta.committed->disk.empty()) {
    DropCommitted(shard, it, now);
  } else {  // demoted: readers now find it on disk
    FreeExtents(meta.committed->replicas);  // evictable: no lock, no demotion on them
    meta.committed->replicas.clear();
    meta.committed->want_replicas = 0;  // the cache let them go: not a loss to re-replicate
    NoteCopyCandidate(shard, it);  // ...unless only draining nodes hold it on disk
  }
  return bytes;
}

}  // namespace granary::master
