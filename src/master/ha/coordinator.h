// master/ha/coordinator.h - one master's part in an HA cluster: its membership and lease in etcd,
// the election, the switch between standby and leader, which standby is synchronous, and the
// gate every call passes (service/serving_gate.h).
//
// Promise (docs/ha.md says why each holds):
// 1. At most one master serves at any moment. A leader serves only while its lease is fresh by
//    its own steady clock: until the start of its last successful renewal plus the TTL etcd
//    granted, minus lease_margin; etcd cannot expire the lease before that start plus the TTL.
//    A standby campaigns only once the leader key is gone, i.e. after etcd expired or revoked
//    the old leader's lease.
// 2. No acknowledged operation is lost by a failover. With sync_standbys = 1, a reply that
//    changes the state is sent only after the synchronous standby holds its operation, and
//    etcd's sync key names that standby before any reply waits on it; only the master named there
//    may take over with its state (a campaign guarded by that key). A leader switches to another
//    synchronous standby only once that one has every operation a reply was released for.
// 3. If the master named by the sync key is gone (its member key expired), any master may take
//    over, but starts from an empty state, as a restarted master would (nodes remount; disk
//    copies re-register): the memory tier is lost, nothing is read wrong.
// 4. A leader that loses its lease, its leader key or etcd steps down: it refuses every call from
//    then on, waits for the calls in flight, and follows the new leader as a standby (from a
//    snapshot when its history went further than the new leader's).
// 5. The leader record says serving only once this master answers calls (and, with
//    sync_standbys = 1, has a synchronous standby): clients never find an address that does not
//    answer yet.
// Ownership: borrows the state (the server's); owns the etcd client, the log, the standby set,
//    the stream server, the follower and its threads.
// Thread safety: Enter/Exit/Commit/term from any thread (every call); Start/Stop from the
//    server's thread; the rest from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/metrics.h"
#include "etcd/cluster_keys.h"
#include "etcd/etcd_client.h"
#include "granary/proto/master.pb.h"
#include "master/ha/replication_log.h"
#include "master/ha/standby_follower.h"
#include "master/ha/standby_set.h"
#include "master/ha/stream_server.h"
#include "master/service/serving_gate.h"
#include "master/state/master_state.h"
#include "security/tls.h"

namespace granary::master::ha {

struct HaOptions {
  std::string etcd_endpoints;  // "h1:p1;h2:p2"
  std::string cluster_id = etcd::kDefaultClusterId;
  std::string advertise;       // this master's gRPC address as others reach it
  uint16_t fast_port = 0;      // this master's fast port (the history stream rides it)
  std::string fast_local;      // its local socket's name (FastServer::local_name), or empty
  uint16_t http_port = 0;
  uint32_t sync_standbys = 1;  // 1: replies wait for the synchronous standby; 0: asynchronous
  // With sync_standbys = 1 and no synchronous standby to be had for standby_timeout: serve
  // alone (asynchronously, able to lose the last operations) instead of refusing changes.
  bool allow_serving_alone = false;
  // A leader that starts the cluster over (an empty state) makes writes wait out the cache
  // leases earlier leaders granted (MasterState::AssumeEarlierCacheLeases).
  bool restart_settle = true;
  std::chrono::milliseconds leader_lease{2000};   // asked of etcd (it may grant more)
  std::chrono::milliseconds lease_margin{500};    // stop serving this long before etcd could expire it
  std::chrono::milliseconds sync_timeout{3000};   // a reply waits this long for its standby
  std::chrono::milliseconds standby_timeout{1000};
  std::chrono::milliseconds tick{50};             // the coordinator's pace when nothing happens
  size_t log_bytes = 256 << 20;                   // history kept for standbys that reconnect
  int etcd_timeout_ms = 1000;
  std::string secret;  // the cluster's: a standby presents it to the leader (empty: none)
  std::shared_ptr<const security::TlsContext> tls;  // a standby's TLS to the leader (null: none)
  etcd::EtcdCredentials etcd_credentials;  // etcd's user (empty: etcd without auth)
};

class Coordinator final : public ServingGate {
 public:
  enum class Role { kStandby, kLeader };

