// master/state/master_state.h - the master's metadata: segments, objects, clients, and the one function
// that changes them.
//
// Promise: Apply(op) is the only mutation. Operations are applied one at a time in one total
// order: Apply numbers each (seq 1, 2, 3...), stamps a wall-clock time no earlier than the
// previous operation's, and its effect is a function of the state and the operation alone (no
// hash-map iteration order, no clock read, no randomness), so replaying the stream, or loading a
// snapshot and replaying what followed it, gives a state with the same Digest().
// Queries run concurrently with Apply: objects live in shards (each with its own mutex), segments
// in a SegmentTable; queries take those locks and never change anything (an existence check is
// not a read: it takes no lock and does not refresh recency).
// Lock order: apply -> shard -> segment table -> segment; clients_mu_, deferred_mu_, disk_mu_ and
// the ghost stripes' mutexes are leaves. Observers run under the apply lock, in sequence order.
// Concurrent Apply calls are combined (ApplyCombiner): the caller holding the apply lock applies
// the others' queued operations too, in arrival order, each with its own seq, so an operation
// and its observers may run on another caller's thread.
// Ownership: MasterState owns everything below it; results are copies.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "granary/status.h"
#include "master/state/apply_combiner.h"
#include "master/state/cache_lease_ledger.h"
#include "master/state/disk_garbage.h"
#include "master/state/key_namespace.h"
#include "master/state/ghost_index.h"
#include "master/state/key_ref_set.h"
#include "master/state/object_key.h"
#include "master/state/object_table.h"
#include "master/state/object_meta.h"
#include "master/state/operations.h"
#include "master/space/segment_table.h"

namespace granary::master {

// lru: least recently read first. s3fifo: new objects enter a small probation FIFO; read ones move
// to the main FIFO, unread ones leave (their keys kept in a ghost list, so a re-put goes straight
// to main); the main FIFO gives each read object another pass (S3-FIFO, Yang et al., SOSP'23).
// prefix: s3fifo whose queues know a put batch is a prefix chain: a batch's last key leaves
// probation before anything else, and a batch's keys queue tail first (PrefixQueueStamp).
enum class EvictionPolicy : uint8_t { kLru = 0, kS3Fifo = 1, kPrefix = 2 };
inline constexpr uint8_t kMaxEvictionPolicy = 2;
// s3fifo and prefix keep the probation and main queues and the ghost.
inline bool UsesQueues(EvictionPolicy p) { return p != EvictionPolicy::kLru; }

// Timeouts and policies; defaults are Mooncake Store's (shared/MOONCAKE-API.md).
struct MasterPolicy {
  int64_t lease_ttl_ms = 10'000;
  // The longest cache lease a get grants (ReadLock): a client asking for one may read the
  // replicas it was named again, without the master, for this long; a commit or remove that
  // replaces or ends the version answers how long its writer waits for them (SettleUntil).
  // 0: none granted.
  int64_t cache_lease_ms = 2'000;
  // A remounted segment (not fresh) allocates nothing for this long: readers of the old mount
  // finish or abandon within their lease. A writer paused longer is not bounded by it, so
  // granary-node mounts new memory every time, always fresh (the mount fence, storage_node.h).
  int64_t mount_quarantine_ms = 10'000;
  // Space of a put revoked after a transfer error waits this long before reuse: its bytes may
  // still sit in socket buffers on their way to the node (2x the node's data idle timeout).
  int64_t write_quarantine_ms = 120'000;
  int64_t soft_pin_ttl_ms = 30 * 60'000;
  int64_t client_ttl_ms = 10'000;
  int64_t put_discard_timeout_ms = 30'000;
  int64_t put_release_timeout_ms = 600'000;
  // Reserved space (ReserveOp): each reservation's lease, and the most one client may hold.
  // An expired reservation's space is reused no sooner than put_release_timeout_ms after its
  // grant, nor write_quarantine_ms after its expiry (its writer may be paused mid-copy).
  int64_t reservation_ttl_ms = 60'000;
  uint64_t reservation_max_bytes = 256ull << 20;
  double eviction_high_watermark = 0.90;
  double eviction_ratio = 0.05;
  bool allow_evict_soft_pinned = true;
  // s3fifo when built with no policy (tests, in-process benches). The master's own default
  // (MasterConfig) is prefix, which adds 3-5% to s3fifo's hits in memory and with a disk tier
  // (docs/eviction.md); s3fifo doubles lru's (docs/trace-replay.md).
  EvictionPolicy eviction_policy = EvictionPolicy::kS3Fifo;
  double eviction_small_ratio = 0.10;  // s3fifo: probation queue's share of the evictable bytes
  double eviction_ghost_ratio = 4.0;   // s3fifo: keys remembered after eviction, x objects held
  uint32_t shard_count = 1024;
  // Disk copies waiting for their node to delete them (master/state/disk_garbage.h): beyond either
  // bound the oldest are forgotten (counted), which only leaks their disk space.
  uint64_t disk_garbage_max_entries = 1 << 20;
  uint64_t disk_garbage_max_key_bytes = 256 << 20;
};

// Limits on what a caller may ask for; beyond them a request is INVALID_KEY / INVALID_PARAMS.
inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxBatchKeys = 65'536;
inline constexpr uint32_t kMaxReplicas = 64;
inline constexpr size_t kMaxPatternBytes = 4096;
inline constexpr size_t kMaxQueryReplyBytes = 64 << 20;  // keys in one QueryByRegex answer

struct ObjectStat {
  bool committed = false;
  bool pending = false;
  uint64_t size = 0;
  uint64_t checksum = 0;
  std::vector<Extent> replicas;
  uint32_t read_locks = 0;
  bool hard_pinned = false;
  bool soft_pinned = false;
  int64_t idle_ms = 0;
  uint64_t put_gen = 0;  // of the pending write, if any
  std::vector<DiskReplica> disk;
  bool demoting = false;
  bool promoting = false;  // a node is copying it from disk back into memory
  bool copying = false;    // a node is copying it into a new replica (re-replication)
  uint32_t want_replicas = 0;
};

struct ObjectSummaryRow {
  std::string key;
  uint64_t size = 0;
  uint32_t replica_count = 0;
};

struct QueryResult {
  std::vector<ObjectSummaryRow> objects;
  bool truncated = false;
};

class MasterState {
 public:
  // segment_id_base: the first segment id, and the first name of puts, reservations and versions
  // (part of the initial state: a standby replaying this master's operations must start from the
  // same base). The default, the wall clock in ms << 16, makes a restarted master's names higher
  // than any an earlier master handed out: a stale PutEnd, commit or release names nothing of
  // the new master's, and of two disk copies of a key the newer version has the higher gen.
  MasterState(MasterPolicy policy, const Clock* clock,
              uint64_t segment_id_base = SegmentTable::DefaultSegmentIdBase());
  MasterState(const MasterState&) = delete;
  MasterState& operator=(const MasterState&) = delete;

