// MasterState: reserved space, the one-round-trip put (operations.h: ReserveOp, PutCommitOp,
// ReleaseReservationsOp; docs/master.md, "Reserved space").
//
// Why it is safe: a reservation is allocated space owned by one client, so nobody else is handed
// it while the client may write it. It leaves the client only (a) by a commit, when the space
// becomes the object's replica; (b) by the client's release (its word that it no longer writes);
// (c) at the end of its lease, when it is quarantined before reuse: a client checks the lease
// before each copy, and the space waits until put_release_timeout_ms after the grant (at least
// write_quarantine_ms), as long as a two-call put's whose writer went silent; or (d)
// with its segment's memory (unmount): a remount carries a new token, which a writer checks
// before each copy, and a copy already under way, however long it pauses, only reaches the old
// mount's memory: the node fences its data server and gives the remount new memory
// (node/storage_node.h), so it mounts fresh. A remount that is not fresh is quarantined
// (mount_quarantine_ms), which bounds late readers but not a writer paused longer.
#include <algorithm>
#include <unordered_map>

#include "master/state/master_state.h"
#include "master/state/state_internal.h"

namespace granary::master {

using namespace internal;

ReserveResult MasterState::ApplyReserve(const ReserveOp& op, int64_t now) {
  auto refuse = [](const std::string& why) {
    return ReserveResult{Status(ErrorCode::INVALID_PARAMS, why), {}};
  };
  if (op.client_id.empty()) return refuse("client id is empty");
  if (op.size == 0 || op.size > kMaxObjectBytes) {
    return refuse("reservation size " + std::to_string(op.size) + " is outside 1.." +
                  std::to_string(kMaxObjectBytes));
  }
  if (op.count == 0 || op.count > kMaxBatchKeys) {
    return refuse("reservation count " + std::to_string(op.count) + " is outside 1.." +
                  std::to_string(kMaxBatchKeys));
  }
  // Segment usage as of now, updated as this op allocates: only where a reservation keeps its
  // segment at or below the high watermark (reserved space must not make eviction run).
  // And at most a quarter of a segment is reserved, so the two-call puts of other clients keep
  // evictable room.
  struct Candidate {
    uint64_t id = 0;
    uint64_t used = 0;
    uint64_t capacity = 0;
    uint64_t reserved = 0;
  };
  std::vector<Candidate> candidates;
  size_t preferred = 0;  // the leading candidates that are preferred segments
  {
    const SegmentTable::Placement order = segments_.PlacementOrder(op.preferred_segments);
    std::vector<SegmentUsage> usage = segments_.Usage();
    std::unordered_map<uint64_t, const SegmentUsage*> by_id;  // one pass: not segments^2
    by_id.reserve(usage.size());
    for (const auto& u : usage) by_id.emplace(u.identity->id, &u);
    for (size_t i = 0; i < order.ids.size(); ++i) {
      auto u = by_id.find(order.ids[i]);
      if (u == by_id.end()) continue;
      auto r = reserved_by_segment_.find(order.ids[i]);
      candidates.push_back({order.ids[i], u->second->stats.used_bytes, u->second->stats.capacity,
                            r == reserved_by_segment_.end() ? 0 : r->second});
      preferred += i < order.preferred;
    }
  }
  // Preferred segments are tried first, in order. The rest rotate per reservation, so that a
  // batch spreads over the cluster instead of filling one segment's share, and load-aware: of
  // the rotation's pick and one other (by the reservation's name, so replay picks the same),
  // the one with the larger free share goes first, as for a put (StartOne).
  const size_t rest = candidates.size() - preferred;
  // The candidate tried at position t for the k-th reservation (positions `preferred` and
  // `swapped` exchanged); computed per position, so a reservation that fits at once costs O(1).
  auto at = [&](size_t t, uint32_t k, size_t swapped) {
    if (t == preferred) t = swapped;
    else if (t == swapped) t = preferred;
    return t < preferred ? t : preferred + (k + (t - preferred)) % rest;
  };
  auto free_share = [&](size_t i) {
    const Candidate& c = candidates[i];
    return c.capacity == 0 ? 0.0
                           : static_cast<double>(c.capacity - std::min(c.used, c.capacity)) /
                                 static_cast<double>(c.capacity);
  };
  // Caps count what the allocator takes (1-byte reservations take 64 bytes each), and how many
  // a client holds (each costs the master memory).
  const uint64_t need = ReservedCost(op.size);
  ClientReservations held;
  if (auto it = reserved_by_client_.find(op.client_id); it != reserved_by_client_.end()) {
    held = it->second;
  }
  auto at_cap = [&] {
    return held.bytes + need > policy_.reservation_max_bytes ||
           held.count >= kMaxReservationsPerClient;
  };
  ReserveResult result;
  for (uint32_t k = 0; k < op.count; ++k) {
    if (at_cap()) break;
    std::optional<Extent> extent;
    size_t swapped = preferred;  // no swap
    if (rest >= 2) {
      const size_t other = preferred + SecondChoice(next_put_gen_, rest);
      if (free_share(at(other, k, preferred)) > free_share(at(preferred, k, preferred))) {
        swapped = other;
      }
    }
    for (size_t t = 0; t < candidates.size(); ++t) {
      Candidate& c = candidates[at(t, k, swapped)];
      if (static_cast<double>(c.used + need) >
              policy_.eviction_high_watermark * static_cast<double>(c.capacity) ||
          c.reserved + need > c.capacity / kMaxReservedShare) {
        continue;
      }
      extent = segments_.AllocateOn({c.id}, op.size, {}, now);
      if (extent) {
        c.used += need;
        c.reserved += need;
        break;
      }
      c.used = c.capacity;  // no block of this size left there: skip it from now on
    }
    if (!extent) break;
    const uint64_t gen = next_put_gen_++;
    const int64_t expires = SaturatingAdd(now, policy_.reservation_ttl_ms);
    reservations_.emplace(gen, HeldReservation{op.client_id, *extent, expires});
    reserved_by_segment_[extent->segment_id] += need;
    held.bytes += need;
    held.count++;
    reservation_count_++;
    reserved_bytes_ += need;
    CountTenant(op.client_id, 0, 0, static_cast<int64_t>(need));
    result.granted.push_back({gen, *extent, expires});
  }
  if (!result.granted.empty()) reserved_by_client_[op.client_id] = held;
  if (result.granted.empty()) {
    result.status = at_cap()
                        ? Status(ErrorCode::NO_AVAILABLE_HANDLE,
                                 "the client holds its cap of reserved bytes already")
                        : Status(ErrorCode::NO_AVAILABLE_HANDLE,
                                 "no segment has " + std::to_string(op.size) +
                                     " bytes free below the eviction watermark");
  }
  return result;
}

std::vector<Status> MasterState::ApplyPutCommit(const PutCommitOp& op, int64_t now) {
  const size_t n = op.keys.size();
  Status batch_error = BatchShapeError(
      n,
      op.reservations.size() == n && op.sizes.size() == n && op.checksums.size() == n &&
          op.segment_ids.size() == n && op.offsets.size() == n,
      "keys, reservations, sizes, checksums, segments and offsets differ in length");
  if (op.client_id.empty()) batch_error = Status(ErrorCode::INVALID_PARAMS, "client id is empty");
  if (op.config.replica_num > 1 || !op.config.preferred_segments.empty()) {
    batch_error = Status(ErrorCode::INVALID_PARAMS,
                         "a put into reserved space has one replica, placed already");
  }
  if (Status s = PersistenceError(op.config.persistence); !s.ok()) batch_error = s;
  if (!batch_error.ok()) return std::vector<Status>(n, batch_error);
  std::vector<Status> results(n);
  const uint64_t first_gen = next_put_gen_;  // as ApplyPutStart's
  for (const auto& [shard_index, indices] : GroupByShard(op.keys)) {
    Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      const std::string& key = op.keys[i];
      // The reservation first: a refusal for the key's own reason then means the reservation
      // is held, unused, and the client may use it again.
      auto found = HeldBy(op.client_id, op.reservations[i], op.segment_ids[i], op.offsets[i]);
      if (!found.ok()) {
        results[i] = found.status();
        continue;
      }
      const auto held = *found;
      if (held->second.expires_ms <= now) {
        results[i] = Status(ErrorCode::LEASE_EXPIRED, "the reservation's lease has ended");
        continue;
      }
      // With trim, a smaller object is trimmed into the reservation at commit (clients reserve
      // one size for objects within 1/8 of it; ReservationPool). Without, the earlier rule and
      // its words, which a client reads as "this master does not trim".
      const uint64_t reserved = held->second.extent.length;
      if (!op.trim && op.sizes[i] != reserved) {
        results[i] = Status(ErrorCode::INVALID_PARAMS, "object size " + std::to_string(op.sizes[i]) +
                                                           " is not the reservation's " +
                                                           std::to_string(reserved));
        continue;
      }
      if (op.sizes[i] == 0 || op.sizes[i] > reserved) {
        results[i] = Status(ErrorCode::INVALID_PARAMS, "object size " + std::to_string(op.sizes[i]) +
                                                           " does not fit the reservation's " +
                                                           std::to_string(reserved));
        continue;
      }
      if (Status s = ValidateKey(key); !s.ok()) {
        results[i] = s;
        continue;
      }
      auto it = shard.objects.find(key);
      if (Status s = MayWrite(shard, it, op.upsert, now, op.client_id, first_gen); !s.ok()) {
        results[i] = s;
        continue;
      }
      Extent extent = held->second.extent;
      // Its end is free from here on: the writer wrote op.sizes[i] bytes and is done.
      if (op.sizes[i] < extent.length && !segments_.Shrink(extent, op.sizes[i])) {
        results[i] = Status(ErrorCode::INVALID_PARAMS, "the reservation could not be trimmed");
        // MayWrite may have cleared a zombie's pending write: an entry left with nothing goes.
        if (it != shard.objects.end()) EraseIfEmpty(shard, it);
        continue;
      }
      if (it == shard.objects.end()) it = shard.objects.try_emplace(key).first;
      PendingWrite version;
      version.client_id = op.client_id;
      version.gen = held->first;
      version.version.size = op.sizes[i];
      version.version.replicas = {extent};
      version.version.persistence = op.config.persistence;
      version.version.want_replicas = 1;
      version.pin.hard = op.config.with_hard_pin;
      version.pin.soft = op.config.with_soft_pin;
      version.pin.soft_ttl_ms =
          op.config.soft_pin_ttl_ms > 0 ? op.config.soft_pin_ttl_ms : policy_.soft_pin_ttl_ms;
      version.start_ms = now;
      ForgetReservation(held);
      CommitVersion(shard, it, std::move(version), op.checksums[i], i, op.keys.size(), now);
    }
  }
  return results;
}

