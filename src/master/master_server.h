// master/master_server.h - a running master: gRPC API, HTTP (/metrics, /health, /status) and the
// housekeeping thread (eviction above the watermark, dead-client expiry, put and lease timeouts).
//
// Promise: Start() returns once both ports listen (or says why not); Shutdown() stops everything
// and may be called from any thread, including a signal-watching one; the destructor calls it.
// With --etcd (HA), every call passes the coordinator's gate (only the leader serves) and the
// housekeeping runs only while this master leads; Shutdown() first hands leadership over.
// Used by granary-master and, in one process with a node, by `granary-node --standalone`.
// Ownership: owns the state, the services and their threads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "master/policy/evictor.h"
#include "master/service/fast_server.h"
#include "master/ha/coordinator.h"
#include "master/history/history_file.h"
#include "master/master_config.h"
#include "master/service/master_service.h"
#include "master/state/master_state.h"
#include "security/authenticator.h"

namespace granary::master {

class MasterServer {
 public:
  explicit MasterServer(MasterConfig config, const Clock* clock = WallClock::Instance());
  ~MasterServer();
  MasterServer(const MasterServer&) = delete;
  MasterServer& operator=(const MasterServer&) = delete;

  Status Start();
  // Blocks until Shutdown().
  void Wait();
  void Shutdown();

  uint16_t grpc_port() const { return grpc_port_; }
  uint16_t http_port() const { return http_.port(); }
  uint16_t fast_port() const { return fast_ ? fast_->port() : 0; }  // 0: fast path off
  MasterState& state() { return *state_; }
  // HA (--etcd): this master's part in the cluster; null when it runs alone.
  ha::Coordinator* coordinator() { return coordinator_.get(); }
  // The /status document (JSON).
  std::string StatusJson() const;

 private:
  void HousekeepingLoop();
  void RegisterMetrics();
  void RegisterTenantMetrics();  // after Start() made auth_

  MasterConfig config_;
  const Clock* clock_;
  std::unique_ptr<MasterState> state_;
  std::unique_ptr<Evictor> evictor_;
  MetricsRegistry metrics_;
  std::unique_ptr<security::Authenticator> auth_;  // made by Start(); before service_ dies
  std::unique_ptr<MasterService> service_;
  std::unique_ptr<HistoryFile> history_;
  std::unique_ptr<ha::Coordinator> coordinator_;
  std::unique_ptr<grpc::Server> grpc_;
  // Lives and dies with grpc_: a master that serves gRPC serves the fast port, and no other.
  std::unique_ptr<FastServer> fast_;
  HttpServer http_;
  uint16_t grpc_port_ = 0;

  std::mutex shutdown_mu_;  // held for the whole of Shutdown, so a second caller waits for it
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool started_ = false;
  std::thread housekeeping_;

  Counter* evicted_objects_ = nullptr;
  Counter* evicted_bytes_ = nullptr;
  Counter* eviction_runs_ = nullptr;
  Counter* watermark_evictions_ = nullptr;  // granary_master_evictions_total{reason="watermark"}
  Counter* expired_clients_ = nullptr;
  Counter* discarded_puts_ = nullptr;
};

}  // namespace granary::master
