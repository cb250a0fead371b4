// node/storage_node.h - a storage node: one segment of shared memory offered to the store.
//
// Promise: Start() creates the segment (named POSIX shm), serves it on the data plane (TCP), and
// mounts it with the master; a heartbeat thread then pings the master with the mounts it
// believes current (name + token), remounts when the master answers NEED_REMOUNT (it restarted,
// had declared this node dead, or holds the segment under another token) and keeps retrying
// while the master is unreachable. Stop() unmounts, stops serving and unlinks the segment.
//
// Every mount attempt has its own random token (never 0) and, once an earlier attempt may have
// reached a master, its own memory. Before sending a remount the node (1) fences its data server
// (node/data_server.h: no byte of a request accepted under the old token moves any more, however
// long its peer paused; a stalled peer is not waited for), (2) renews the segment
// (node/shm_segment.h: the old file is retired, its pages released, and a new file takes the
// name), then (3) writes the new token into the new header and has the data server serve the new
// memory under it. A same-host client paused mid-memcpy under the old token writes only into the
// retired file, and a TCP writer's late payload is drained, never stored. So nothing of an
// earlier mount can touch the memory the master hands out under the new one, and every mount is
// sent fresh=true: the master needs no quarantine to make it safe. A remount costs the renewal
// (releasing the old pages and, with prefault, reserving the new ones) and the segment's bytes,
// whose replicas the master has dropped anyway.
// A heartbeat that reaches the master again after an outage does not remount by itself: Ping
// carries the mounts, and only NEED_REMOUNT makes a new token.
//
// Shared memory of dead nodes: at start, and then every reclaim_interval_ms from the heartbeat
// thread, the node unlinks Granary segment files on this host whose owner is gone (see
// ShmSegment::ReclaimOrphans), so a node killed with -9 does not keep its memory charged forever.
// Used by granary-node and, embedded, by a client that contributes memory.
// With prefault, the segment's reserved pages are also zeroed in the background right after
// Create (SegmentPopulator), so the first clients do not pay for it.
// With http_port set, the node serves /metrics (the granary_node_* series: data plane, staging,
// disk tier), /health (200 while mounted and serving, else 503) and /status (JSON) on listen_host
// (node/storage_node_http.cc); the HTTP server stops first, before what its handlers read.
// Ownership: owns the segment (the current file; a retired one lives on only while the disk tier
// finishes a copy with it), the data server and the heartbeat thread.
// Thread safety: Start/Stop from one thread; the accessors from any.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "granary/proto/master.grpc.pb.h"
#include "granary/status.h"
#include "client/master_locator.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "node/data_server.h"
#include "node/segment_populator.h"
#include "node/disk_tier.h"
#include "node/replica_copier.h"
#include "node/shm_segment.h"
#include "node/shm_staging.h"
#include "security/tls.h"

namespace granary::node {

struct StorageNodeOptions {
  std::string master_address = "127.0.0.1:50051";  // or etcd://h1:p1[;h2:p2] (HA, docs/ha.md)
  std::string cluster_id;            // with an etcd address; empty: $GRANARY_CLUSTER_ID or granary
  std::string secret;                // the cluster's, presented to the master (security/secret.h)
  // TLS to the master (security/tls.h); null: plain TCP. The data plane is never TLS.
  std::shared_ptr<const security::TlsContext> tls;
  etcd::EtcdCredentials etcd_credentials;  // etcd's user, with an etcd:// master (empty: none)
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
  // Re-replication (node/replica_copier.h): how often to ask the master for copies to make
  // while it has none. 0: this node makes no copies.
  int64_t copy_interval_ms = 1000;
  // The node's HTTP endpoint (/metrics, /health, /status) on listen_host; nullopt: none. 0 picks
  // a free port (tests; see http_port()). A port that cannot be bound fails Start().
  std::optional<uint16_t> http_port;
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
  // The current segment file; a remount replaces it (the old one is retired).
  std::shared_ptr<ShmSegment> segment() const;
  DataServer& server() { return *server_; }
  // The master confirmed the mount under the current token (false while a remount is in flight).
  bool mounted() const { return mounted_.load(); }
  DiskTier* disk() { return disk_.get(); }  // null without a disk tier
  ShmStaging* staging() { return staging_.get(); }  // null without same-host disk staging
  ReplicaCopier* copier() { return copier_.get(); }  // null with copy_interval_ms 0
  // Every granary_node_* series; what /metrics renders.
  MetricsRegistry& metrics() { return metrics_; }
  // The HTTP endpoint's bound port; 0 without one.
  uint16_t http_port() const { return http_ ? http_->port() : 0; }
  // /health's answer: mounted, and the data server listening (not stopping).
  bool serving() const;
  // /status's body: node id, endpoint, segment, mount, master, disk tier figures.
  std::string StatusJson() const;

 private:
  explicit StorageNode(StorageNodeOptions options);
  proto::SegmentSpec Spec() const;
  // Takes a new token (fence and renewal if needed, header, data server, then the master).
  // Heartbeat thread, or Start().
  Status Mount();
  void HeartbeatLoop();
  // The node's own gauges (segment, staging, disk tier) beside the data server's series.
  void RegisterMetrics();
  // Registers the routes and binds options_.http_port (storage_node_http.cc).
  Status StartHttp();

  StorageNodeOptions options_;
  std::string client_id_;
  std::string endpoint_;
  std::atomic<uint64_t> token_{0};
  // A mount attempt under the current memory may have reached a master: the next one renews the
  // memory first. Start() and then the heartbeat thread only.
  bool offered_ = false;
  mutable std::mutex segment_mu_;  // guards segment_ (swapped by a remount), capability_key_
  std::string capability_key_;     // the current mount's (security/capability.h)
  std::shared_ptr<ShmSegment> segment_;
  // Prefault only: populates the current segment; stopped before it is retired or goes.
  std::unique_ptr<SegmentPopulator> populator_;
  // Outlives the data server and the disk tier, whose series it holds (declared before them).
  MetricsRegistry metrics_;
  std::unique_ptr<ShmStaging> staging_;  // outlives server_ (declared before it)
  std::unique_ptr<DataServer> server_;
  std::unique_ptr<DiskTier> disk_;
  std::shared_ptr<client::MasterLocator> master_;
  std::unique_ptr<ReplicaCopier> copier_;  // stopped before the segment goes  // the master, or the HA cluster's leader
  std::atomic<bool> mounted_{false};

  std::chrono::steady_clock::time_point last_reclaim_{};  // heartbeat thread only
  // After the master refused the name as drained: no remount before this (heartbeat thread).
  static constexpr std::chrono::seconds kDrainedRetry{10};
  std::chrono::steady_clock::time_point drained_retry_at_{};
  bool refused_as_drained_ = false;  // the last Mount's answer; Start() then heartbeat thread
  mutable std::mutex mu_;  // guards stopping_
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread heartbeat_;
  // Last: destroyed first, so no handler runs once what it reads is gone.
  std::unique_ptr<HttpServer> http_;
};

}  // namespace granary::node