bool MasterState::CommitTrims(const PutCommitOp& op) const {
  std::lock_guard lock(apply_mu_);
  for (size_t i = 0; i < op.reservations.size() && i < op.sizes.size(); ++i) {
    auto held = reservations_.find(op.reservations[i]);
    if (held != reservations_.end() && op.sizes[i] < held->second.extent.length) return true;
  }
  return false;
}

std::vector<Status> MasterState::ApplyReleaseReservations(const ReleaseReservationsOp& op) {
  const size_t n = op.reservations.size();
  Status batch_error = BatchShapeError(
      n, op.segment_ids.size() == n && op.offsets.size() == n,
      "reservations, segments and offsets differ in length");
  if (!batch_error.ok()) return std::vector<Status>(n, batch_error);
  std::vector<Status> results(n);
  for (size_t i = 0; i < n; ++i) {
    // The place too, as for a commit: a release must never free space the client holds now
    // under the same name (defence in depth: names no longer restart with a new master).
    auto held = HeldBy(op.client_id, op.reservations[i], op.segment_ids[i], op.offsets[i]);
    if (!held.ok()) {
      results[i] = held.status();
    } else {
      segments_.Free((*held)->second.extent);
      ForgetReservation(*held);
    }
  }
  return results;
}

Result<std::map<uint64_t, HeldReservation>::iterator> MasterState::HeldBy(
    const std::string& client_id, uint64_t name, uint64_t segment_id, uint64_t offset) {
  auto held = reservations_.find(name);
  if (held == reservations_.end() || held->second.extent.segment_id != segment_id ||
      held->second.extent.offset != offset) {
    return Status(ErrorCode::INVALID_WRITE,
                  "reservation " + std::to_string(name) + " is not held at that place");
  }
  if (held->second.client_id != client_id) {
    return Status(ErrorCode::ILLEGAL_CLIENT, "the reservation is another client's");
  }
  return held;
}