  // The single mutation point (the leader's path): gives op the next sequence number and a time
  // of max(op.now_ms, the previous operation's), applies it, and shows it to every observer.
  OpResult Apply(Operation op);
  // A standby's path: applies an operation of another master's history as it is. Its seq must
  // be last_seq() + 1 and its time no earlier than the previous one (else INVALID_PARAMS and
  // nothing changes).
  Result<OpResult> Replay(const Operation& op);
  using Observer = std::function<void(const Operation&, const OpResult&)>;
  // Observers see every applied operation, in order, under the apply lock: keep them short.
  // Add them before the state is shared between threads.
  void AddObserver(Observer observer);

  // ---- ordered history ----
  uint64_t last_seq() const;
  // The whole state, canonically encoded (objects sorted by key, segments by id, allocators'
  // internals, queues, ghost, clients, deferred frees, counters) with the last seq it includes.
  // *seq (if given): the last seq the snapshot includes.
  std::string EncodeSnapshot(uint64_t* seq = nullptr) const;
  // Replaces this state with a snapshot's. INVALID_PARAMS for malformed bytes or a snapshot made
  // under another policy (replay would diverge); nothing changes then. adopt_policy: take the
  // snapshot's policy instead of refusing it (a standby runs its leader's policy). Not while
  // others use it.
  Status LoadSnapshot(std::string_view bytes, bool adopt_policy = false);
  // Empties the state, as a new master's with this base (a master that starts a cluster over).
  // Not while others use it.
  void ResetEmpty(uint64_t segment_id_base = SegmentTable::DefaultSegmentIdBase());
  // The seq of the last operation this thread applied (Apply or Replay); 0 if none. A service
  // call reads it to know which operation its reply must wait for (ServingGate::Commit).
  static uint64_t LastSeqOnThisThread();
  // How many operations this thread has applied (Apply or Replay), in every state: a call
  // compares it before and after to know whether it applied one (seqs may repeat after a
  // snapshot took the state back).
  static uint64_t AppliedOnThisThread();
  // The policy a snapshot was made under (a replica must be built with it before LoadSnapshot).
  static Result<MasterPolicy> SnapshotPolicy(std::string_view bytes);
  // XXH3-64 of EncodeSnapshot(): equal digests, equal states.
  uint64_t Digest() const;
  struct Fingerprint {
    uint64_t seq = 0;
    uint64_t digest = 0;
  };
  // The digest and the last seq it covers, taken together.
  Fingerprint StateFingerprint() const;

