// tests/integration/store_fixture.h - a whole Granary store in child processes: one granary-master
// and N granary-node processes, plus Clients (the real client library) talking to them.
//
// Promise: StoreCluster::Start() returns only once the master serves and every node printed
// "granary-node ready" and shows in ListSegments (each wait bounded: 10 s), or fails with the
// logs in the message. Kill/restart helpers never wait unboundedly. Nodes get names unique to
// this test process (so concurrent test runs on one host do not share /dev/shm names) and bind
// 127.0.0.1 only. The master runs with short TTLs (kStoreMasterFlags) so expiry paths take
// seconds; a test may override any of them.
// Ownership: StoreCluster owns the master and node processes (SIGKILLed on destruction) and a
// temp dir for the node logs. Clients made by MakeClient are the caller's.
// Thread safety: none; drive a cluster from the test's thread (Clients themselves are
// thread-safe).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "granary/client.h"
#include "master_fixture.h"
#include "process_harness.h"

namespace granary::it {

// Master flags of every store test: short TTLs so expiry is observable within seconds.
//   --client-ttl 2s --lease-ttl 1s --put-discard-timeout 1s --put-release-timeout 3s
const std::map<std::string, std::string>& StoreMasterFlags();

// One granary-node child process.
class NodeProcess {
 public:
  NodeProcess(std::string name, uint64_t segment_size, std::string log_dir);
  ~NodeProcess();
  NodeProcess(const NodeProcess&) = delete;
  NodeProcess& operator=(const NodeProcess&) = delete;

  // Starts granary-node --master <master> --segment-size <size> --name <name> --host 127.0.0.1
  // --port 0 --heartbeat-interval 200ms <extra> and waits (bounded) for its ready line.
  ::testing::AssertionResult Start(const std::string& master_address,
                                   std::vector<std::string> extra_flags = {});
  // Sends sig; false if it was not running.
  bool Kill(int sig) { return child_.Kill(sig); }
  std::optional<ExitStatus> Wait(Millis timeout) { return child_.Wait(timeout); }
  bool WaitStopped(Millis timeout) { return child_.WaitStopped(timeout); }  // after SIGSTOP
  void KillAndReap() { child_.KillAndReap(); }
  bool Running() { return child_.Running(); }

  const std::string& name() const { return name_; }
  uint64_t segment_size() const { return segment_size_; }
  // /dev/shm/granary-<name>
  std::string ShmPath() const { return "/dev/shm/granary-" + name_; }
  // The log of the current (last) launch, and of all launches.
  std::string Log() const { return child_.LogContents(); }
  std::string AllLogs() const;
  ChildProcess& process() { return child_; }

 private:
  std::string name_;
  uint64_t segment_size_;
  std::string log_dir_;
  int launches_ = 0;
  ChildProcess child_;
};

// Waits (bounded) until `child`'s log contains `needle`; false if it did not, or if the child
// exited first.
bool WaitForLog(ChildProcess& child, const std::string& needle, Millis timeout);

// Client::Connect with the test timeouts (rpc 5 s, io 10 s, where the options keep the defaults);
// null and a test failure if it cannot connect.
std::unique_ptr<Client> ConnectTestClient(ClientOptions options);

// A name unique to this test process: "<prefix>-<pid>-<counter>".
std::string UniqueName(const std::string& prefix);

class StoreCluster {
 public:
  StoreCluster();
  ~StoreCluster();

  // Starts the master (StoreMasterFlags, with `master_overrides` replacing or adding flags, e.g.
  // {"--lease-ttl", "3s"}) and `nodes` nodes of `segment_size` bytes each.
  ::testing::AssertionResult Start(size_t nodes, uint64_t segment_size,
                                   const std::map<std::string, std::string>& master_overrides = {});
  // Adds one more node (started and visible in ListSegments), named `name` or a unique name,
  // with `extra_flags` after the usual ones (NodeProcess::Start).
  ::testing::AssertionResult AddNode(uint64_t segment_size, const std::string& name = "",
                                     std::vector<std::string> extra_flags = {});

  MasterProcess& master() { return master_; }
  std::string master_address() const { return master_.address(); }
  NodeProcess& node(size_t i) { return *nodes_.at(i); }
  size_t node_count() const { return nodes_.size(); }

  // SIGKILL node i (no unmount; its shm stays behind, as after a crash).
  void KillNode(size_t i);
  // Starts node i again under the same name (after a kill or a stop).
  ::testing::AssertionResult RestartNode(size_t i);
  // SIGKILL the master and start it again on the same ports with the same flags.
  ::testing::AssertionResult RestartMaster() { return master_.Restart(); }

  // Segment names the master lists now; nullopt if it did not answer within `timeout`.
  std::optional<std::vector<std::string>> ListSegmentNames(Millis timeout = Millis(3000));
  // Polls ListSegmentNames until `predicate` holds (bounded).
  bool WaitForSegments(const std::function<bool(const std::vector<std::string>&)>& predicate,
                       Millis timeout);
  // Every node's segment listed (bounded).
  bool WaitForAllNodesMounted(Millis timeout);

  // A Client of this store. Timeouts are short (rpc 5 s, io 10 s) so nothing hangs a test.
  std::unique_ptr<Client> MakeClient(bool use_shared_memory, ClientOptions options = {});

  // Master and node logs, for failure messages.
  std::string Logs() const;

 private:
  TempDir dir_;
  MasterProcess master_;
  std::vector<std::unique_ptr<NodeProcess>> nodes_;
};

// Base of the store suites: a StoreCluster (not started) whose logs print when a test failed.
class StoreTest : public ::testing::Test {
 protected:
  void TearDown() override;
  StoreCluster cluster_;
};

}  // namespace granary::it
