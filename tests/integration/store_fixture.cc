#include "store_fixture.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>

namespace granary::it {

namespace {
constexpr Millis kNodeReadyTimeout{10'000};
}  // namespace

const std::map<std::string, std::string>& StoreMasterFlags() {
  static const std::map<std::string, std::string> flags = {
      {"--client-ttl", "2s"},
      {"--lease-ttl", "1s"},
      {"--mount-quarantine", "1s"},  // = the lease: a remount takes objects again after it
      {"--put-discard-timeout", "1s"},
      {"--put-release-timeout", "3s"},
  };
  return flags;
}

std::string UniqueName(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return prefix + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

bool WaitForLog(ChildProcess& child, const std::string& needle, Millis timeout) {
  bool found = false;
  WaitUntil(
      [&] {
        if (ReadFile(child.log_path()).find(needle) != std::string::npos) {
          found = true;
          return true;
        }
        return !child.Running();
      },
      timeout, Millis(20));
  if (!found) found = ReadFile(child.log_path()).find(needle) != std::string::npos;
  return found;
}

// ---- NodeProcess ----

NodeProcess::NodeProcess(std::string name, uint64_t segment_size, std::string log_dir)
    : name_(std::move(name)), segment_size_(segment_size), log_dir_(std::move(log_dir)) {}

NodeProcess::~NodeProcess() {
  child_.KillAndReap();
  // A SIGKILLed node leaves its segment behind; do not leave it in /dev/shm after the test.
  ::unlink(ShmPath().c_str());
}

std::string NodeProcess::AllLogs() const {
  std::string out;
  for (int i = 1; i <= launches_; ++i) {
    std::string path = log_dir_ + "/node-" + name_ + "-" + std::to_string(i) + ".log";
    out += "----- " + path + " -----\n" + ReadFile(path);
  }
  if (out.size() > 32 * 1024) out = "[...]\n" + out.substr(out.size() - 32 * 1024);
  return out;
}

::testing::AssertionResult NodeProcess::Start(const std::string& master_address,
                                              std::vector<std::string> extra_flags) {
  std::vector<std::string> args = {"--master",       master_address,
                                   "--segment-size", std::to_string(segment_size_),
                                   "--name",         name_,
                                   "--host",         "127.0.0.1",
                                   "--port",         "0",
                                   "--heartbeat-interval", "200ms",
                                   "--log-level",    "info"};
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  ++launches_;
  const std::string log = log_dir_ + "/node-" + name_ + "-" + std::to_string(launches_) + ".log";
  std::string error;
  const std::string binary = BinaryPath("granary-node");
  if (!child_.Start(binary, args, log, &error)) {
    return ::testing::AssertionFailure() << "cannot start " << binary << ": " << error;
  }
  if (!WaitForLog(child_, "granary-node ready", kNodeReadyTimeout)) {
    std::string why = child_.Running() ? "did not print its ready line within " +
                                             std::to_string(kNodeReadyTimeout.count()) + " ms"
                                       : child_.exit_status()->ToString();
    child_.KillAndReap();
    return ::testing::AssertionFailure() << "granary-node " << name_ << " " << why << "\n"
                                         << ReadFile(log);
  }
  return ::testing::AssertionSuccess();
}

// ---- StoreCluster ----

StoreCluster::StoreCluster() : dir_("granary-it-store") {}

StoreCluster::~StoreCluster() {
  // Nodes first: they would otherwise spend their last moments retrying a dead master.
  nodes_.clear();
}

::testing::AssertionResult StoreCluster::Start(
    size_t nodes, uint64_t segment_size, const std::map<std::string, std::string>& overrides) {
  std::map<std::string, std::string> flags = StoreMasterFlags();
  for (const auto& [k, v] : overrides) flags[k] = v;
  std::vector<std::string> args;
  for (const auto& [k, v] : flags) {
    args.push_back(k);
    args.push_back(v);
  }
  if (auto started = master_.Start(args); !started) return started;
  for (size_t i = 0; i < nodes; ++i) {
    if (auto added = AddNode(segment_size); !added) return added;
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult StoreCluster::AddNode(uint64_t segment_size, const std::string& name_in,
                                                std::vector<std::string> extra_flags) {
  nodes_.push_back(std::make_unique<NodeProcess>(name_in.empty() ? UniqueName("it-node") : name_in,
                                                 segment_size, dir_.path()));
  NodeProcess& n = *nodes_.back();
  if (auto started = n.Start(master_address(), std::move(extra_flags)); !started) return started;
  const std::string name = n.name();
  if (!WaitForSegments(
          [&](const std::vector<std::string>& names) {
            return std::find(names.begin(), names.end(), name) != names.end();
          },
          kNodeReadyTimeout)) {
    return ::testing::AssertionFailure() << "segment " << name << " not listed by the master\n"
                                         << n.Log() << "\n" << master_.Log();
  }
  return ::testing::AssertionSuccess();
}

void StoreCluster::KillNode(size_t i) { nodes_.at(i)->KillAndReap(); }

::testing::AssertionResult StoreCluster::RestartNode(size_t i) {
  NodeProcess& n = *nodes_.at(i);
  n.KillAndReap();
  return n.Start(master_address());
}

std::optional<std::vector<std::string>> StoreCluster::ListSegmentNames(Millis timeout) {
  // A channel of its own per call: the master may have restarted since the last one.
  auto channel = master_.NewChannel();
  auto stub = pb::Master::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  pb::ListSegmentsResponse resp;
  if (!stub->ListSegments(&ctx, pb::ListSegmentsRequest(), &resp).ok()) return std::nullopt;
  std::vector<std::string> names;
  for (const auto& s : resp.segments()) names.push_back(s.name());
  return names;
}

bool StoreCluster::WaitForSegments(
    const std::function<bool(const std::vector<std::string>&)>& predicate, Millis timeout) {
  return WaitUntil(
      [&] {
        auto names = ListSegmentNames(Millis(1000));
        return names && predicate(*names);
      },
      timeout, Millis(50));
}

bool StoreCluster::WaitForAllNodesMounted(Millis timeout) {
  return WaitForSegments(
      [&](const std::vector<std::string>& names) {
        for (const auto& n : nodes_) {
          if (std::find(names.begin(), names.end(), n->name()) == names.end()) return false;
        }
        return true;
      },
      timeout);
}

std::unique_ptr<Client> StoreCluster::MakeClient(bool use_shared_memory, ClientOptions options) {
  options.master_address = master_address();
  options.use_shared_memory = use_shared_memory;
  return ConnectTestClient(std::move(options));
}

std::unique_ptr<Client> ConnectTestClient(ClientOptions options) {
  if (options.rpc_timeout_ms == ClientOptions().rpc_timeout_ms) options.rpc_timeout_ms = 5000;
  if (options.io_timeout_ms == ClientOptions().io_timeout_ms) options.io_timeout_ms = 10'000;
  auto client = Client::Connect(options);
  if (!client.ok()) {
    ADD_FAILURE() << "Client::Connect to " << options.master_address << ": "
                  << client.status().ToString();
    return nullptr;
  }
  return std::move(*client);
}

std::string StoreCluster::Logs() const {
  std::string out = "===== granary-master =====\n" + master_.Log() + "\n";
  for (const auto& n : nodes_) out += "===== granary-node " + n->name() + " =====\n" + n->AllLogs();
  return out;
}

// ---- StoreTest ----

void StoreTest::TearDown() {
  if (HasFailure()) std::fprintf(stderr, "%s\n", cluster_.Logs().c_str());
}

}  // namespace granary::it