  Coordinator(MasterState* state, HaOptions options, MetricsRegistry* metrics);
  ~Coordinator() override;
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Where this master is reached; before Start (the ports are known once they listen).
  void SetEndpoints(std::string advertise, uint16_t fast_port, uint16_t http_port,
                    std::string fast_local = "");
  // Connects to etcd, registers this master and starts its threads. INVALID_PARAMS for bad
  // endpoints; an etcd that does not answer is retried in the background (the master then
  // serves nothing until it does).
  Status Start();
  // Leaves the cluster: a leader steps down and revokes its lease (a standby takes over at once).
  void Stop();

  // ServingGate.
  Status Enter(bool update) override;
  void Exit() override;
  Status Commit(uint64_t seq) override;
  uint64_t term() const override { return term_.load(); }

  // The fast server's kReplicate handler.
  StreamServer& streams() { return *streams_; }
  // Feeds the history log: the state's observer calls it for every applied operation.
  void Record(const Operation& op);
  bool leading() const { return serving_.load(); }
  Role role() const;
  const std::string& member_id() const { return member_id_; }
  // The "ha" part of /status: role, term, leader, standbys and their lag.
  nlohmann::json StatusJson() const;
  void FillClusterStatus(proto::ClusterStatusResponse* out) const;

 private:
  void KeepAliveLoop();
  void MainLoop();
  void Reconcile();
  void ReconcileStandby();
  void ReconcileLeader();
  bool Campaign();
  void Promote(uint64_t term, bool fresh);
  void StepDown(const std::string& why);
  void ManageSync();
  bool DesignateSync(const std::string& id, bool required);
  bool PublishServing();
  bool LeaseFresh() const;
  void Poke();
  void RegisterMetrics(MetricsRegistry* metrics);

  MasterState* state_;
  HaOptions options_;  // its endpoints are set before Start, then read-only
  std::string member_id_;
  std::unique_ptr<etcd::EtcdClient> etcd_;
  ReplicationLog log_;
  StandbySet standbys_;
  std::unique_ptr<StreamServer> streams_;
  std::unique_ptr<StandbyFollower> follower_;

  // The gate's fast state: read by every call.
  std::atomic<bool> serving_{false};
  std::atomic<int64_t> inflight_{0};
  std::atomic<int64_t> lease_until_ns_{0};  // steady clock: serve until then
  std::atomic<uint64_t> term_{0};

  mutable std::mutex mu_;  // the coordinator's slow state, below
  std::condition_variable wake_;
  bool stopping_ = false;
  bool poke_ = false;  // something changed (watch event, lease news): reconcile now
  Role role_ = Role::kStandby;
  int64_t lease_id_ = 0;         // 0: not registered (no lease)
  int64_t term_lease_ = 0;       // while leading: the lease the term was won under
  bool lease_lost_ = false;      // etcd no longer knows lease_id_
  Lineage lineage_;              // while leading
  bool published_serving_ = false;
  bool serving_alone_ = false;
  std::chrono::steady_clock::time_point sync_missing_since_{};
  std::chrono::steady_clock::time_point next_rejoin_{};  // serving alone: try a standby again then
  etcd::LeaderRecord leader_seen_;  // the last leader record read (standby's view)
  std::string last_step_down_;
  std::unique_ptr<etcd::Watch> watch_;  // main loop only
  std::atomic<bool> watch_broken_{false};
  std::thread keepalive_;
  std::thread main_;

  Counter* elections_won_ = nullptr;
  Counter* step_downs_ = nullptr;
  Counter* sync_changes_ = nullptr;
  Counter* fresh_starts_ = nullptr;
};

}  // namespace granary::master::ha