size_t MasterState::DropReservationsOn(uint64_t segment_id) {
  size_t dropped = 0;
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    auto current = it++;
    if (current->second.extent.segment_id != segment_id) continue;
    ForgetReservation(current);  // the allocation went with the segment
    dropped++;
  }
  return dropped;
}

size_t MasterState::ExpireReservations(int64_t now) {
  size_t expired = 0;
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    auto current = it++;
    if (current->second.expires_ms > now) continue;
    // Its holder may be paused mid-copy: the space waits as long as a silent two-call put's
    // would (put_release_timeout from the grant), and at least write_quarantine from now.
    const int64_t granted_ms = current->second.expires_ms - policy_.reservation_ttl_ms;
    const int64_t free_at = std::max(SaturatingAdd(now, policy_.write_quarantine_ms),
                                     SaturatingAdd(granted_ms, policy_.put_release_timeout_ms));
    FreeLater(std::span<const Extent>(&current->second.extent, 1), free_at, now);
    ForgetReservation(current);
    expired++;
  }
  return expired;
}

void MasterState::ForgetReservation(std::map<uint64_t, HeldReservation>::iterator it) {
  const uint64_t size = ReservedCost(it->second.extent.length);
  auto by_client = reserved_by_client_.find(it->second.client_id);
  if (by_client != reserved_by_client_.end()) {
    ClientReservations& c = by_client->second;
    c.bytes -= std::min(c.bytes, size);
    c.count -= std::min<uint64_t>(c.count, 1);
    if (c.count == 0) reserved_by_client_.erase(by_client);
  }
  auto by_segment = reserved_by_segment_.find(it->second.extent.segment_id);
  if (by_segment != reserved_by_segment_.end()) {
    by_segment->second -= std::min(by_segment->second, size);
    if (by_segment->second == 0) reserved_by_segment_.erase(by_segment);
  }
  reservation_count_--;
  reserved_bytes_ -= size;
  CountTenant(it->second.client_id, 0, 0, -static_cast<int64_t>(size));
  reservations_.erase(it);
}

}  // namespace granary::master