  // Typed shorthands: stamp the clock's time on an operation and Apply it.
  template <typename Body, typename R>
  R Do(Body body) {
    return std::get<R>(Apply(Operation{clock_->NowMs(), 0, std::move(body)}));
  }
  MountResult Mount(MountSegmentOp op) { return Do<MountSegmentOp, MountResult>(std::move(op)); }
  UnmountResult Unmount(UnmountSegmentOp op) {
    return Do<UnmountSegmentOp, UnmountResult>(std::move(op));
  }
  PingResult Ping(std::string client_id, std::vector<MountRef> mounts = {}) {
    return Do<PingOp, PingResult>(PingOp{std::move(client_id), std::move(mounts)});
  }
  ExpireClientResult ExpireClient(std::string client_id) {
    return Do<ExpireClientOp, ExpireClientResult>(ExpireClientOp{std::move(client_id)});
  }
  // Makes each key's entry (its block allocated, the key copied in) on this thread before the
  // apply lock, so that under it a new key costs an insert, not an allocation.
  std::vector<PutStartKeyResult> PutStart(PutStartOp op);
  std::vector<Status> PutEnd(PutEndOp op) { return Do<PutEndOp, std::vector<Status>>(std::move(op)); }
  std::vector<Status> PutRevoke(PutRevokeOp op) {
    return Do<PutRevokeOp, std::vector<Status>>(std::move(op));
  }
  std::vector<ReadKeyResult> GetReplicaList(GetReplicaListOp op) {
    return Do<GetReplicaListOp, std::vector<ReadKeyResult>>(std::move(op));
  }
  std::vector<Status> FinishRead(FinishReadOp op) {
    return Do<FinishReadOp, std::vector<Status>>(std::move(op));
  }
  std::vector<Status> Remove(RemoveOp op) { return Do<RemoveOp, std::vector<Status>>(std::move(op)); }
  RemoveCountResult RemoveByRegex(RemoveByRegexOp op) {
    return Do<RemoveByRegexOp, RemoveCountResult>(std::move(op));
  }
  RemoveCountResult RemoveAll(RemoveAllOp op) {
    return Do<RemoveAllOp, RemoveCountResult>(std::move(op));
  }
  RemoveCountResult RemoveScoped(RemoveScopedOp op) {
    return Do<RemoveScopedOp, RemoveCountResult>(std::move(op));
  }
  EvictResult Evict(EvictOp op) { return Do<EvictOp, EvictResult>(std::move(op)); }
  SweepResult Sweep() { return Do<SweepOp, SweepResult>(SweepOp{}); }
  std::vector<DemoteStartKeyResult> DemoteStart(DemoteStartOp op) {
    return Do<DemoteStartOp, std::vector<DemoteStartKeyResult>>(std::move(op));
  }
  std::vector<Status> DemoteEnd(DemoteEndOp op) {
    return Do<DemoteEndOp, std::vector<Status>>(std::move(op));
  }
  std::vector<Status> DemoteAbort(DemoteAbortOp op) {
    return Do<DemoteAbortOp, std::vector<Status>>(std::move(op));
  }
  std::vector<Status> DiskRegister(DiskRegisterOp op) {
    return Do<DiskRegisterOp, std::vector<Status>>(std::move(op));
  }
  std::vector<Status> DiskDrop(DiskDropOp op) {
    return Do<DiskDropOp, std::vector<Status>>(std::move(op));
  }
  std::vector<Status> DiskGarbageAck(DiskGarbageAckOp op) {
    return Do<DiskGarbageAckOp, std::vector<Status>>(std::move(op));
  }
  ReserveResult Reserve(ReserveOp op) { return Do<ReserveOp, ReserveResult>(std::move(op)); }
  // Whether some object of `op` is smaller than the reservation it names (read-only; for the
  // service to set op.trim before it applies the op).
  bool CommitTrims(const PutCommitOp& op) const;
  std::vector<Status> PutCommit(PutCommitOp op) {
    return Do<PutCommitOp, std::vector<Status>>(std::move(op));
  }
  std::vector<Status> ReleaseReservations(ReleaseReservationsOp op) {
    return Do<ReleaseReservationsOp, std::vector<Status>>(std::move(op));
  }
  std::vector<PromoteStartKeyResult> PromoteStart(PromoteStartOp op) {
    return Do<PromoteStartOp, std::vector<PromoteStartKeyResult>>(std::move(op));
  }
  std::vector<Status> PromoteEnd(PromoteEndOp op) {
    return Do<PromoteEndOp, std::vector<Status>>(std::move(op));
  }
  std::vector<Status> SetReplicas(SetReplicasOp op) {
    return Do<SetReplicasOp, std::vector<Status>>(std::move(op));
  }
  std::vector<ReplicaCopyKeyResult> ReplicaCopyStart(ReplicaCopyStartOp op) {
    return Do<ReplicaCopyStartOp, std::vector<ReplicaCopyKeyResult>>(std::move(op));
  }
  std::vector<Status> ReplicaCopyEnd(ReplicaCopyEndOp op) {
    return Do<ReplicaCopyEndOp, std::vector<Status>>(std::move(op));
  }
  DrainResult Drain(DrainOp op) { return Do<DrainOp, DrainResult>(std::move(op)); }
  DrainResult DrainFinish(DrainFinishOp op) {
    return Do<DrainFinishOp, DrainResult>(std::move(op));
  }

  // ---- queries ----
  // 1 complete, 0 missing or still being written, or a negative code (e.g. INVALID_KEY).
  std::vector<int32_t> BatchExist(const std::vector<std::string>& keys) const;
  // The same on views (the fast port's keys, read in place from the request).
  std::vector<int32_t> BatchExist(std::span<const std::string_view> keys) const;
  std::vector<int64_t> BatchGetSize(const std::vector<std::string>& keys) const;
  // How many leading keys are complete.
  Result<uint32_t> PrefixMatch(const std::vector<std::string>& keys) const;
  Result<ObjectStat> Stat(const std::string& key) const;
  // When a writer of `keys` (held names) may return: the latest end of a cache lease that a
  // client other than `caller` held on a version of one of them that an upsert replaced or that
  // went (removed, lost with its segment): the ledger (CacheLeaseLedger) notes each such
  // version's leases as it leaves; 0 for none. Asked after the commit or remove applied.
  int64_t SettleUntil(std::string_view caller, const std::vector<std::string>& keys) const;
  // The latest end of any cache lease granted (what a remove of many keys waits for).
  int64_t LatestCacheLease() const { return cache_leases_.LatestGrant(); }
  // The same two as a wait from now (the state's clock), 0 when over.
  int64_t SettleMs(std::string_view caller, const std::vector<std::string>& keys) const {
    return std::max<int64_t>(0, SettleUntil(caller, keys) - clock_->NowMs());
  }
  int64_t SettleAllMs() const {
    return std::max<int64_t>(0, LatestCacheLease() - clock_->NowMs());
  }
  // Complete objects whose key matches, every key as held; with a scope, only the keys in it,
  // matched and answered as their tenant wrote them.
  Result<QueryResult> QueryByRegex(const std::string& pattern, size_t limit,
                                   const KeyScope* scope = nullptr) const;
  // A tenant's objects (key_namespace.h): bytes of complete and pending versions (a put counts
  // from its start), and complete objects; and the space reserved by its clients (their ids are
  // in its namespace too), as the allocator counts it. Zero for a tenant with nothing.
  struct TenantUsage {
    int64_t bytes = 0;
    int64_t objects = 0;
    int64_t reserved = 0;
  };
  TenantUsage UsageOf(std::string_view tenant) const;
  // Clients silent for longer than the client TTL, as of now_ms.
  std::vector<std::string> SilentClients(int64_t now_ms) const;
  // The disk's garbage, oldest first, within the bounds (DiskGarbage::Oldest).
  std::vector<GarbageEntry> DiskGarbageOf(uint64_t disk_id, size_t max_entries,
                                          size_t max_key_bytes) const;
  // Whether the disk registered its whole inventory with this state (DiskRegisterOp.complete).
  bool DiskKnown(uint64_t disk_id) const;
  bool AnyDiskKnown() const;  // some node's disk registered: the SSD tier is in use
  // Promotions of `node_id` under way (its next offload round must end them: PromoteStartOp).
  size_t PromotionsOf(const std::string& node_id) const;

