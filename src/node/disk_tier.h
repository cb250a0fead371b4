// node/disk_tier.h - a storage node's SSD tier: its DiskStore (src/disk/), and what keeps the
// master's view of it right.
//
// Promise:
//   - The disk has an id of its own (<disk-dir>/DISK_ID, made once): the master knows the disk's
//     copies, and which to delete, by it across node restarts (a restarted node is a new client).
//   - RegisterInventory(), called after every successful mount, tells the master every intact
//     object on disk (at least one request, the last marked complete), so that after a node
//     restart (same --disk-dir) or a master restart the disk tier is known again without any
//     client action. Copies the master refuses (removed or replaced since, other bytes committed
//     under the key, a put of it in flight) are deleted.
//   - The offload thread asks the master every interval (OffloadStart), even with nothing to
//     offload: first it deletes the copies the master names as garbage (DiskStore::Remove;
//     already gone counts as deleted) and acknowledges them in its next request, then it copies
//     what the master's persistence policy picked from this node's own segment, writes the batch
//     to disk, and reports every outcome (OffloadEnd). The bytes must hash to the checksum the
//     master holds (DiskStore checks it), so a copy is never certified for bytes it does not
//     carry; a copy of a version the master replaced meanwhile is deleted. With
//     offload_interval_ms <= 0 there is no offload thread, so no garbage is deleted either.
//   - Promotion: each OffloadStart names the round (counting up from 1); its answer may name
//     disk-only objects to copy back to memory (the master's --promote-after), each with an
//     allocation in this node's segment under the current mount's token. The tier reads the copy
//     from its store (checked against the record's checksum, and the master's), copies it to that
//     offset and reports every outcome (PromoteEnd) before the round ends; the master attaches the
//     memory replica only if the version is still committed. The next round's OffloadStart tells
//     the master this round's writes are over (what it did not hear of is freed then).
//     A copy goes into the memory whose header carries the allocation's token, checked just
//     before the copy: every mount has its own memory (node/shm_segment.h, Renew), so a copy
//     that a remount overtakes lands in the retired memory, never in the new mount's.
//   - Disk eviction when the budget is short: victims are chosen (no I/O), the master is told
//     (DiskDrop) and only then are their files deleted.
//   - Loads: reads() serves the data plane's DISK_READ (node/disk_read_service.h); a copy a read
//     finds gone, torn or corrupted is dropped with the master (DiskDrop) by the offload thread.
// Ownership: owns the DiskStore and the offload thread; borrows the master stub from
// StorageNode, which stops this first, and asks it for the current segment (a shared_ptr, kept
// for one use: a remount may replace the segment meanwhile).
// Thread safety: Start/Stop from the node's owner; RegisterInventory from the heartbeat thread
// (or Start); FillStats from any thread. A registration and an offload round never overlap
// (round_mu_): a registration's listing of the disk must not name copies a round is deleting.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "disk/disk_store.h"
#include "node/disk_read_service.h"
#include "client/master_locator.h"
#include "granary/proto/master.grpc.pb.h"
#include "granary/status.h"
#include "node/shm_segment.h"

namespace granary::node {

struct DiskTierOptions {
  disk::DiskStoreOptions store;      // store.dir empty: no disk tier
  int64_t offload_interval_ms = 1000;
  uint32_t offload_max_keys = 500;   // per round (a bucket's worth)
  uint64_t offload_max_bytes = 256ull << 20;
  int rpc_timeout_ms = 5000;
  DiskReadServiceOptions reads;  // reads.on_lost is set by the tier
};

// The tier as granary-node's --disk-* flags name it, and as a client's embedded node takes it
// (ClientOptions.disk_*): one parser, so both run the same tier with the same defaults.
struct DiskTierSettings {
  std::string dir;                 // empty: no disk tier
  uint64_t size = 0;               // 0: 80% of the free space of dir's filesystem at start
  std::string backend = "bucket";  // disk::ParseBackend
  std::string eviction = "lru";    // disk::ParseEvictionPolicy
  std::string io = "auto";         // disk::ParseIoMode
  int64_t offload_interval_ms = 1000;
};
// INVALID_PARAMS naming the setting a parser refuses. An empty dir gives options without a tier.
Result<DiskTierOptions> MakeDiskTierOptions(const DiskTierSettings& settings, int rpc_timeout_ms);

// Disk bytes an offload round makes room for per copy of `size` value bytes, about: the value
// 4 KiB-aligned plus a 4 KiB header.
uint64_t CopyFootprint(uint64_t size);

class DiskTier {
 public:
  // The node's current segment (a remount replaces it); called from the offload thread.
  using SegmentSource = std::function<std::shared_ptr<ShmSegment>()>;
  // Opens (or recovers) the store. Errors are the store's (a missing or read-only directory...).
  static Result<std::unique_ptr<DiskTier>> Open(DiskTierOptions options, SegmentSource segment,
                                                client::MasterLocator* master, std::string node_id);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  void Start();  // the offload thread
  void Stop();

