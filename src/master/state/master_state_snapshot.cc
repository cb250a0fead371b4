// MasterState: canonical snapshots of the whole state, their loading, and the digest.
#include "master/state/master_state.h"

#include <xxhash.h>

#include <algorithm>

#include "master/state/state_codec.h"
#include "master/state/state_internal.h"

namespace granary::master {

using namespace internal;

// ---------------------------------------------------------------------------------------------
// Snapshots

// Everything in the policy decides effects, so a snapshot only loads under the same policy.
template <typename IO>
void Fields(IO& io, MasterPolicy& p) {
  io(p.lease_ttl_ms); io(p.mount_quarantine_ms); io(p.write_quarantine_ms);
  io(p.soft_pin_ttl_ms); io(p.client_ttl_ms); io(p.put_discard_timeout_ms);
  io(p.put_release_timeout_ms); io(p.eviction_high_watermark); io(p.eviction_ratio);
  io(p.allow_evict_soft_pinned);
  uint8_t policy = static_cast<uint8_t>(p.eviction_policy);
  io(policy);
  if constexpr (IO::kDecoding) {
    if (policy > kMaxEvictionPolicy) io.Fail();
  }
  p.eviction_policy = static_cast<EvictionPolicy>(policy);
  io(p.eviction_small_ratio); io(p.eviction_ghost_ratio); io(p.shard_count);
  io(p.disk_garbage_max_entries); io(p.disk_garbage_max_key_bytes);
  io(p.reservation_ttl_ms); io(p.reservation_max_bytes);
}

namespace {
constexpr uint64_t kSnapshotMagic = 0x50414E5352524E47;  // "GNRRSNAP"
}  // namespace

void MasterState::EncodeLocked(Encoder& out) const {
  uint64_t magic = kSnapshotMagic, format = kSnapshotFormat;
  out(magic);
  out(format);
  MasterPolicy policy = policy_;
  out(policy);
  uint64_t seq = last_seq_, gen = next_put_gen_, base = segment_id_base_;
  int64_t last_now = last_now_ms_;
  out(seq);
  out(last_now);
  out(gen);
  out(base);
  segments_.Encode(out);

  std::vector<std::pair<std::string_view, const ObjectMeta*>> objects;
  for (const auto& shard : shards_) {
    std::lock_guard lock(shard->mu);  // held only for TSan's sake: apply_mu_ excludes writers
    for (const auto& [key, meta] : shard->objects) objects.emplace_back(key, &meta);
  }
  std::sort(objects.begin(), objects.end());
  uint64_t count = objects.size();
  out(count);
  for (auto& [key, meta] : objects) {
    std::string k(key);
    out(k);
    out(const_cast<ObjectMeta&>(*meta));  // the Encoder only reads
  }
  {
    std::lock_guard lock(clients_mu_);
    std::vector<std::pair<std::string, int64_t>> clients(client_last_seen_ms_.begin(),
                                                         client_last_seen_ms_.end());
    std::sort(clients.begin(), clients.end());
    uint64_t n = clients.size();
    out(n);
    for (auto& [id, seen] : clients) {
      out(id);
      out(seen);
    }
  }
  {
    std::lock_guard lock(deferred_mu_);
    uint64_t n = deferred_.size();
    out(n);
    for (DeferredFree d : deferred_) {
      out(d.extent);
      out(d.release_at_ms);
    }
  }
  for (const auto& g : ghost_) {
    std::lock_guard lock(g.mu);
    uint64_t next = g.next, n = g.fifo.size();
    out(next);
    out(n);
    for (uint32_t fp : g.fifo) out(fp);  // entry next - n + i: numbers follow from places
    std::vector<std::pair<uint32_t, uint64_t>> live;
    live.reserve(g.live.size());
    g.live.ForEach([&](uint32_t fp, uint32_t low) { live.emplace_back(fp, g.EntryOf(low)); });
    std::sort(live.begin(), live.end());
    uint64_t m = live.size();
    out(m);
    for (auto& [fp, entry] : live) {
      out(fp);
      out(entry);
    }
  }
  {
    std::lock_guard lock(disk_mu_);
    garbage_.Encode(out);
    uint64_t n = known_disks_.size();
    out(n);
    for (uint64_t disk : known_disks_) out(disk);
  }
  uint64_t reservations = reservations_.size();
  out(reservations);
  for (const auto& [gen, held] : reservations_) {
    uint64_t g = gen;
    out(g);
    out(const_cast<HeldReservation&>(held));  // the Encoder only reads
  }
}

Result<MasterPolicy> MasterState::SnapshotPolicy(std::string_view bytes) {
  Decoder in(bytes);
  uint64_t magic = 0, format = 0;
  MasterPolicy policy;
  in(magic);
  in(format);
  in(policy);
  if (!in.ok() || magic != kSnapshotMagic || format != kSnapshotFormat) {
    return Status(ErrorCode::INVALID_PARAMS, "not a master snapshot of a known format");
  }
  return policy;
}

std::string MasterState::EncodeSnapshot(uint64_t* seq) const {
  std::lock_guard lock(apply_mu_);
  if (seq) *seq = last_seq_;
  Encoder out;
  EncodeLocked(out);
  return out.Take();
}

uint64_t MasterState::Digest() const { return StateFingerprint().digest; }

MasterState::Fingerprint MasterState::StateFingerprint() const {
  std::lock_guard lock(apply_mu_);
  Encoder out;
  EncodeLocked(out);
  return {last_seq_, XXH3_64bits(out.bytes().data(), out.bytes().size())};
}

void MasterState::ResetEmpty(uint64_t segment_id_base) {
  MasterState empty(policy_, clock_, segment_id_base);
  Status s = LoadSnapshot(empty.EncodeSnapshot());
  (void)s;  // our own policy and a well-formed snapshot: it loads
}

Status MasterState::LoadSnapshot(std::string_view bytes, bool adopt_policy) {
  auto bad = [](const std::string& why) {
    return Status(ErrorCode::INVALID_PARAMS, "snapshot rejected: " + why);
  };
  Decoder in(bytes);
  uint64_t magic = 0, format = 0;
  in(magic);
  in(format);
  if (!in.ok() || magic != kSnapshotMagic) return bad("not a master snapshot");
  if (format != kSnapshotFormat) return bad("format " + std::to_string(format) + " unknown");
  MasterPolicy policy;
  in(policy);
  Encoder theirs, ours;
  MasterPolicy mine = policy_;
  // s3fifo and prefix apply every operation alike (they differ in queue order, a hint for the
  // evictor): a history written under one loads under the other (which then orders what comes
  // next), so changing it, or its default, needs no fresh start. lru does not: its evictions
  // treat reads differently. A standby (adopt_policy) takes the leader's as it is.
  MasterPolicy compared = policy;
  if (!adopt_policy && UsesQueues(policy.eviction_policy) && UsesQueues(mine.eviction_policy)) {
    compared.eviction_policy = mine.eviction_policy;
  }
  theirs(compared);
  ours(mine);
  if (!in.ok()) return bad("malformed policy");
  if (theirs.bytes() != ours.bytes()) {
    if (!adopt_policy) {
      return bad("made under another policy (every timeout, eviction setting and the shard count "
                 "must match)");
    }
    if (policy.shard_count == 0) return bad("malformed policy");
  } else {
    policy = policy_;
  }
  uint64_t seq = 0, gen = 0, base = 0;
  int64_t last_now = 0;
  in(seq);
  in(last_now);
  in(gen);
  in(base);
  SegmentTable segments(base);
  if (!in.ok() || !segments.Decode(in)) return bad("malformed segment table");

  std::vector<std::unique_ptr<Shard>> shards;
  for (uint32_t i = 0; i < policy.shard_count; ++i) shards.push_back(std::make_unique<Shard>());
  uint64_t count = 0, committed = 0, pending = 0, disk = 0, explicit_persistence = 0, copies = 0;
  std::map<std::string, TenantUsage, std::less<>> tenants;
  in(count);
  for (uint64_t i = 0; i < count && in.ok(); ++i) {
    std::string key;
    ObjectMeta meta;
    in(key);
    in(meta);
    if (!in.ok() || !ValidateKey(key).ok() ||
        (!meta.committed && !meta.pending() && !meta.demotion() && !meta.promotion())) {
      return bad("malformed object record");
    }
    Shard& shard = *shards[XXH3_64bits(key.data(), key.size()) % shards.size()];
    auto [it, inserted] = shard.objects.try_emplace(key, std::move(meta));
    if (!inserted) return bad("duplicate key");
    committed += it->second.committed.has_value();
    if (const std::string_view tenant = TenantOfKey(it->first); !tenant.empty()) {
      TenantUsage& usage = tenants[std::string(tenant)];
      if (it->second.committed) {
        usage.bytes += static_cast<int64_t>(it->second.committed->size);
        usage.objects++;
      }
      if (it->second.pending()) {
        usage.bytes += static_cast<int64_t>(it->second.pending()->version.size);
      }
    }
    if (it->second.committed) {
      disk += it->second.committed->disk.size();
      explicit_persistence += it->second.committed->persistence != PutPersistence::kDefault;
    }
    if (it->second.pending()) {
      shard.pending_keys.insert(it->first);
      pending++;
    }
    if (it->second.demotion()) shard.demoting_keys.insert(it->first);
    for (const auto& lock : it->second.readers()) {
      if (lock.count == 0) {
        shard.cache_leased.insert(it->first);
        break;
      }
    }
    if (it->second.promotion()) {
      shard.promoting_keys.insert(it->first);
      copies += it->second.promotion()->copy;
    }
  }
  uint64_t n = 0;
  in(n);
  std::unordered_map<std::string, int64_t> clients;
  for (uint64_t i = 0; i < n && in.ok(); ++i) {
    std::string id;
    int64_t seen = 0;
    in(id);
    in(seen);
    clients[id] = seen;
  }
  in(n);
  std::vector<DeferredFree> deferred;
  for (uint64_t i = 0; i < n && in.ok(); ++i) {
    DeferredFree d;
    in(d.extent);
    in(d.release_at_ms);
    deferred.push_back(d);
  }
  std::array<std::tuple<uint64_t, std::deque<uint32_t>, GhostIndex>, kGhostStripes> ghost;
  for (auto& [next, fifo, live] : ghost) {
    in(next);
    in(n);
    // The FIFO's entries are numbered in order up to next - 1 (GhostStripe keeps no numbers).
    if (in.ok() && n > next) return bad("malformed ghost: more entries than were numbered");
    if (in.ok() && n > kMaxGhostPerStripe) return bad("malformed ghost: a FIFO past its limit");
    for (uint64_t i = 0; i < n && in.ok(); ++i) {
      uint32_t fp = 0;
      in(fp);
      if (in.ok() && fp == 0) return bad("malformed ghost: a fingerprint of 0");
      fifo.push_back(fp);
    }
    uint64_t m = 0;
    in(m);
    // Each live entry names the newest FIFO entry of its fingerprint, one per fingerprint.
    for (uint64_t i = 0; i < m && in.ok(); ++i) {
      uint32_t fp = 0;
      uint64_t entry = 0;
      in(fp);
      in(entry);
      if (!in.ok()) break;
      if (entry >= next) return bad("malformed ghost: an entry never numbered");
      if (entry < next - n) return bad("malformed ghost: a live entry that left the FIFO");
      if (fifo[entry - (next - n)] != fp) return bad("malformed ghost: another key's entry");
      if (live.Find(fp)) return bad("malformed ghost: a key listed twice");
      live.Set(fp, static_cast<uint32_t>(entry));
    }
    // A live entry's place in the FIFO from its 32 bits (a FIFO holds at most 2^31 entries).
    const auto first = static_cast<uint32_t>(next - n);
    for (uint64_t i = 0; i < fifo.size() && in.ok(); ++i) {
      const std::optional<uint32_t> listed = live.Find(fifo[i]);
      if (listed && static_cast<uint32_t>(*listed - first) < i) {
        return bad("malformed ghost: a live entry older than its key's newest");
      }
    }
  }
  DiskGarbage garbage(policy.disk_garbage_max_entries, policy.disk_garbage_max_key_bytes);
  if (!in.ok() || !garbage.Decode(in)) return bad("malformed disk garbage");
  std::set<uint64_t> known_disks;
  in(n);
  for (uint64_t i = 0; i < n && in.ok(); ++i) {
    uint64_t disk = 0;
    in(disk);
    known_disks.insert(disk);
  }
  std::map<uint64_t, HeldReservation> reservations;
  std::unordered_map<std::string, ClientReservations> reserved_by_client;
  std::unordered_map<uint64_t, uint64_t> reserved_by_segment;
  uint64_t reserved_bytes = 0;
  in(n);
  for (uint64_t i = 0; i < n && in.ok(); ++i) {
    uint64_t name = 0;
    HeldReservation held;
    in(name);
    in(held);
    // Names come from the put generation counter, so each is below the snapshot's next one.
    if (!in.ok() || held.client_id.empty() || name >= gen ||
        !reservations.emplace(name, held).second) {
      return bad("malformed reservation");
    }
    const uint64_t cost = ReservedCost(held.extent.length);
    reserved_by_client[held.client_id].bytes += cost;
    reserved_by_client[held.client_id].count++;
    reserved_by_segment[held.extent.segment_id] += cost;
    reserved_bytes += cost;
    if (const std::string_view tenant = TenantOfKey(held.client_id); !tenant.empty()) {
      tenants[std::string(tenant)].reserved += static_cast<int64_t>(cost);
    }
  }
  if (!in.ok() || !in.done()) return bad("malformed or trailing bytes");

  std::lock_guard lock(apply_mu_);
  // SegmentTable is not movable (mutexes, atomics): re-decode into ours from the same bytes.
  Encoder table;
  segments.Encode(table);
  Decoder again(table.bytes());
  if (!segments_.Decode(again)) return bad("segment table");
  segment_id_base_ = base;
  // The cache lease cap only caps the grants this master's service makes (GetReplicaListOp
  // carries each grant): not in the snapshot, it stays this master's own.
  const int64_t cache_lease_ms = policy_.cache_lease_ms;
  policy_ = policy;
  policy_.cache_lease_ms = cache_lease_ms;
  shards_ = std::move(shards);
  committed_count_ = committed;
  {
    std::lock_guard tenants_lock(tenants_mu_);
    tenant_usage_ = std::move(tenants);
  }
  explicit_persistence_count_ = explicit_persistence;
  pending_count_ = pending;
  copies_in_flight_ = copies;
  disk_replica_count_ = disk;
  {
    std::lock_guard clients_lock(clients_mu_);
    client_last_seen_ms_ = std::move(clients);
  }
  {
    std::lock_guard deferred_lock(deferred_mu_);
    deferred_ = std::move(deferred);
  }
  for (size_t i = 0; i < kGhostStripes; ++i) {
    std::lock_guard ghost_lock(ghost_[i].mu);
    ghost_[i].next = std::get<0>(ghost[i]);
    ghost_[i].fifo = std::move(std::get<1>(ghost[i]));
    ghost_[i].live = std::move(std::get<2>(ghost[i]));
  }
  {
    std::lock_guard disk_lock(disk_mu_);
    garbage_ = std::move(garbage);
    known_disks_ = std::move(known_disks);
  }
  reservation_count_ = reservations.size();
  reserved_bytes_ = reserved_bytes;
  reservations_ = std::move(reservations);
  reserved_by_client_ = std::move(reserved_by_client);
  reserved_by_segment_ = std::move(reserved_by_segment);
  last_seq_ = seq;
  last_now_ms_ = last_now;
  // Leases of objects erased before the snapshot are not in it: each may last until then.
  cache_leases_.AssumeAllUntil(SaturatingAdd(last_now, policy_.cache_lease_ms));
  next_put_gen_ = gen;
  offload_index_on_ = false;  // the new shards have none: list them if a disk is known
  if (!known_disks_.empty()) BuildOffloadIndex();
  copy_walk_pending_ = true;  // the new shards' copy index: the next walk lists what needs copies
  return Status::Ok();
}

void MasterState::AssumeEarlierCacheLeases() {
  if (policy_.cache_lease_ms > 0) {
    cache_leases_.AssumeAllUntil(SaturatingAdd(clock_->NowMs(), policy_.cache_lease_ms));
  }
}

}  // namespace granary::master