  // How many more memory replicas the committed version in `meta` needs: its wanted count
  // against its replicas outside draining segments (ReplicaCopyStartOp has the rules). Callers
  // hold meta's shard lock (ScanShard's fn does).
  uint32_t CopiesNeeded(const ObjectMeta& meta) const;
  // Whether every segment `node_id` has mounted is draining (and it has one): its disk copies
  // do not count either.
  bool NodeDraining(const std::string& node_id) const;
  // Re-replication copies under way (ReplicaCopyStartOp), all nodes'.
  uint64_t copies_in_flight() const { return copies_in_flight_.load(std::memory_order_relaxed); }
  // Apply's turns (ApplyCombiner), and the operations applied on another caller's turn.
  uint64_t apply_turns() const { return combiner_.turns(); }
  // Operations one Apply caller applies per turn, and how many callers must wait before it
  // applies theirs (MasterConfig::apply_turn_ops, apply_combine_waiting).
  void set_apply_turns(size_t ops, size_t min_waiting) { combiner_.set_limits(ops, min_waiting); }
  // Whether a turn's PutStarts are applied as one group on the turn's threads (default off;
  // MasterConfig::apply_groups). Set before the state is shared. The state is the same either way.
  void set_apply_groups(bool on) { combiner_.set_group_runner(on ? &put_group_runner_ : nullptr); }
  uint64_t applies_grouped() const { return combiner_.grouped_tasks(); }
  // Of those, the ops a repeated key or a pending write in their group made apply one by one.
  uint64_t grouped_one_by_one() const { return grouped_one_by_one_.load(std::memory_order_relaxed); }
  uint64_t apply_parts_helped() const { return combiner_.helped_parts(); }
  // A state that starts empty knows no cache lease an earlier master granted: from now until
  // the clock's now plus policy().cache_lease_ms, every write settles as if each key had one
  // (SettleUntil). Not state: neither in the snapshot nor in the digest.
  void AssumeEarlierCacheLeases();
  uint64_t applies_combined() const { return combiner_.combined_tasks(); }
  // Copies of `node_id` under way (its next copy round ends them).
  size_t CopiesOf(const std::string& node_id) const;
  // Copies attached as replicas since this state was made (counts of this process, not state).
  uint64_t copies_attached() const { return copies_attached_.load(std::memory_order_relaxed); }
  uint64_t copied_bytes() const { return copied_bytes_.load(std::memory_order_relaxed); }
  // Moves whenever an object may have come to need copies, or copies may have become possible
  // (mounts, unmounts, drains, raised replica counts, copies that did not attach): the
  // re-replication planner scans again only then. Not part of the state.
  uint64_t replica_epoch() const { return replica_epoch_.load(std::memory_order_relaxed); }

  // The offload planner's walk: calls fn(segment, key, meta) for each object whose committed
  // version got memory on one of `segments` and is of one of the put persistences `classes`
  // (never kNone), and that has not since been found not to qualify: shard by shard, under the
  // shard's lock. fn answers false for an object that no longer qualifies on that segment (its
  // memory left it, its node holds a disk copy, a disk declined it): it leaves the index until
  // that changes back (a new version, a copy attached there). Costs what the index
  // holds for those segments and classes, not the number of objects. Empty until a disk
  // registered (DiskRegisterOp): a master with no disk keeps no index.
  using OffloadVisit = std::function<bool(uint64_t, std::string_view, const ObjectMeta&)>;
  void ScanOffloadCandidates(std::span<const uint64_t> segments,
                             std::span<const PutPersistence> classes,
                             const OffloadVisit& fn) const;
  // Entries of that index in all shards (an object counts once per segment it is listed for).
  size_t offload_index_size() const;

  // The re-replication planner's walk: calls fn(key, meta) for each object whose committed
  // version needs copies (CopiesNeeded > 0), shard by shard, under the shard's lock. Visits the
  // index of objects that may need copies, not every object: an object enters it when it can
  // come to need one (a commit with fewer replicas than wanted, a raised count, a lost replica,
  // a drain or an unmount while one is under way, a copy that did not attach) and leaves it at
  // the first walk that finds it needs none. Costs what the index holds, except the first walk
  // after a drain began or a snapshot loaded: that one visits every object once, to list what
  // needs copies then (here, outside the apply path, so the drain does not stall the master).
  using CopyVisit = std::function<void(std::string_view, const ObjectMeta&)>;
  void ScanCopyCandidates(const CopyVisit& fn) const;
  // Entries of that index in all shards.
  size_t copy_index_size() const;

  // Calls fn(key, meta) for every object of shard i, under that shard's lock. For the evictor.
  void ScanShard(size_t i,
                 const std::function<void(std::string_view, const ObjectMeta&)>& fn) const;
  size_t shard_count() const { return shards_.size(); }