  Status RegisterInventory();
  // The disk tier's capacity and use, for the heartbeat.
  void FillStats(proto::DiskStats* out) const;
  // The segment token of the current mount: offload items quoting another are given up.
  void SetMountToken(uint64_t token) { token_ = token; }

  disk::DiskStore& store() { return *store_; }
  DiskReadService* reads() { return reads_.get(); }
  // A copy that is no longer on disk intact: the master is told at the next offload round.
  void ReportLost(std::string_view key, uint64_t location);
  uint64_t disk_id() const { return disk_id_; }
  // Objects written to disk and attached by the master (for tests and logs).
  uint64_t offloaded_objects() const { return offloaded_.load(); }
  // Object bytes of those (for /metrics).
  uint64_t offloaded_bytes() const { return offloaded_bytes_.load(); }
  // Copies this node chose to delete to make room (dropped with the master first; for /metrics).
  uint64_t evicted_objects() const { return evicted_objects_.load(); }
  // Garbage copies deleted at the master's word (for tests and logs).
  uint64_t deleted_garbage() const { return deleted_garbage_.load(); }
  // Objects copied back to memory and attached by the master (for tests, logs and the pings).
  uint64_t promoted_objects() const { return promoted_.load(); }

 private:
  DiskTier(DiskTierOptions options, SegmentSource segment, client::MasterLocator* master,
           std::string node_id);
  void OffloadLoop();
  // One round: returns how many objects went to disk or were deleted as garbage.
  Result<size_t> OffloadOnce();
  Status RegisterLocked();  // caller holds round_mu_
  // Deletes the copies the answer names as garbage; returns how many are gone now.
  size_t DeleteGarbage(const proto::OffloadStartResponse& started);
  // Copies the answer's promotions from disk into the segment and reports them (PromoteEnd);
  // returns how many the master attached.
  size_t Promote(const proto::OffloadStartResponse& started, uint64_t round);
  // Frees `bytes` of the budget: choose victims, tell the master, delete.
  void MakeRoom(uint64_t bytes);
  // Tells the master the copies reads found lost.
  void DropLost();
  // DiskDrop of (key, location) copies, in calls small enough for any key length; returns how
  // many the master was told before a call failed (all of them on success).
  size_t DropWithMaster(const std::vector<std::pair<std::string, uint64_t>>& copies,
                        const char* what);

  DiskTierOptions options_;
  SegmentSource segment_;
  client::MasterLocator* master_;
  std::string node_id_;
  std::unique_ptr<disk::DiskStore> store_;
  std::unique_ptr<DiskReadService> reads_;
  uint64_t disk_id_ = 0;
  std::atomic<uint64_t> token_{0};
  std::atomic<uint64_t> offloaded_{0};
  std::atomic<uint64_t> offloaded_bytes_{0};
  std::atomic<uint64_t> evicted_objects_{0};
  std::atomic<uint64_t> deleted_garbage_{0};
  std::atomic<uint64_t> promoted_{0};

  std::mutex round_mu_;
  bool registered_ = false;            // a complete inventory reached this master
  std::vector<uint64_t> deleted_ids_;  // garbage deleted, not yet acknowledged to the master
  uint64_t round_ = 0;                 // offload rounds asked for; under round_mu_

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<std::pair<std::string, uint64_t>> lost_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace granary::node
