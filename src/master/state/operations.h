// master/state/operations.h - every change of the master's state, as a value.
//
// The master is a state machine: MasterState::Apply(Operation) is the only code that mutates it.
// Apply puts every operation in one total order (its sequence number) and stamps it with a time
// that means the same on every master (wall-clock milliseconds, never earlier than the previous
// operation's). An operation carries everything its effect depends on, so the same stream applied
// in the same order to a fresh state (or to a snapshot, from the operation after it) gives the
// same state, byte for byte: that stream is what a standby master replays (docs/master.md,
// "Ordered history"). Pure queries (exist, size, stat, list) are not operations.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "granary/status.h"
#include "master/state/object_meta.h"
#include "master/space/segment_table.h"

namespace granary::master {

struct PlacementConfig {
  uint32_t replica_num = 1;
  bool with_soft_pin = false;
  bool with_hard_pin = false;
  std::vector<std::string> preferred_segments;
  int64_t soft_pin_ttl_ms = 0;  // 0 takes the master's default
  // Recorded on the put's version. Kept as received: PutStart refuses a value beyond kNone (a
  // client's unknown enum) with INVALID_PARAMS, so the logged op replays to the same refusal.
  PutPersistence persistence = PutPersistence::kDefault;
};

struct MountSegmentOp {
  std::string client_id;
  SegmentSpec segment;  // spec.fresh: memory nobody was handed before; otherwise quarantined
};
struct UnmountSegmentOp {
  std::string client_id;  // empty: the master itself, e.g. expiring a dead node
  std::string name;
};
// A segment the pinging client believes it has mounted, under the mount's token.
struct MountRef {
  std::string name;
  uint64_t token = 0;
};
struct PingOp {
  std::string client_id;
  std::vector<MountRef> mounts;
};
struct ExpireClientOp {
  std::string client_id;
};
struct PutStartOp {
  std::string client_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> sizes;
  PlacementConfig config;
  bool upsert = false;
};
struct PutEndOp {
  std::string client_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> checksums;
  std::vector<uint64_t> put_gens;  // each key's PutStart generation
};
struct PutRevokeOp {
  std::string client_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> put_gens;
  // Bytes may still be in flight to the nodes: quarantine the space instead of freeing it.
  bool after_transfer_error = false;
};
// One-round-trip puts (docs/master.md, "Reserved space"). Reserve hands `client_id` up to `count`
// extents of exactly `size` bytes, each its own until it commits a key into it, releases it, or
// its lease (expires_ms) ends. Reserved space counts as used and is never listed or evicted; it is
// granted only where its segment stays at or below the eviction high watermark (a reservation
// never makes eviction run) and within the client's caps (MasterPolicy::reservation_max_bytes,
// 65,536 reservations), each counting the allocator's rounded-up size.
struct ReserveOp {
  std::string client_id;
  uint64_t size = 0;
  uint32_t count = 0;
  std::vector<std::string> preferred_segments;  // tried first, in order; then the rest
};
// Commits each keys[i], whose `sizes[i]` bytes the client already wrote into its reservation
// `reservations[i]` with checksum `checksums[i]`: the object is committed (readable) at once, in
// the reservation's extent, one replica. The reservation must be the client's, unexpired, and of
// that size; with `trim`, at least that size (not 0): a smaller object is written at the
// extent's start and the rest of the extent is freed at commit (the writer wrote only the
// object). A refused key leaves its reservation as it was (the client may reuse it).
// config.replica_num must be 0 or 1 and preferred_segments empty (the extent is placed already).
struct PutCommitOp {
  std::string client_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> reservations;
  std::vector<uint64_t> sizes;
  std::vector<uint64_t> checksums;
  PlacementConfig config;
  bool upsert = false;
  // Where the bytes were written: the reservation's extent must be there, else it is not held.
  // (Segment ids are never reused, even by a restarted master; reservation names are.)
  std::vector<uint64_t> segment_ids;
  std::vector<uint64_t> offsets;
  // Whether an object may be smaller than its reservation (trimmed at commit). The service sets
  // it when one is (MasterState::CommitTrims); without it the size must equal the reservation's,
  // as masters before the trim required. Its record carries it only when set, so an exact
  // commit's record is what those masters wrote, and a standby of such a build refuses a
  // trimming one (an op it cannot decode) instead of applying it another way.
  bool trim = false;
};
// The client will not write these reservations again: their space is free at once. Each is
// released only if it is held at segment_ids[i], offsets[i] (as in PutCommitOp).
struct ReleaseReservationsOp {
  std::string client_id;
  std::vector<uint64_t> reservations;
  std::vector<uint64_t> segment_ids;
  std::vector<uint64_t> offsets;
};
struct GetReplicaListOp {
  std::string client_id;
  std::vector<std::string> keys;
  // The cache lease granted on each key answered with memory replicas, in ms (the service caps
  // what the client asked by MasterPolicy::cache_lease_ms, so a replica replays the grant
  // whatever its own policy); 0: none. Its record carries it only when set, as PutCommitOp's trim.
  int64_t cache_ms = 0;
};
struct FinishReadOp {
  std::string client_id;
  std::vector<std::string> keys;
};
struct RemoveOp {
  std::vector<std::string> keys;
  bool force = false;
};
struct RemoveByRegexOp {
  std::string pattern;
  bool force = false;
};
struct RemoveAllOp {
  bool force = false;
};
// Removes the keys of one namespace (key_namespace.h: `prefix`, "" the default one) or of
// every namespace whose key, as its tenant wrote it, matches `pattern` (RE2, searched anywhere;
// "" matches every key). RemoveAllOp and RemoveByRegexOp reach every held key as it is held.
struct RemoveScopedOp {
  std::string prefix;
  bool every_namespace = false;
  std::string pattern;
  bool force = false;
};
// Chosen by the evictor; Apply re-checks each key, since its state may have moved since.
struct EvictOp {
  std::vector<std::string> keys;
  bool allow_soft_pinned = false;
  // s3fifo: objects the evictor passed over, applied before the victims, in order. One in the
  // probation queue that was read moves to the main queue; one in the main queue with reads left
  // goes to its tail with one read fewer. A key may appear more than once.
  std::vector<std::string> requeue;
  // The keys are one run of a segment chosen to free a contiguous block: a read since the choice
  // does not spare a key under s3fifo (the run was chosen by recency already, and half a run
  // frees no block).
  bool whole_run = false;
};
// Applies the timeouts: zombie puts, deferred frees, expired read locks, stalled demotions.
struct SweepOp {};
// The SSD tier's offload (memory -> disk) of committed objects by the node that will hold the
// disk copies. Start records a demotion of the committed version onto disk `disk_id` (which must
// have registered its inventory, DiskRegisterOp.complete); End attaches each key's disk replica
// at `locations[i]` if that version is still committed (else the copy becomes disk garbage and
// the node must delete it); Abort gives the demotion up. Only `node_id` may end or abort its
// demotions.
struct DemoteStartOp {
  std::string node_id;
  std::vector<std::string> keys;
  uint64_t disk_id = 0;
};
struct DemoteEndOp {
  std::string node_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> version_gens;  // from DemoteStart's results
  std::vector<uint64_t> locations;
  uint64_t disk_id = 0;  // names the disk of copies refused without a demotion to go by
};
struct DemoteAbortOp {
  std::string node_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> version_gens;
};

// Promotion (disk -> memory) of disk-only committed objects by the node holding their disk copy.
// Start first ends the node's earlier rounds: its promotions named by a round before `round` are
// over (the node's offload rounds are serial, so it no longer writes them) and any it did not
// report are freed. Then, for each key still disk-only with a copy on this node's disk `disk_id`
// and no promotion under way, it allocates the object's size in one of the node's own segments,
// only where that keeps the segment at or below the eviction high watermark (a promotion never
// makes eviction run), and records the promotion. End attaches each allocation as a memory
// replica if the node copied it (`copied[i]` != 0) and the version is still committed; else frees
// it. Only `node_id` may end its promotions, quoting the round and version that named them.
struct PromoteStartOp {
  std::string node_id;
  std::vector<std::string> keys;
  uint64_t disk_id = 0;
  uint64_t round = 0;  // the node's offload round, counting up from 1 per node process
};
struct PromoteEndOp {
  std::string node_id;
  uint64_t round = 0;
  std::vector<std::string> keys;
  std::vector<uint64_t> version_gens;
  std::vector<uint8_t> copied;  // 1: the bytes are in the allocation
};

// Replica counts (docs/operations.md). SetReplicas sets each committed key's wanted number of
// memory replicas (1..kMaxReplicas); above its count, copies are made later (ReplicaCopyStart);
// below, the surplus replicas go at once, freed once no read lock can cover them (replicas on
// draining segments go first, then those on the fullest segments).
struct SetReplicasOp {
  std::vector<std::string> keys;
  uint32_t replica_num = 0;
};
// Re-replication, by the node that will hold the new replica: like a promotion, but from any
// replica of the version (another node's memory, or any disk) into an allocation on one of this
// node's segments that are not draining, for keys with fewer memory replicas outside draining
// segments than they want (a disk-only key only while its every disk copy is on a draining node).
// The node must hold no replica of the key already. Start first ends the node's earlier copy
// rounds (what it did not report, it no longer writes), then allocates (at or below the eviction
// high watermark) and takes a read lock for `node_id` on the version, so its source memory is not
// reused before the copy ends or the lock's lease does. End attaches a copied allocation as a
// memory replica if the version is still committed; else frees it; and drops the read lock.
struct ReplicaCopyStartOp {
  std::string node_id;
  std::vector<std::string> keys;
  uint64_t round = 0;  // the node's copy round, counting up from 1 per node process
};
struct ReplicaCopyEndOp {
  std::string node_id;
  uint64_t round = 0;
  std::vector<std::string> keys;
  std::vector<uint64_t> version_gens;
  std::vector<uint8_t> copied;
};
// Draining a segment: no new allocation lands on it, its objects get their wanted replicas
// elsewhere (ReplicaCopyStart counts none of its replicas), then DrainFinishOp unmounts it and
// a remount of the name is refused until Undrain. `drop`: nothing is copied for its sake, it is
// unmounted at once (objects only it held are lost). Undrain of a segment not finished yet
// reverts it; of a finished one lets its name mount again.
struct DrainOp {
  std::string name;
  bool drop = false;
  bool undrain = false;
};
struct DrainFinishOp {
  std::string name;
};

// What a node's disk holds, as it tells the master: after the node restarts (its recovery scan)
// or when a restarted master asks it to remount. A key committed with the same size and checksum
// gets the disk replica (the disk's replica moves to this node process); a key the master does
// not know becomes a disk-only object, but only while the disk is unknown to this state (its
// first registration after a master start): once a disk has registered its whole inventory
// (`complete`, the last batch), any later copy of an unknown key can only be one the master let
// go (removed, replaced, or never attached). Refused: a copy in the disk garbage, an unknown key
// from a known disk, a key being written or holding other bytes; each refused copy becomes disk
// garbage (the node deletes it at once, and acknowledges it when told).
struct DiskEntry {
  std::string key;
  uint64_t size = 0;
  uint64_t checksum = 0;
  uint64_t location = 0;
};
struct DiskRegisterOp {
  std::string node_id;
  std::vector<DiskEntry> entries;
  uint64_t disk_id = 0;   // never 0
  bool complete = false;  // the last batch of the disk's inventory
};
// Disk copies the node evicted or lost: the master stops naming them to readers at once. An
// object left with no replica at all is gone.
struct DiskDropOp {
  std::string node_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> locations;
};
// Disk garbage (master/state/disk_garbage.h) the disk deleted, by entry id, so the master stops naming
// it. An id that is not that disk's entry is OBJECT_NOT_FOUND and changes nothing.
struct DiskGarbageAckOp {
  std::string node_id;
  uint64_t disk_id = 0;
  std::vector<uint64_t> ids;
};

struct Operation {
  int64_t now_ms = 0;  // wall-clock ms; Apply raises it to the previous operation's if earlier
  uint64_t seq = 0;    // position in the total order, set by Apply (1, 2, 3...)
  std::variant<MountSegmentOp, UnmountSegmentOp, PingOp, ExpireClientOp, PutStartOp, PutEndOp,
               PutRevokeOp, GetReplicaListOp, FinishReadOp, RemoveOp, RemoveByRegexOp, RemoveAllOp,
               EvictOp, SweepOp, DemoteStartOp, DemoteEndOp, DemoteAbortOp, DiskRegisterOp,
               DiskDropOp, DiskGarbageAckOp, PromoteStartOp, PromoteEndOp, ReserveOp,
               PutCommitOp, ReleaseReservationsOp, RemoveScopedOp, SetReplicasOp,
               ReplicaCopyStartOp, ReplicaCopyEndOp, DrainOp, DrainFinishOp>
      body;
};

// ---- results ----
struct MountResult {
  Status status;
  uint64_t segment_id = 0;
};
struct UnmountResult {
  Status status;
  uint64_t dropped_replicas = 0;
};
struct PingResult {
  bool need_remount = false;
};
struct ExpireClientResult {
  std::vector<std::string> unmounted;
};
struct PutStartKeyResult {
  Status status;
  std::vector<Extent> replicas;
  uint64_t put_gen = 0;  // names this put; PutEnd and PutRevoke quote it
};
struct ReadKeyResult {
  Status status;
  uint64_t size = 0;
  uint64_t checksum = 0;
  std::vector<Extent> replicas;
  std::vector<DiskReplica> disk;
  uint64_t version_gen = 0;  // names the version answered (the promotion tracker counts by it)
};
// One key of a DemoteStart: the version to copy (its size, checksum and memory replicas).
struct DemoteStartKeyResult {
  Status status;
  uint64_t version_gen = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  std::vector<Extent> replicas;
};
// One key of a PromoteStart: the version to copy back, its disk copy, and the allocation to copy
// it into.
struct PromoteStartKeyResult {
  Status status;
  uint64_t version_gen = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  uint64_t location = 0;
  Extent extent;
};
// One key of a ReplicaCopyStart: the version to copy, where from (its memory and disk replicas
// at the start: any holds the bytes), and the allocation to copy it into.
struct ReplicaCopyKeyResult {
  Status status;
  uint64_t version_gen = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  std::vector<Extent> sources;
  std::vector<DiskReplica> disk_sources;
  Extent extent;
};
struct DrainResult {
  Status status;
  uint64_t unmounted_replicas = 0;  // a drop, or a finish: replicas that went with the segment
};
// One reservation granted: its name (quoted by PutCommit and ReleaseReservations), its extent
// and the end of its lease.
struct Reservation {
  uint64_t gen = 0;
  Extent extent;
  int64_t expires_ms = 0;
};
struct ReserveResult {
  Status status;  // NO_AVAILABLE_HANDLE when nothing could be granted; fewer than asked is OK
  std::vector<Reservation> granted;
};
struct RemoveCountResult {
  Status status;
  uint64_t removed = 0;
  uint64_t skipped = 0;
};
struct EvictResult {
  uint64_t objects = 0;
  uint64_t bytes = 0;
};
struct SweepResult {
  uint64_t discarded_puts = 0;    // pending writes dropped at the release timeout
  uint64_t freed_extents = 0;     // deferred frees that came due
  uint64_t aborted_demotions = 0; // demotions older than the release timeout
  uint64_t expired_reservations = 0;  // reservations whose lease ended (quarantined, then freed)
};

// The put generations of a PutStart's results, in key order (0 for keys that failed).
inline std::vector<uint64_t> Gens(const std::vector<PutStartKeyResult>& started) {
  std::vector<uint64_t> gens;
  gens.reserve(started.size());
  for (const auto& r : started) gens.push_back(r.put_gen);
  return gens;
}

using OpResult = std::variant<MountResult, UnmountResult, PingResult, ExpireClientResult,
                              std::vector<PutStartKeyResult>, std::vector<Status>,
                              std::vector<ReadKeyResult>, RemoveCountResult, EvictResult,
                              SweepResult, std::vector<DemoteStartKeyResult>,
                              std::vector<PromoteStartKeyResult>, ReserveResult,
                              std::vector<ReplicaCopyKeyResult>, DrainResult>;

}  // namespace granary::master