  SegmentTable& segments() { return segments_; }
  const SegmentTable& segments() const { return segments_; }
  const MasterPolicy& policy() const { return policy_; }
  uint64_t segment_id_base() const { return segment_id_base_; }
  const Clock* clock() const { return clock_; }
  uint64_t object_count() const { return committed_count_.load(std::memory_order_relaxed); }
  // Committed versions whose put chose a persistence of its own: while 0, the offload planner
  // decides by the master's policy alone and can skip its scan.
  uint64_t explicit_persistence_count() const {
    return explicit_persistence_count_.load(std::memory_order_relaxed);
  }
  uint64_t pending_count() const { return pending_count_.load(std::memory_order_relaxed); }
  // Reservations held, and their bytes (ReserveOp).
  uint64_t reservation_count() const { return reservation_count_.load(std::memory_order_relaxed); }
  uint64_t reserved_bytes() const { return reserved_bytes_.load(std::memory_order_relaxed); }
  size_t client_count() const;
  size_t deferred_free_count() const;
  size_t ghost_count() const;  // s3fifo: evicted keys remembered
  size_t disk_garbage_count() const;
  uint64_t disk_garbage_dropped() const;  // forgotten at the bound

 private:
  struct PreparedEntries;
  // Apply, with the entries `prepared` made for op's keys (nullptr: none).
  OpResult ApplyPrepared(Operation op, PreparedEntries* prepared);
  struct Shard {
    mutable std::mutex mu;
    ObjectTable objects;
    // Keys with a pending write, and keys being demoted; views into `objects`' keys, so erase
    // from here first.
    KeyRefSet pending_keys;
    KeyRefSet demoting_keys;
    KeyRefSet promoting_keys;
    // The offload planner's index (ScanOffloadCandidates): per (segment, the version's put
    // persistence), keys whose committed version got memory on that segment since it last
    // stopped qualifying there. A superset: what no longer qualifies stays until the planner
    // meets it; an erased key leaves every set first (views into `objects`). Derived, not state:
    // kept only once a disk registered (BuildOffloadIndex), changed by the planner's walk too.
    using OffloadClass = std::pair<uint64_t, PutPersistence>;
    mutable std::map<OffloadClass, KeyRefSet> offload;
    // The re-replication planner's index (ScanCopyCandidates): keys whose committed version may
    // need copies. A superset, views into `objects` like the others; derived, not state.
    mutable KeyRefSet copy_candidates;
    // Keys holding a cache lease (live or expired): the sweep drops the expired ones, so a key
    // read once does not keep its read-lock block. Views into `objects`, like the others.
    KeyRefSet cache_leased;
  };
  // s3fifo's memory of keys evicted from the probation queue unread, as 64-bit hashes, oldest
  // first. Striped by hash: few enough stripes that each is a fair FIFO sample (one per metadata
  // shard lost a sixth of the hit rate), enough that puts rarely wait. Reads never touch it.
  static constexpr size_t kGhostStripes = 16;
  struct GhostStripe {
    mutable std::mutex mu;
    // Key fingerprints (GhostFingerprint), oldest first. Entries are numbered in order and
    // leave from the front, so fifo[i] is entry next - fifo.size() + i: the numbers need not be
    // kept (4 bytes an entry). At most kMaxGhostPerStripe, so the 32 bits `live` keeps of a
    // number name one entry of the FIFO.
    std::deque<uint32_t> fifo;
    GhostIndex live;  // fingerprint -> its newest entry number's low 32 bits
    uint64_t next = 0;
    uint64_t EntryAt(size_t i) const { return next - fifo.size() + i; }
    // The whole number of the FIFO's entry whose low 32 bits `live` keeps.
    uint64_t EntryOf(uint32_t low) const {
      return next - static_cast<uint32_t>(static_cast<uint32_t>(next) - low);
    }
  };
  static constexpr uint64_t kMaxGhostPerStripe = uint64_t{1} << 31;
  using ObjectIter = ObjectTable::iterator;
  struct DeferredFree {
    Extent extent;
    int64_t release_at_ms = 0;
  };

  // Caller holds apply_mu_. prepared: PutStart's nodes for op's keys (nullptr: none).
  OpResult ApplyLocked(const Operation& op, PreparedEntries* prepared = nullptr);
  // The leader's numbering: op gets the next seq and a time no earlier than the last one's;
  // ApplyNext stamps and applies it. Caller holds apply_mu_.
  void StampNext(Operation& op) const;
  OpResult ApplyNext(Operation& op, PreparedEntries* prepared);
  size_t ShardOf(std::string_view key) const;
  // Key indices grouped by shard, so a batch takes each shard lock once: iterating gives
  // {shard, indices}, shards ascending, each shard's indices in the batch's order. Two flat
  // arrays, not a vector per shard: a batch of 128 keys spans ~120 of 1024 shards.
  class ShardGroups {
   public:
    struct Group {
      size_t shard;
      std::span<const uint32_t> indices;
    };
    class Iterator {
     public:
      Iterator(const ShardGroups* g, size_t begin) : g_(g), begin_(begin), end_(RunEnd(begin)) {}
      Group operator*() const {
        return {static_cast<size_t>(g_->tagged_[begin_] >> 32),
                std::span<const uint32_t>(g_->indices_.data() + begin_, end_ - begin_)};
      }
      Iterator& operator++() {
        begin_ = end_;
        end_ = RunEnd(begin_);
        return *this;
      }
      bool operator==(const Iterator& o) const { return begin_ == o.begin_; }

     private:
      size_t RunEnd(size_t from) const {
        size_t e = from;
        while (e < g_->tagged_.size() && (g_->tagged_[e] >> 32) == (g_->tagged_[from] >> 32)) ++e;
        return e;
      }
      const ShardGroups* g_;
      size_t begin_;
      size_t end_;
    };
    // tagged: shard << 32 | index, one per key.
    explicit ShardGroups(std::vector<uint64_t> tagged);
    Iterator begin() const { return Iterator(this, 0); }
    Iterator end() const { return Iterator(this, tagged_.size()); }

