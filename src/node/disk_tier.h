// node/disk_tier.h - a storage node's SSD tier: its DiskStore (src/disk/), and what keeps the
// master's view of it right.
//
// Promise:
//   - RegisterInventory(), called after every successful mount, tells the master every intact
//     object on disk, so that after a node restart (same --disk-dir) or a master restart the disk
//     tier is known again without any client action. Copies the master refuses (other bytes are
//     committed under the key, or a put of it is in flight) are deleted.
//   - The offload thread asks the master which objects to copy (OffloadStart: the master's
//     persistence policy decides), copies each from this node's own segment, writes the batch to
//     disk, and reports every outcome (OffloadEnd). The bytes must hash to the checksum the master
//     holds (DiskStore checks it), so a copy is never certified for bytes it does not carry; a
//     copy of a version the master replaced meanwhile is deleted.
//   - Disk eviction when the budget is short: victims are chosen (no I/O), the master is told
//     (DiskDrop) and only then are their files deleted.
//   - Loads: reads() serves the data plane's DISK_READ (node/disk_read_service.h); a copy a read
//     finds gone, torn or corrupted is dropped with the master (DiskDrop) by the offload thread.
// Ownership: owns the DiskStore and the offload thread; borrows the segment and the master stub
// from StorageNode, which stops this first.
// Thread safety: Start/Stop from the node's owner; RegisterInventory from the heartbeat thread
// (or Start); FillStats from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "disk/disk_store.h"
#include "node/disk_read_service.h"
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

class DiskTier {
 public:
  // Opens (or recovers) the store. Errors are the store's (a missing or read-only directory...).
  static Result<std::unique_ptr<DiskTier>> Open(DiskTierOptions options, ShmSegment* segment,
                                                proto::Master::Stub* master, std::string node_id);
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
  // Offload rounds that wrote at least one object (for tests and logs).
  uint64_t offloaded_objects() const { return offloaded_.load(); }

 private:
  DiskTier(DiskTierOptions options, ShmSegment* segment, proto::Master::Stub* master,
           std::string node_id);
  void OffloadLoop();
  // One round: returns how many objects went to disk.
  Result<size_t> OffloadOnce();
  // Frees `bytes` of the budget: choose victims, tell the master, delete.
  void MakeRoom(uint64_t bytes);
  // Tells the master the copies reads found lost.
  void DropLost();

  DiskTierOptions options_;
  ShmSegment* segment_;
  proto::Master::Stub* master_;
  std::string node_id_;
  std::unique_ptr<disk::DiskStore> store_;
  std::unique_ptr<DiskReadService> reads_;
  std::atomic<uint64_t> token_{0};
  std::atomic<uint64_t> offloaded_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<std::pair<std::string, uint64_t>> lost_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace granary::node
