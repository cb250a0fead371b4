// master/state/state_codec.h - field lists of the master's records, for binary_codec.h.
//
// Promise: each Fields() names every field that belongs to the state (or to an operation) in a
// fixed order, so encoding is canonical: equal records give equal bytes, which is what the
// snapshot digest compares. Adding a field means adding it here (and bumping kSnapshotFormat).
// Thread safety: pure functions over records the caller owns.
#pragma once

#include "master/codec/binary_codec.h"
#include "master/state/object_meta.h"
#include "master/state/operations.h"

namespace granary::master {

// 2: disk ids of disk replicas and demotions, the disk garbage, the known disks.
// 3: each version's and each PutStart's persistence (ReplicateConfig.persistence).
// 4: promotions (disk -> memory) under way.
// 5: reservations (one-round-trip puts) and their policy.
// 6: releases name their place.
// 7: segments' capability keys.
// 8: wanted replicas, copies, drains.
// 9: allocations have no handle (nor allocator node); the ghost keeps 32-bit fingerprints.
inline constexpr uint64_t kSnapshotFormat = 9;

// One byte on the wire; any value round-trips (PutStart is what refuses unknown ones).
template <typename IO> void Fields(IO& io, PutPersistence& p) {
  uint8_t raw = static_cast<uint8_t>(p);
  io(raw);
  p = static_cast<PutPersistence>(raw);
}

template <typename IO> void Fields(IO& io, Extent& e) {
  io(e.segment_id); io(e.offset); io(e.length);
  // No mount makes a segment past kMaxSegmentBytes, no put an object past kMaxObjectBytes: a
  // snapshot that does is malformed (a length near 2^64 would occupy 0 bytes once rounded up).
  if constexpr (IO::kDecoding) {
    if (e.offset > kMaxSegmentBytes || e.length > kMaxObjectBytes) io.Fail();
  }
}
template <typename IO> void Fields(IO& io, DiskReplica& d) {
  io(d.node_id); io(d.location); io(d.length); io(d.disk_id);
}
template <typename IO> void Fields(IO& io, Version& v) {
  io(v.size); io(v.checksum); io(v.gen); io(v.replicas); io(v.disk); io(v.offload_declined);
  io(v.persistence); io(v.want_replicas);
  // A state never holds an unknown value (PutStart refuses it), nor a size past kMaxObjectBytes
  // (no put makes one): a snapshot that does is malformed.
  if constexpr (IO::kDecoding) {
    if (static_cast<uint8_t>(v.persistence) > kMaxPutPersistence || v.size > kMaxObjectBytes) {
      io.Fail();
    }
  }
}
template <typename IO> void Fields(IO& io, Demotion& d) {
  io(d.node_id); io(d.version_gen); io(d.start_ms); io(d.held); io(d.hold_until_ms); io(d.disk_id);
}
template <typename IO> void Fields(IO& io, Promotion& p) {
  io(p.node_id); io(p.version_gen); io(p.extent); io(p.location); io(p.round); io(p.start_ms);
  io(p.copy);
}
template <typename IO> void Fields(IO& io, HeldReservation& r) {
  io(r.client_id); io(r.extent); io(r.expires_ms);
}
template <typename IO> void Fields(IO& io, PinConfig& p) {
  io(p.hard); io(p.soft); io(p.soft_ttl_ms);
}
template <typename IO> void Fields(IO& io, PendingWrite& p) {
  io(p.client_id); io(p.gen); io(p.version); io(p.pin); io(p.start_ms); io(p.writer_expired);
}
template <typename IO> void Fields(IO& io, ReadLock& l) {
  io(l.client_id); io(l.count); io(l.expiry_ms);
}
template <typename IO> void Fields(IO& io, ObjectMeta& m) {
  // The rare fields travel as they did when each was its own member: decoded into one record
  // that SetRare keeps only if any is there; encoded from the object's block, or from an empty
  // record that the encoder only reads.
  static ObjectRare no_rare;
  ObjectRare decoded;
  ObjectRare& rare = IO::kDecoding        ? decoded
                     : m.has_rare_block() ? const_cast<ObjectRare&>(m.Rare())
                                          : no_rare;
  io(m.committed);
  io(rare.pending);
  io(rare.demotion);
  io(rare.promotion);
  io(rare.readers);
  bool hard_pinned = m.hard_pinned;  // set below, on a decode only: an encode only reads
  io(hard_pinned);
  // The soft pin as two plain fields (0, 0 when absent), as before it moved out of line.
  int64_t soft_pin_until_ms = rare.soft_pin ? rare.soft_pin->until_ms : 0;
  int64_t soft_pin_ttl_ms = rare.soft_pin ? rare.soft_pin->ttl_ms : 0;
  io(soft_pin_until_ms); io(soft_pin_ttl_ms);
  if constexpr (IO::kDecoding) {
    if (soft_pin_until_ms != 0 || soft_pin_ttl_ms != 0) {
      decoded.soft_pin = SoftPin{soft_pin_until_ms, soft_pin_ttl_ms};
    }
    m.SetRare(std::move(decoded));
  }
  // The packed fields travel as the plain ones they were.
  int64_t last_access_ms = m.last_access_ms;
  uint8_t reads = m.reads;
  bool in_main = m.in_main;
  io(last_access_ms); io(m.queue_stamp); io(reads); io(in_main);
  if constexpr (IO::kDecoding) {
    if (!ObjectMeta::AccessFits(last_access_ms)) return io.Fail();
    m.last_access_ms = last_access_ms;
    m.hard_pinned = hard_pinned;
    m.reads = reads;
    m.in_main = in_main;
  }
}

// ---- operation bodies ----
template <typename IO> void Fields(IO& io, SegmentSpec& s) {
  io(s.name); io(s.size); io(s.endpoint); io(s.shm_name); io(s.host_id); io(s.token); io(s.fresh);
  io(s.capability_key); io(s.capabilities_required);
}
template <typename IO> void Fields(IO& io, PlacementConfig& c) {
  io(c.replica_num); io(c.with_soft_pin); io(c.with_hard_pin); io(c.preferred_segments);
  io(c.soft_pin_ttl_ms); io(c.persistence);
}
template <typename IO> void Fields(IO& io, MountRef& m) { io(m.name); io(m.token); }
template <typename IO> void Fields(IO& io, MountSegmentOp& o) { io(o.client_id); io(o.segment); }
template <typename IO> void Fields(IO& io, UnmountSegmentOp& o) { io(o.client_id); io(o.name); }
template <typename IO> void Fields(IO& io, PingOp& o) { io(o.client_id); io(o.mounts); }
template <typename IO> void Fields(IO& io, ExpireClientOp& o) { io(o.client_id); }
template <typename IO> void Fields(IO& io, PutStartOp& o) {
  io(o.client_id); io(o.keys); io(o.sizes); io(o.config); io(o.upsert);
}
template <typename IO> void Fields(IO& io, PutEndOp& o) {
  io(o.client_id); io(o.keys); io(o.checksums); io(o.put_gens);
}
template <typename IO> void Fields(IO& io, PutRevokeOp& o) {
  io(o.client_id); io(o.keys); io(o.put_gens); io(o.after_transfer_error);
}
template <typename IO> void Fields(IO& io, ReserveOp& o) {
  io(o.client_id); io(o.size); io(o.count); io(o.preferred_segments);
}
template <typename IO> void Fields(IO& io, PutCommitOp& o) {
  io(o.client_id); io(o.keys); io(o.reservations); io(o.sizes); io(o.checksums); io(o.config);
  io(o.upsert); io(o.segment_ids); io(o.offsets);
  // Last in its record and only when set (operations.h says why): absent, it is false.
  if constexpr (IO::kDecoding) {
    o.trim = false;
    if (!io.done()) io(o.trim);
  } else if (o.trim) {
    io(o.trim);
  }
}
template <typename IO> void Fields(IO& io, ReleaseReservationsOp& o) {
  io(o.client_id); io(o.reservations); io(o.segment_ids); io(o.offsets);
}
template <typename IO> void Fields(IO& io, GetReplicaListOp& o) {
  io(o.client_id); io(o.keys);
  // Last in its record and only when set (operations.h): absent, no lease was asked.
  if constexpr (IO::kDecoding) {
    o.cache_ms = 0;
    if (!io.done()) io(o.cache_ms);
  } else if (o.cache_ms != 0) {
    io(o.cache_ms);
  }
}
template <typename IO> void Fields(IO& io, FinishReadOp& o) { io(o.client_id); io(o.keys); }
template <typename IO> void Fields(IO& io, RemoveOp& o) { io(o.keys); io(o.force); }
template <typename IO> void Fields(IO& io, RemoveByRegexOp& o) { io(o.pattern); io(o.force); }
template <typename IO> void Fields(IO& io, RemoveAllOp& o) { io(o.force); }
template <typename IO> void Fields(IO& io, RemoveScopedOp& o) {
  io(o.prefix); io(o.every_namespace); io(o.pattern); io(o.force);
}
template <typename IO> void Fields(IO& io, EvictOp& o) {
  io(o.keys); io(o.allow_soft_pinned); io(o.requeue); io(o.whole_run);
}
template <typename IO> void Fields(IO& io, SweepOp&) {}
template <typename IO> void Fields(IO& io, DemoteStartOp& o) {
  io(o.node_id); io(o.keys); io(o.disk_id);
}
template <typename IO> void Fields(IO& io, DemoteEndOp& o) {
  io(o.node_id); io(o.keys); io(o.version_gens); io(o.locations); io(o.disk_id);
}
template <typename IO> void Fields(IO& io, DemoteAbortOp& o) {
  io(o.node_id); io(o.keys); io(o.version_gens);
}
template <typename IO> void Fields(IO& io, DiskEntry& e) {
  io(e.key); io(e.size); io(e.checksum); io(e.location);
}
template <typename IO> void Fields(IO& io, DiskRegisterOp& o) {
  io(o.node_id); io(o.entries); io(o.disk_id); io(o.complete);
}
template <typename IO> void Fields(IO& io, DiskDropOp& o) {
  io(o.node_id); io(o.keys); io(o.locations);
}
template <typename IO> void Fields(IO& io, DiskGarbageAckOp& o) {
  io(o.node_id); io(o.disk_id); io(o.ids);
}
template <typename IO> void Fields(IO& io, PromoteStartOp& o) {
  io(o.node_id); io(o.keys); io(o.disk_id); io(o.round);
}
template <typename IO> void Fields(IO& io, PromoteEndOp& o) {
  io(o.node_id); io(o.round); io(o.keys); io(o.version_gens); io(o.copied);
}
template <typename IO> void Fields(IO& io, SetReplicasOp& o) { io(o.keys); io(o.replica_num); }
template <typename IO> void Fields(IO& io, ReplicaCopyStartOp& o) {
  io(o.node_id); io(o.keys); io(o.round);
}
template <typename IO> void Fields(IO& io, ReplicaCopyEndOp& o) {
  io(o.node_id); io(o.round); io(o.keys); io(o.version_gens); io(o.copied);
}
template <typename IO> void Fields(IO& io, DrainOp& o) { io(o.name); io(o.drop); io(o.undrain); }
template <typename IO> void Fields(IO& io, DrainFinishOp& o) { io(o.name); }

// The operation record of the ordered history: sequence, time, which body, the body.
std::string EncodeOperation(const Operation& op);
// INVALID_PARAMS for bytes that are not exactly one well-formed operation.
Result<Operation> DecodeOperation(std::string_view bytes);

}  // namespace granary::master