   private:
    std::vector<uint64_t> tagged_;   // sorted
    std::vector<uint32_t> indices_;  // tagged_'s low halves
  };
  // A PutStart's entries, one per key in the op's order, made before the apply lock; StartOne
  // inserts them. An entry not taken (its key exists, or the put failed) is freed by the caller,
  // after the lock. Its keys' hashes and shard groups are made there too.
  struct PreparedEntries {
    std::vector<ObjectTable::EntryHandle> entries;
    std::vector<uint64_t> hashes;        // XXH3 of each key
    std::optional<ShardGroups> groups;   // the keys by shard (GroupByShard's)...
    size_t shard_count = 0;              // ...of this many shards (a snapshot may change it)
  };
  // prepared's shard groups, if made for the shards there are now (caller holds apply_mu_).
  const ShardGroups* PreparedGroups(const PreparedEntries* prepared) const {
    return prepared != nullptr && prepared->groups && prepared->shard_count == shards_.size()
               ? &*prepared->groups
               : nullptr;
  }
  PreparedEntries PrepareEntries(const std::vector<std::string>& keys) const;
  // Concurrent PutStarts of one turn, applied as one group (master_state_put_group.cc): the
  // checks and the inserts run shard by shard on the turn's threads, the placements in order on
  // the turn holder's. The same state and results as one by one, or it applies them so.
  struct PutStartCall {  // an Apply's tag: the op, its entries, where its result goes
    Operation* op;
    PreparedEntries* prepared;
    OpResult* result;
  };
  struct PutGroupRunner final : ApplyCombiner::GroupRunner {
    explicit PutGroupRunner(MasterState* s) : state(s) {}
    size_t RunGroup(std::span<void* const> tags, ApplyCombiner::Helpers& helpers) noexcept override;
    MasterState* state;
  };
  size_t ApplyPutStartGroup(std::span<void* const> tags, ApplyCombiner::Helpers& helpers);
  ShardGroups GroupByShard(const std::vector<std::string>& keys) const;
  ShardGroups GroupByShard(std::span<const std::string_view> keys) const;
  // Calls visit(i, keys[i]'s entry or null) for every key, shard by shard (each shard's keys in
  // the batch's order), with that shard's lock held. The lookups run stage by stage over runs of
  // up to kLockedShards shards, whose locks are held together (ascending; only these runs hold
  // more than one shard lock, so no deadlock), so that their cache misses overlap: one find is a
  // chain of dependent loads (bucket slot, the node before, the node, the key's bytes) that a
  // call from the network meets cold.
  static constexpr size_t kLockedShards = 32;  // ThreadSanitizer tracks 64 locks per thread
  void FindEach(std::span<const std::string_view> keys,
                const std::function<void(size_t, const ObjectMeta*)>& visit) const;
  void FindEach(std::span<const std::string_view> keys,
                const std::function<void(size_t, ObjectMeta*)>& visit);
  // The staged lookups of one run of shard groups (their locks held): found[i] per key index.
  void FindRun(std::span<const ShardGroups::Group> run, std::span<const std::string_view> keys,
               std::vector<const ObjectMeta*>& found) const;

