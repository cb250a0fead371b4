// MasterState: nodes and clients coming and going: segments mounted and unmounted (a dead
// node's replicas dropped with them), pings, and the expiry of silent clients (operations.h:
// MountSegmentOp, UnmountSegmentOp, PingOp, ExpireClientOp).
#include <algorithm>

#include "master/state/master_state.h"
#include "master/state/state_internal.h"

namespace granary::master {

using namespace internal;

MountResult MasterState::ApplyMount(const MountSegmentOp& op, int64_t now) {
  // A node restarted right after a crash: the new process could create the segment's shared
  // memory on the same host, which a live owner's exclusive lock on it would have prevented, so
  // the old owner is gone and its replicas with it. Take over instead of waiting for its TTL.
  auto existing = segments_.FindByName(op.segment.name);
  if (existing && existing->client_id != op.client_id && !op.segment.host_id.empty() &&
      existing->host_id == op.segment.host_id && existing->shm_name == op.segment.shm_name &&
      existing->token != op.segment.token) {
    ApplyUnmount(UnmountSegmentOp{"", op.segment.name}, now);
  }
  // The same node remounts under a new token (the master lost or replaced its mount, or told it
  // to remount): replicas quoting the old token are refused by the node now, so they go; the
  // memory they held is quarantined by the new mount unless it is fresh.
  if (existing && existing->client_id == op.client_id && existing->token != op.segment.token) {
    ApplyUnmount(UnmountSegmentOp{"", op.segment.name}, now);
  }
  auto id = segments_.Mount(op.client_id, op.segment, now, policy_.mount_quarantine_ms);
  if (!id.ok()) return {id.status(), 0};
  replica_epoch_++;
  std::lock_guard lock(clients_mu_);
  client_last_seen_ms_[op.client_id] = now;
  return {Status::Ok(), *id};
}

UnmountResult MasterState::ApplyUnmount(const UnmountSegmentOp& op, int64_t now) {
  auto id = segments_.Unmount(op.client_id, op.name);
  if (!id.ok()) return {id.status(), 0};
  replica_epoch_++;
  return {Status::Ok(), DropSegmentReplicas(*id)};
}

uint64_t MasterState::DropSegmentReplicas(uint64_t segment_id) {
  uint64_t dropped = 0;
  auto on_segment = [segment_id](const Extent& e) { return e.segment_id == segment_id; };
  for (auto& shard_ptr : shards_) {
    Shard& shard = *shard_ptr;
    std::lock_guard lock(shard.mu);
    std::erase_if(shard.offload, [&](const auto& entry) { return entry.first.first == segment_id; });
    for (auto it = shard.objects.begin(); it != shard.objects.end();) {
      ObjectMeta& meta = it->second;
      auto current = it++;
      if (meta.committed) {
        dropped += erase_if(meta.committed->replicas, on_segment);
        // With no copy left in memory or on disk the object is gone.
        if (meta.committed->replicas.empty() && meta.committed->disk.empty()) {
          UncountCommitted(current->first, *meta.committed);
          meta.committed.reset();
        } else {
          NoteCopyCandidate(shard, current);
        }
      }
      if (meta.demotion()) std::erase_if(meta.demotion_mut().held, on_segment);
      // The allocation went with the segment. The node checks its segment's token just before
      // each copy, and a remount gives the segment new memory: a copy under way lands in the
      // old mount's memory, never in space a later mount hands out (node/disk_tier.h).
      if (meta.promotion() && on_segment(meta.promotion()->extent)) {
        ClearPromotion(shard, current, /*free_extent=*/false);
      }
      if (meta.pending()) {
        dropped += erase_if(meta.pending_mut().version.replicas, on_segment);
        if (meta.pending()->version.replicas.empty()) ClearPending(shard, current);
      }
      EraseIfEmpty(shard, current);
    }
  }
  DropReservationsOn(segment_id);
  std::lock_guard lock(deferred_mu_);
  std::erase_if(deferred_, [&](const DeferredFree& d) { return on_segment(d.extent); });
  return dropped;
}

PingResult MasterState::ApplyPing(const PingOp& op, int64_t now) {
  if (op.client_id.empty()) return {};
  bool need_remount = false;
  {
    std::lock_guard lock(clients_mu_);
    auto [it, inserted] = client_last_seen_ms_.try_emplace(op.client_id, now);
    it->second = now;
    need_remount = inserted;
  }
  // A mount the caller believes it holds but the master does not (expired and taken by another,
  // remounted under a newer token, or lost with a master restart) must be mounted again.
  for (const auto& mount : op.mounts) {
    auto held = segments_.FindByName(mount.name);
    if (!held || held->client_id != op.client_id || held->token != mount.token) {
      need_remount = true;
    }
  }
  return {need_remount};
}

ExpireClientResult MasterState::ApplyExpireClient(const ExpireClientOp& op, int64_t now) {
  {
    std::lock_guard lock(clients_mu_);
    auto it = client_last_seen_ms_.find(op.client_id);
    // A ping that raced the decision to expire wins.
    if (it == client_last_seen_ms_.end() || it->second + policy_.client_ttl_ms > now) return {};
    client_last_seen_ms_.erase(it);
  }
  // Its unfinished puts can never end: a new put of those keys takes them over at once. Its
  // demotions are given up, and its disk replicas are out of reach until it registers them again.
  // They are not disk garbage: a node back on the same disk re-attaches the copies of versions
  // still committed, and the copies of anything else are refused then (its disk is known).
  for (auto& shard_ptr : shards_) {
    Shard& shard = *shard_ptr;
    std::lock_guard lock(shard.mu);
    for (std::string_view key : shard.pending_keys) {
      ObjectMeta& meta = shard.objects.find(key)->second;
      if (meta.pending()->client_id == op.client_id) meta.pending_mut().writer_expired = true;
    }
    std::vector<std::string> demoting;
    for (std::string_view key : shard.demoting_keys) {
      if (shard.objects.find(key)->second.demotion()->node_id == op.client_id) {
        demoting.emplace_back(key);
      }
    }
    std::sort(demoting.begin(), demoting.end());  // frees in key order: deterministic
    for (const auto& key : demoting) ResolveDemotion(shard, shard.objects.find(key), now);
    for (auto it = shard.objects.begin(); disk_replica_count_ > 0 && it != shard.objects.end();) {
      auto current = it++;
      ObjectMeta& meta = current->second;
      if (!meta.committed) continue;
      disk_replica_count_ -= erase_if(
          meta.committed->disk, [&](const DiskReplica& d) { return d.node_id == op.client_id; });
      if (meta.committed->replicas.empty() && meta.committed->disk.empty()) {
        UncountCommitted(current->first, *meta.committed);
        meta.committed.reset();  // nothing holds it any more (its memory was freed before)
        DropReadLocks(current->first, meta);
        EraseIfEmpty(shard, current);
      } else {
        NoteCopyCandidate(shard, current);  // the rest on draining nodes only?
      }
    }
  }
  ExpireClientResult result;
  for (const auto& name : segments_.NamesOf(op.client_id)) {
    if (ApplyUnmount(UnmountSegmentOp{"", name}, now).status.ok()) result.unmounted.push_back(name);
  }
  return result;
}

std::vector<std::string> MasterState::SilentClients(int64_t now_ms) const {
  std::lock_guard lock(clients_mu_);
  std::vector<std::string> silent;
  for (const auto& [id, seen] : client_last_seen_ms_) {
    if (seen + policy_.client_ttl_ms <= now_ms) silent.push_back(id);
  }
  return silent;
}

size_t MasterState::client_count() const {
  std::lock_guard lock(clients_mu_);
  return client_last_seen_ms_.size();
}

}  // namespace granary::master
