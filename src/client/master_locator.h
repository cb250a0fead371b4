// client/master_locator.h - which master a client or node talks to: a fixed "host:port", or the
// serving leader of an HA cluster that etcd names ("etcd://h1:p1;h2:p2", Mooncake's form).
//
// Promise: Current() is the master to call now. For an etcd address it is the leader whose
// record says serving (etcd/cluster_keys.h), looked up at the first call and again after a call
// found no master there or was refused as "not the leader" (Refresh); a lookup waits for a
// serving leader (a failover) up to its deadline and then fails with RPC_FAIL, never hangs.
// Each target has its own gRPC channel; a new leader is a new target (its generation differs),
// so nothing keeps talking to a master that stepped down. NoteTerm() refuses a reply from a
// lower term than one already seen (a deposed leader's), so one client never mixes two leaders'
// answers. A fixed address is one target forever, and its master's replies carry term 0 unless
// it runs in HA mode.
// Call() is the unary gRPC call with that policy: a refusal (nothing applied) is retried on the
// next leader until the deadline, and so is a call that failed in a way that leaves its outcome
// unknown (unreachable, timed out, answered by a deposed leader) if it is idempotent; any such
// failure makes the next call look the leader up again.
// Ownership: owns its etcd client and the targets' channels (shared with the callers holding a
// Target).
// Thread safety: every method from any thread; one lookup runs at a time, others wait for it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "etcd/etcd_client.h"
#include "granary/proto/master.grpc.pb.h"
#include "granary/status.h"
#include "proto/rpc_util.h"
#include "security/tls.h"

namespace granary::client {

class MasterLocator {
 public:
  using SteadyTime = std::chrono::steady_clock::time_point;
  struct Target {
    std::string address;  // gRPC "host:port"
    std::shared_ptr<proto::Master::Stub> stub;
    uint64_t term = 0;         // the leader's (0: a fixed address)
    uint16_t fast_port = 0;    // from the leader record (0: ask the master)
    std::string fast_local;    // from the leader record: its fast port's local socket, or empty
    uint64_t generation = 0;   // a new one for every new target
  };

  // cluster_id: used with an etcd address (empty: $GRANARY_CLUSTER_ID, else "granary").
  // own_connection: this locator's channels share no TCP connection with other channels to the
  // same master (a benchmark thread each).
  // secret: the cluster's (security/secret.h), presented on every call of every channel and by
  // the fast port's connections (MasterLink); empty: none.
  // etcd_credentials: etcd's user, for an etcd address whose etcd has auth enabled.
  // tls: the client's TLS context (security/tls.h) for every channel and fast connection; null:
  // plain TCP.
  static Result<std::shared_ptr<MasterLocator>> Create(
      const std::string& address, const std::string& cluster_id = "", int timeout_ms = 10'000,
      bool own_connection = false, const std::string& secret = "",
      std::shared_ptr<const security::TlsContext> tls = nullptr,
      const etcd::EtcdCredentials& etcd_credentials = {});
  ~MasterLocator();

  // The master to call; null (and *why) when none could be found by the deadline.
  std::shared_ptr<const Target> Current(SteadyTime deadline, Status* why = nullptr);
  std::shared_ptr<const Target> Current() {
    return Current(std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_));
  }
  // A call to target `generation` found no master there or was refused as not the leader: the
  // next Current() looks again (only the first report per target counts).
  void Stale(uint64_t generation);
  // Whether a reply of `term` may be used (false: a lower term than one seen).
  bool NoteTerm(uint64_t term);

  template <typename Req, typename Resp>
  using GrpcMethod = grpc::Status (proto::Master::Stub::*)(grpc::ClientContext*, const Req&, Resp*);
  template <typename Req, typename Resp>
  Status Call(GrpcMethod<Req, Resp> method, const Req& req, Resp* resp, const char* what,
              bool idempotent, int timeout_ms = 0);

  bool follows_etcd() const { return etcd_ != nullptr; }
  const std::string& address() const { return address_; }
  const std::string& cluster_id() const { return cluster_id_; }
  int timeout_ms() const { return timeout_ms_; }
  const std::string& secret() const { return secret_; }
  const std::shared_ptr<const security::TlsContext>& tls() const { return tls_; }
  const etcd::EtcdCredentials& etcd_credentials() const { return etcd_credentials_; }
  // Targets looked up so far (for tests and stats).
  uint64_t lookups() const { return lookups_.load(); }

 private:
  MasterLocator(std::string address, std::string cluster_id, int timeout_ms, bool own_connection,
                std::string secret, std::shared_ptr<const security::TlsContext> tls);
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address) const;
  // Reads the leader record; waits (polling) for a serving one until the deadline.
  Result<std::shared_ptr<const Target>> LookUp(SteadyTime deadline);

  const std::string address_;
  const std::string cluster_id_;
  const int timeout_ms_;
  const bool own_connection_;
  const std::string secret_;
  const std::shared_ptr<const security::TlsContext> tls_;
  etcd::EtcdCredentials etcd_credentials_;
  std::unique_ptr<etcd::EtcdClient> etcd_;  // null: a fixed address
  std::mutex mu_;
  std::condition_variable looked_up_;
  std::shared_ptr<const Target> current_;
  bool stale_ = false;
  bool looking_ = false;
  uint64_t next_generation_ = 1;
  std::atomic<uint64_t> max_term_{0};
  std::atomic<uint64_t> lookups_{0};
};

// ---- template implementation ----

template <typename Req, typename Resp>
Status MasterLocator::Call(GrpcMethod<Req, Resp> method, const Req& req, Resp* resp,
                           const char* what, bool idempotent, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : timeout_ms_);
  Status last(ErrorCode::RPC_FAIL, std::string(what) + ": no master");
  for (int attempt = 0;; ++attempt) {  // bounded by the deadline
    Status why;
    auto target = Current(deadline, &why);
    if (!target) return attempt == 0 ? why : last;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     (deadline - std::chrono::steady_clock::now()));
    resp->Clear();
    const grpc::Status g = (target->stub.get()->*method)(&ctx, req, resp);
    Status s = rpc::FromGrpc(g, what);
    if (s.ok()) {
      if constexpr (requires { resp->term(); }) {
        if (!NoteTerm(resp->term())) {
          // A deposed leader applied it: the outcome is unknown (its successor may have it).
          Stale(target->generation);
          s = Status(ErrorCode::RPC_FAIL,
                     std::string(what) + ": answered by a deposed leader; outcome unknown");
        }
      }
      if (s.ok()) return s;
    }
    last = s;
    // Refused (nothing applied): the next leader may take it. Unreachable, timed out or deposed:
    // the next leader may take it only if it may run twice. A fixed address has no next leader,
    // only one more try for an idempotent call (a dropped connection).
    const bool refused = s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_MODE;
    const bool busy = s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
    const bool unreachable = g.error_code() == grpc::StatusCode::UNAVAILABLE;
    const bool uncertain = unreachable || s.code() == ErrorCode::RPC_TIMEOUT ||
                           s.code() == ErrorCode::RPC_FAIL;
    if (refused || uncertain) Stale(target->generation);
    const bool retry = (refused && follows_etcd()) || busy ||
                       (uncertain && idempotent && (follows_etcd() || attempt == 0));
    if (!retry || std::chrono::steady_clock::now() >= deadline) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(busy ? 50 : 10));
  }
}

}  // namespace granary::client