  MountResult ApplyMount(const MountSegmentOp& op, int64_t now);
  UnmountResult ApplyUnmount(const UnmountSegmentOp& op, int64_t now);
  PingResult ApplyPing(const PingOp& op, int64_t now);
  ExpireClientResult ApplyExpireClient(const ExpireClientOp& op, int64_t now);
  std::vector<PutStartKeyResult> ApplyPutStart(const PutStartOp& op, int64_t now,
                                               PreparedEntries* prepared);
  std::vector<Status> ApplyPutEnd(const PutEndOp& op, int64_t now);
  std::vector<Status> ApplyPutRevoke(const PutRevokeOp& op, int64_t now);
  std::vector<ReadKeyResult> ApplyGetReplicaList(const GetReplicaListOp& op, int64_t now);
  std::vector<Status> ApplyFinishRead(const FinishReadOp& op, int64_t now);
  std::vector<Status> ApplyRemove(const RemoveOp& op, int64_t now);
  RemoveCountResult ApplyRemoveMatching(const std::function<bool(std::string_view)>& match,
                                        bool force, int64_t now);
  RemoveCountResult ApplyRemoveByRegex(const RemoveByRegexOp& op, int64_t now);
  RemoveCountResult ApplyRemoveScoped(const RemoveScopedOp& op, int64_t now);
  EvictResult ApplyEvict(const EvictOp& op, int64_t now);
  SweepResult ApplySweep(const SweepOp& op, int64_t now);
  std::vector<DemoteStartKeyResult> ApplyDemoteStart(const DemoteStartOp& op, int64_t now);
  std::vector<Status> ApplyDemoteEnd(const DemoteEndOp& op, int64_t now);
  std::vector<Status> ApplyDemoteAbort(const DemoteAbortOp& op, int64_t now);
  std::vector<Status> ApplyDiskRegister(const DiskRegisterOp& op, int64_t now);
  std::vector<Status> ApplyDiskDrop(const DiskDropOp& op, int64_t now);
  std::vector<Status> ApplyDiskGarbageAck(const DiskGarbageAckOp& op);
  std::vector<PromoteStartKeyResult> ApplyPromoteStart(const PromoteStartOp& op, int64_t now);
  std::vector<Status> ApplyPromoteEnd(const PromoteEndOp& op);
  std::vector<Status> ApplySetReplicas(const SetReplicasOp& op, int64_t now);
  std::vector<ReplicaCopyKeyResult> ApplyReplicaCopyStart(const ReplicaCopyStartOp& op,
                                                          int64_t now);
  std::vector<Status> ApplyReplicaCopyEnd(const ReplicaCopyEndOp& op);
  // Promotions (copies false) or re-replication copies (true) of node_id's rounds before
  // `round` end: their allocations go back (the node's rounds are serial).
  void EndEarlierRounds(const std::string& node_id, uint64_t round, bool copies);
  // PromoteEnd and ReplicaCopyEnd: each allocation attached if copied and still the committed
  // version's, else freed.
  std::vector<Status> EndMemoryCopies(const std::string& node_id, uint64_t round,
                                      const std::vector<std::string>& keys,
                                      const std::vector<uint64_t>& version_gens,
                                      const std::vector<uint8_t>& copied, bool copies);
  DrainResult ApplyDrain(const DrainOp& op, int64_t now);
  DrainResult ApplyDrainFinish(const DrainFinishOp& op, int64_t now);
  // Ends a re-replication copy: its allocation goes back (free_extent, as ClearPromotion) and
  // the read lock its start took on the version goes with it.
  void ClearCopy(Shard& shard, ObjectIter it, bool free_extent);
  ReserveResult ApplyReserve(const ReserveOp& op, int64_t now);
  std::vector<Status> ApplyPutCommit(const PutCommitOp& op, int64_t now);
  std::vector<Status> ApplyReleaseReservations(const ReleaseReservationsOp& op);
  // Frees or quarantines reservations: on a segment gone with its memory (no free), or whose
  // lease ended by `now` (quarantined). Returns how many went. Caller holds apply_mu_.
  size_t DropReservationsOn(uint64_t segment_id);
  size_t ExpireReservations(int64_t now);
  void ForgetReservation(std::map<uint64_t, HeldReservation>::iterator it);
  // Reservation `name`, if held at (segment_id, offset) by client_id; else INVALID_WRITE (not
  // held there: names alone may be stale) or ILLEGAL_CLIENT. Commit and release both ask.
  Result<std::map<uint64_t, HeldReservation>::iterator> HeldBy(const std::string& client_id,
                                                               uint64_t name, uint64_t segment_id,
                                                               uint64_t offset);
  // A key's checks before a new version may be written (StartOne, PutCommit): OK, or why not.
  // Clears a zombie pending write, and a pending write of the same client begun by an earlier
  // operation (generation below op_first_gen): that client gave it up (its answer was lost in a
  // failover, or its put failed) and is putting the key again; a duplicate key of the same batch
  // is still refused. The space of a cleared write waits for the release timeout.
  Status MayWrite(Shard& shard, ObjectIter it, bool upsert, int64_t now,
                  const std::string& client_id, uint64_t op_first_gen);
  // Makes `pending` the committed version of the key at `it` (PutEnd, PutCommit); its index in
  // the op's batch of batch_size keys orders new objects of one batch in their queue.
  void CommitVersion(Shard& shard, ObjectIter it, PendingWrite pending, uint64_t checksum,
                     size_t index, size_t batch_size, int64_t now);
  // Ends a promotion. free_extent: its allocation goes back (the caller knows the node no longer
  // writes it); false when it was attached, or its segment is gone with the memory.
  void ClearPromotion(Shard& shard, ObjectIter it, bool free_extent);
  // A free segment of `node_id` that can take `size` bytes and stay at or below the eviction
  // high watermark; nullopt if none.
  std::optional<Extent> AllocateForPromotion(const std::string& node_id, uint64_t size,
                                             int64_t now);
  // The disk must delete this copy: the record no longer names it (disk_mu_ is a leaf).
  void AddGarbage(uint64_t disk_id, const std::string& key, uint64_t location);
  void AddGarbage(std::string_view key, std::span<const DiskReplica> copies);
  // The object `key` if `node_id` is demoting its version `version_gen`; else why not
  // (INVALID_WRITE: no demotion; ILLEGAL_CLIENT: another node's or another version's).
  Result<ObjectIter> OwnDemotion(Shard& shard, const std::string& key, const std::string& node_id,
                                 uint64_t version_gen);
  // Ends the demotion of it (attached or not): its held memory is freed once no read lock can
  // cover it.
  void ResolveDemotion(Shard& shard, ObjectIter it, int64_t now);
  // Eviction of a complete object: its memory goes; the object stays if a disk replica holds it.
  // Returns the memory bytes freed.
  uint64_t EvictMemory(Shard& shard, ObjectIter it, int64_t now);

