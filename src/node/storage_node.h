// node/storage_node.h - a storage node: one segment of shared memory offered to the store.
//
// Promise: Start() creates the segment (named POSIX shm), serves it on the data plane (TCP), and
// mounts it with the master; a heartbeat thread then pings the master with the mounts it
// believes current (name + token), remounts when the master answers NEED_REMOUNT (it restarted,
// had declared this node dead, or holds the segment under another token) and keeps retrying
// while the master is unreachable. Stop() unmounts, stops serving and unlinks the segment.
//
// Every mount attempt has its own random token (never 0). Before sending it, the node writes it
// into the segment's shared-memory header and makes the data server accept it (and refuse every
// other), so a reader or writer still holding a replica of a previous mount is refused by the
// data server and by same-host clients' header check. The first mount attempt of the process is
// sent with fresh=true (the memory was never handed to anyone); every later one with fresh=false
// (late readers and writers of an earlier mount may exist: the master quarantines that space).
// A heartbeat that reaches the master again after an outage does not remount by itself: Ping
// carries the mounts, and only NEED_REMOUNT makes a new token.
//
// Shared memory of dead nodes: at start, and then every reclaim_interval_ms from the heartbeat
// thread, the node unlinks Granary segment files on this host whose owner is gone (see
// ShmSegment::ReclaimOrphans), so a node killed with -9 does not keep its memory charged forever.
// Used by granary-node and, embedded, by a client that contributes memory.
// With prefault, the segment's reserved pages are also zeroed in the background right after
// Create (SegmentPopulator), so the first clients do not pay for it.
// Ownership: owns the segment, the data server and the heartbeat thread.
// Thread safety: Start/Stop from one thread; the accessors from any.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "granary/proto/master.grpc.pb.h"
#include "granary/status.h"
#include "node/data_server.h"
#include "node/segment_populator.h"
#include "node/disk_tier.h"
#include "node/shm_segment.h"
#include "node/shm_staging.h"

namespace granary::node {

struct StorageNodeOptions {
  std::string master_address = "127.0.0.1:50051";
  std::string segment_name;          // default: "<hostname>-<pid>-<random per process>"
  uint64_t segment_size = 0;         // required
  std::string listen_host = "127.0.0.1";
  std::string advertise_host;        // address clients use; default: listen_host (hostname if 0.0.0.0)
  uint16_t port = 0;                 // data plane; 0 picks a free one
  bool prefault = true;  // reserve every page at start: a full /dev/shm fails now, not by SIGBUS
  int64_t heartbeat_interval_ms = 1000;
  int rpc_timeout_ms = 5000;
  int data_idle_timeout_ms = 60'000;
  // The data server (node/data_server.h): connections open at once (the descriptor limit is
  // raised to fit), I/O threads, and the time a request has to complete (plus its bytes at 1 MiB/s).
  uint64_t data_max_connections = DataServerOptions{}.max_connections;
  uint64_t data_io_threads = DataServerOptions{}.io_threads;
  int64_t data_request_timeout_ms = DataServerOptions{}.request_timeout_ms;
  // How often to unlink orphaned segment files of dead nodes on this host (ShmSegment::
  // ReclaimOrphans); also done once at start. 0: only at start.
  int64_t reclaim_interval_ms = 30'000;
  // The SSD tier (node/disk_tier.h); disk.store.dir empty: none.
  DiskTierOptions disk;
  // With a disk tier: the shared-memory staging region for same-host loads (node/shm_staging.h),
  // "<segment shm name>-stage" in /dev/shm. 0, or a region that cannot be made: TCP loads only.
  uint64_t disk_shm_staging_bytes = 256ull << 20;
  int64_t disk_staging_ttl_ms = 30'000;  // a staged slot not released this long is reclaimed
};

class StorageNode {
 public:
  // Fails if the segment cannot be created, the port bound, or the master refuses the mount
  // (e.g. the name is taken). An unreachable master is not fatal: the heartbeat keeps trying.
  static Result<std::unique_ptr<StorageNode>> Start(StorageNodeOptions options);
  ~StorageNode();
  void Stop();

  const std::string& client_id() const { return client_id_; }
  const std::string& segment_name() const { return options_.segment_name; }
  const std::string& endpoint() const { return endpoint_; }
  uint16_t port() const { return server_->port(); }
  // The token of the current (last attempted) mount.
  uint64_t token() const { return token_.load(); }
  ShmSegment& segment() { return *segment_; }
  DataServer& server() { return *server_; }
  // The master confirmed the mount under the current token (false while a remount is in flight).
  bool mounted() const { return mounted_.load(); }
  DiskTier* disk() { return disk_.get(); }  // null without a disk tier
  ShmStaging* staging() { return staging_.get(); }  // null without same-host disk staging

 private:
  explicit StorageNode(StorageNodeOptions options);
  proto::SegmentSpec Spec() const;
  // Takes a new token (header, data server, then the master). Heartbeat thread, or Start().
  Status Mount();
  void HeartbeatLoop();

  StorageNodeOptions options_;
  std::string client_id_;
  std::string endpoint_;
  std::atomic<uint64_t> token_{0};
  // Some mount attempt may have reached the master: later mounts are not fresh. Start() and then
  // the heartbeat thread only.
  bool maybe_mounted_ = false;
  std::unique_ptr<ShmSegment> segment_;
  SegmentPopulator populator_;  // prefault only; stopped before segment_ goes
  std::unique_ptr<ShmStaging> staging_;  // outlives server_ (declared before it)
  std::unique_ptr<DataServer> server_;
  std::unique_ptr<DiskTier> disk_;
  std::unique_ptr<proto::Master::Stub> master_;
  std::atomic<bool> mounted_{false};

  std::chrono::steady_clock::time_point last_reclaim_{};  // heartbeat thread only
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread heartbeat_;
};

}  // namespace granary::node
