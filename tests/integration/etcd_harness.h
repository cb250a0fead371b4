// tests/integration/etcd_harness.h - the real etcd server (/usr/bin/etcd) in tests: one member, a
// 3-member cluster, and a fault-injecting TCP proxy to put in front of either.
//
// Promise: servers bind 127.0.0.1 only, on ports picked free, each member in its own data
// directory (removed with it); Start and Restart return only once the member answers
// GET /health with "true" (it has a leader and can serve a read), bounded by 15 s, or fail with
// its log in the message. Every wait is bounded. A member still running at destruction is
// SIGKILLed (and dies with the test process anyway: ChildProcess).
// Ownership: EtcdServer owns its child and its directory; EtcdCluster owns its members; TcpProxy
// owns its listening socket, its connections and its thread.
// Thread safety: EtcdServer and EtcdCluster from the test's own thread; TcpProxy::SetMode and
// its getters from any thread (the proxy runs on its own).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "process_harness.h"

namespace granary::it {

inline constexpr char kEtcdBinary[] = "/usr/bin/etcd";
inline constexpr char kEtcdctlBinary[] = "/usr/bin/etcdctl";

struct EtcdOptions {
  std::string name = "etcd0";
  // Raft timing: etcd's --heartbeat-interval and --election-timeout (ms), here etcd's defaults.
  // The shortest lease etcd grants follows from them: 1.5 election timeouts rounded up to whole
  // seconds, so 50/500 grants 1 s leases where the defaults raise them to 2 s.
  int heartbeat_ms = 100;
  int election_ms = 1000;
};

class EtcdServer {
 public:
  // One member alone. Ports are picked at the first Start().
  explicit EtcdServer(EtcdOptions options = {});
  // A member of a cluster: its ports and the whole cluster's --initial-cluster are given.
  EtcdServer(EtcdOptions options, uint16_t client_port, uint16_t peer_port,
             std::string initial_cluster, std::string cluster_token);
  ~EtcdServer();
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  // Launch() and WaitHealthy().
  ::testing::AssertionResult Start();
  // Starts the process on its ports and data directory without waiting (a cluster starts its
  // members together: none is healthy before a quorum runs).
  ::testing::AssertionResult Launch();
  ::testing::AssertionResult WaitHealthy(Millis timeout = Millis(15'000));
  // SIGKILL and reap: nothing is flushed that etcd had not already made durable.
  void Kill();
  // Kill() if running, then Start() again on the same ports and data directory.
  ::testing::AssertionResult Restart();
  // SIGTERM, then the exit status (nullopt if it did not exit within `timeout`).
  std::optional<ExitStatus> Stop(Millis timeout = Millis(10'000));
  // SIGSTOP until every thread has stopped (bounded) / SIGCONT. A paused member holds its
  // connections open and answers nothing: a hung server.
  bool Pause();
  bool Resume();
  bool Running() { return child_.Running(); }

  // "127.0.0.1:PORT", the form EtcdClient::Connect takes.
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  uint16_t client_port() const { return client_port_; }
  uint16_t peer_port() const { return peer_port_; }
  const std::string& name() const { return options_.name; }
  std::string data_dir() const { return dir_.File("data"); }
  // Every log of this member so far (one file per launch), the last 64 KiB.
  std::string Log() const;

 private:
  EtcdOptions options_;
  TempDir dir_;
  ChildProcess child_;
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  std::string initial_cluster_;  // empty: this member alone
  std::string cluster_token_;
  int launches_ = 0;
};

// Three (or `members`) etcd members on loopback forming one cluster.
class EtcdCluster {
 public:
  explicit EtcdCluster(EtcdOptions options = {}, int members = 3);
  // Launches every member, then waits until each is healthy.
  ::testing::AssertionResult Start();
  EtcdServer& member(int i) { return *members_.at(static_cast<size_t>(i)); }
  int size() const { return static_cast<int>(members_.size()); }
  // "a;b;c": every member's endpoint, in member order.
  std::string endpoints() const;
  void Kill(int i) { member(i).Kill(); }
  ::testing::AssertionResult Restart(int i) { return member(i).Restart(); }
  std::string Log() const;

 private:
  std::vector<std::unique_ptr<EtcdServer>> members_;
};

// Runs `etcdctl --endpoints=<endpoints> <args...>` (bounded by 10 s); its output, or nullopt and
// a failure message when it did not exit 0.
std::optional<std::string> Etcdctl(const std::string& endpoints,
                                   const std::vector<std::string>& args, std::string* error);

// A TCP forwarder on 127.0.0.1:<free port> in front of one upstream address, run by a thread of
// the test process, that fails on command:
//   kForward   moves bytes both ways;
//   kBlackhole accepts connections but moves nothing and closes nothing, like a network
//              partition: bytes sent meanwhile wait in the kernel and flow once forwarding
//              resumes (as TCP delivers them when a partition heals);
//   kReset     closes every connection with a reset and resets each new one at once, like a
//              crashed or unreachable host.
// Promise: SetMode returns once the proxy's thread has applied the mode (bounded: 2 s); each
// turn of its loop waits at most 50 ms, and Stop() (or the destructor) joins it.
class TcpProxy {
 public:
  enum class Mode { kForward, kBlackhole, kReset };

  // upstream: "127.0.0.1:PORT" (an IPv4 address and a port).
  explicit TcpProxy(std::string upstream);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  // Binds the listening port and starts the thread; false (and *error) when it cannot.
  bool Start(std::string* error);
  void Stop();
  // False when the thread did not apply the mode within 2 s (it is stopped or stuck).
  bool SetMode(Mode mode);

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  uint16_t port() const { return port_; }
  // Connections open now, and accepted since Start (reset ones included).
  size_t open_connections() const { return open_.load(); }
  uint64_t accepted() const { return accepted_.load(); }

 private:
  struct Link;
  void Run();
  void Wake();

  std::string upstream_host_;
  uint16_t upstream_port_ = 0;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: SetMode and Stop cut the loop's poll short
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> open_{0};
  std::atomic<uint64_t> accepted_{0};

  std::mutex mu_;  // guards mode_, wanted_ and applied_
  std::condition_variable applied_cv_;
  Mode mode_ = Mode::kForward;
  uint64_t wanted_ = 0;   // bumped by each SetMode
  uint64_t applied_ = 0;  // the last generation the thread applied
};

}  // namespace granary::it