  // Lists the committed version at `it` in its shard's offload index for every segment it has
  // memory on, if it may be offloaded at all (index kept, not declined, persistence not none).
  void NoteOffloadCandidate(Shard& shard, ObjectIter it);
  // Starts keeping the offload index: lists every object. Caller holds apply_mu_ (or owns the
  // state alone).
  void BuildOffloadIndex();
  // Lists the object at `it` in its shard's copy index if its committed version needs copies.
  // Caller holds the shard's lock. Every change that can raise CopiesNeeded calls it.
  void NoteCopyCandidate(Shard& shard, ObjectIter it);
  // Drops every extent on segment_id from every object (its memory is gone).
  uint64_t DropSegmentReplicas(uint64_t segment_id);
  // node: the entry PutStart made for this key before the lock (nullptr or empty: none); one
  // not taken is left in it, to be freed after the lock.
  PutStartKeyResult StartOne(Shard& shard, const std::string& key, uint64_t size,
                             const PutStartOp& op, const SegmentTable::Placement& order,
                             size_t rotation, int64_t now, uint64_t op_first_gen,
                             ObjectTable::EntryHandle* entry);
  // A PutStart's refusal of the whole batch, and of one key before its lookup (OK: none).
  Status PutStartBatchError(const PutStartOp& op) const;
  static Status PutStartKeyError(std::string_view key, uint64_t size);
  // The put's extents and generation (the key at `rotation` of its batch), or why none.
  PutStartKeyResult PlacePut(const PutStartOp& op, uint64_t size,
                             const SegmentTable::Placement& order, size_t rotation, int64_t now);
  PendingWrite MakePending(const PutStartOp& op, uint64_t size, const PutStartKeyResult& placed,
                           int64_t now) const;
  // Removes the committed version of a complete object (remove, evict). Locked extents are freed
  // only once every read lock on them has expired.
  void DropCommitted(Shard& shard, ObjectIter it, int64_t now);
  void SetPending(Shard& shard, ObjectIter it, PendingWrite pending);
  void ClearPending(Shard& shard, ObjectIter it);
  void EraseIfEmpty(Shard& shard, ObjectIter it);
  // The object's committed version is about to go (with the object, or replaced by an upsert):
  // the ledger keeps its cache leases for the key's writers.
  void NoteCacheLeasesLeaving(std::string_view key, const ObjectMeta& meta);
  // The object's read locks and cache leases go, its version with them: the leases are noted
  // first (NoteCacheLeasesLeaving), so a later writer of the key still waits them out.
  void DropReadLocks(std::string_view key, ObjectMeta& meta);
  // Every committed version enters and leaves the counters through these two.
  void CountCommitted(std::string_view key, const Version& v) {
    committed_count_++;
    if (v.persistence != PutPersistence::kDefault) explicit_persistence_count_++;
    CountTenant(key, static_cast<int64_t>(v.size), 1);
  }
  void UncountCommitted(std::string_view key, const Version& v) {
    committed_count_--;
    if (v.persistence != PutPersistence::kDefault) explicit_persistence_count_--;
    CountTenant(key, -static_cast<int64_t>(v.size), -1);
  }
  // A tenant's usage (UsageOf) moves; a key (or client id) of the default namespace costs a
  // byte compare.
  void CountTenant(std::string_view key, int64_t bytes, int64_t objects, int64_t reserved = 0) {
    if (key.empty() || key.front() != kNamespaceMark) return;
    CountTenantSlow(TenantOfKey(key), bytes, objects, reserved);
  }
  void CountTenantSlow(std::string_view tenant, int64_t bytes, int64_t objects, int64_t reserved);
  void FreeExtents(std::span<const Extent> extents);
  // s3fifo ghost: remember a key evicted unread; Take answers whether it was remembered (and
  // forgets it).
  void GhostAdd(std::string_view key);
  bool GhostTake(std::string_view key);
  void FreeLater(std::span<const Extent> extents, int64_t release_at_ms, int64_t now);
  void EncodeLocked(Encoder& out) const;  // caller holds apply_mu_

  MasterPolicy policy_;
  const Clock* clock_;
  uint64_t segment_id_base_;
  SegmentTable segments_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<uint64_t> committed_count_{0};
  mutable std::mutex tenants_mu_;
  std::map<std::string, TenantUsage, std::less<>> tenant_usage_;  // guarded by tenants_mu_
  std::atomic<uint64_t> explicit_persistence_count_{0};
  std::atomic<uint64_t> pending_count_{0};
  std::atomic<uint64_t> copies_in_flight_{0};  // derived: promotions with `copy` set
  std::atomic<uint64_t> replica_epoch_{0};
  std::atomic<uint64_t> copies_attached_{0};
  std::atomic<uint64_t> copied_bytes_{0};
  uint64_t disk_replica_count_ = 0;  // under apply_mu_; lets node expiry skip its scan when 0
  bool offload_index_on_ = false;    // under apply_mu_: BuildOffloadIndex ran
  // A drain began or a snapshot loaded: the next ScanCopyCandidates lists every object that
  // needs copies first (derived, not state).
  mutable std::atomic<bool> copy_walk_pending_{false};

  mutable std::mutex clients_mu_;
  std::unordered_map<std::string, int64_t> client_last_seen_ms_;

  mutable std::mutex deferred_mu_;
  std::vector<DeferredFree> deferred_;

  std::array<GhostStripe, kGhostStripes> ghost_;

  // Written under apply_mu_; the lock lets the offload RPC and metrics read them meanwhile.
  mutable std::mutex disk_mu_;
  DiskGarbage garbage_;
  std::set<uint64_t> known_disks_;

  // Serialises every mutation: the one total order of the history.
  mutable std::mutex apply_mu_;
  ApplyCombiner combiner_{&apply_mu_};  // Apply's turns under apply_mu_
  uint64_t last_seq_ = 0;
  int64_t last_now_ms_ = 0;
  CacheLeaseLedger cache_leases_;
  uint64_t next_put_gen_;  // from segment_id_base (at least 1)
  std::vector<uint64_t> candidates_scratch_;  // PlacePut's placement order, under apply_mu_
  std::vector<uint64_t> used_scratch_;        // PlacePut's segments taken, under apply_mu_
  PutGroupRunner put_group_runner_{this};
  std::atomic<uint64_t> grouped_one_by_one_{0};
  std::vector<Observer> observers_;
  // Reservations by gen (their names come from next_put_gen_), under apply_mu_; the bytes per
  // client are derived (the cap's check), the atomics are for metrics.
  // Counted in what the allocator takes (ReservedCost), not in the sizes asked for: 1-byte
  // reservations take 64 bytes each, and the caps must see that.
  struct ClientReservations {
    uint64_t bytes = 0;
    uint64_t count = 0;
  };
  std::map<uint64_t, HeldReservation> reservations_;
  std::unordered_map<std::string, ClientReservations> reserved_by_client_;
  std::unordered_map<uint64_t, uint64_t> reserved_by_segment_;
  static constexpr uint64_t kMaxReservedShare = 4;  // at most 1/4 of a segment is reserved
  static constexpr uint64_t kMaxReservationsPerClient = 65'536;
  std::atomic<uint64_t> reservation_count_{0};
  std::atomic<uint64_t> reserved_bytes_{0};
};

// Validates a key; OK or INVALID_KEY with the reason.
Status ValidateKey(std::string_view key);

}  // namespace granary::master
