// tests/integration/ha_fixture.h - an HA Granary store in child processes: a real etcd, several
// granary-master processes of one cluster (--etcd), granary-node processes and clients that find
// the leader through etcd (etcd://...).
//
// Promise: HaCluster::Start() returns once one master leads and serves (its /status says
// "leader") and every node is mounted, each wait bounded, or fails with the logs. Masters run
// with short timeouts (kHaMasterFlags; etcd's election timeout is 500 ms, so leases are 1 s), so a
// failover takes about a second. Each master can be put behind its own TcpProxy to etcd, to cut
// it off from etcd alone. Every helper's wait is bounded.
// Ownership: HaCluster owns etcd, the proxies, the masters and the nodes (killed on destruction).
// Thread safety: drive it from the test's thread; Status() and LeaderIndex() also from others.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "etcd_harness.h"
#include "granary/client.h"
#include "master_fixture.h"
#include "process_harness.h"
#include "store_fixture.h"

namespace granary::it {

// Flags of every HA test master (besides --etcd, --cluster-id and the ports).
const std::vector<std::string>& HaMasterFlags();

class HaCluster {
 public:
  // etcd_members: 1 (an EtcdServer) or more (an EtcdCluster on loopback).
  explicit HaCluster(std::string cluster_id = "", int etcd_members = 1);
  ~HaCluster();

  // etcd, then `masters` masters (each with `extra_flags`, and behind its own proxy to etcd when
  // `proxied`), then waits for a serving leader; then `nodes` nodes of `segment_size` bytes.
  ::testing::AssertionResult Start(int masters, size_t nodes, uint64_t segment_size,
                                   std::vector<std::string> extra_flags = {},
                                   bool proxied = false);
  // Runs after etcd is up and before any master starts (e.g. etcdctl's `auth enable`).
  void set_etcd_setup(std::function<::testing::AssertionResult(const std::string& endpoints)> f) {
    etcd_setup_ = std::move(f);
  }
  // One more master of the cluster (started, not waited for as a leader).
  ::testing::AssertionResult AddMaster(std::vector<std::string> extra_flags = {});
  ::testing::AssertionResult AddNode(uint64_t segment_size, std::vector<std::string> extra = {});

  // "etcd://127.0.0.1:P[;...]": what nodes and clients are given.
  std::string address() const { return "etcd://" + endpoints(); }
  std::string endpoints() const;
  const std::string& cluster_id() const { return cluster_id_; }
  EtcdServer& etcd() { return single_ ? *single_ : members_->member(0); }
  EtcdCluster& etcd_cluster() { return *members_; }
  MasterProcess& master(int i) { return *masters_.at(static_cast<size_t>(i)); }
  int master_count() const { return static_cast<int>(masters_.size()); }
  TcpProxy& proxy(int i) { return *proxies_.at(static_cast<size_t>(i)); }
  NodeProcess& node(size_t i) { return *nodes_.at(i); }
  size_t node_count() const { return nodes_.size(); }

  // Master i's /status "ha" object; nullopt if it did not answer within `timeout`.
  std::optional<nlohmann::json> Status(int i, Millis timeout = Millis(1000));
  // The master whose /status says it serves as the leader (-1: none answers so).
  int LeaderIndex();
  // Waits (bounded) for a serving leader other than `not_this` (-1: any); its index or -1.
  int WaitForLeader(Millis timeout, int not_this = -1);
  // Waits until master i's role is `role` ("leader", "standby").
  bool WaitForRole(int i, const std::string& role, Millis timeout);
  // Waits until every running standby has acknowledged the leader's last operation.
  bool WaitForStandbysCaughtUp(Millis timeout);
  // SIGKILL master i and start it again (new process, same ports, same flags).
  ::testing::AssertionResult RestartMaster(int i);
  // SIGKILL node i / start it again under the same name (as StoreCluster's).
  void KillNode(size_t i) { nodes_.at(i)->KillAndReap(); }
  ::testing::AssertionResult RestartNode(size_t i);
  // Every node's segment listed by the leader (bounded).
  bool WaitForAllNodesMounted(Millis timeout);

  // A client that follows the leader through etcd. rpc 5 s, io 10 s.
  std::unique_ptr<Client> MakeClient(bool use_shared_memory = false, ClientOptions options = {});
  std::string Logs();

 private:
  std::string cluster_id_;
  std::function<::testing::AssertionResult(const std::string&)> etcd_setup_;
  std::unique_ptr<EtcdServer> single_;    // one member, or
  std::unique_ptr<EtcdCluster> members_;  // several
  TempDir dir_;
  std::vector<std::unique_ptr<TcpProxy>> proxies_;
  std::vector<std::unique_ptr<MasterProcess>> masters_;
  std::vector<std::unique_ptr<NodeProcess>> nodes_;
};

// Base of the HA suites: prints every log when a test failed.
class HaTest : public ::testing::Test {
 protected:
  void TearDown() override;
  HaCluster cluster_;
};

}  // namespace granary::it
