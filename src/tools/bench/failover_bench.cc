// granary-bench failover: how long a killed leader takes to be replaced, and what survives it.
// Starts `masters` HA masters (against an etcd the caller runs) and one node, then `kills` times:
// puts a round of objects (acknowledged), kill -9s the leader, and times the kill to the first
// put that succeeds again (through the client, which finds the new leader in etcd); then reads
// the round's objects back (byte-exact or not counted), and restarts the killed master as a
// standby before the next round. --full fills the node's segment first, so every put after a
// failover needs an eviction (the full-cache case); without it, each round's objects are
// removed after their check, so the cache stays empty.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "granary/client.h"
#include "tools/bench/bench.h"

namespace granary::bench {

namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// One child process, killed (SIGKILL) with us or when Kill() is called.
struct Child {
  std::vector<std::string> args;
  std::string log;
  pid_t pid = -1;

  bool Start() {
    pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    return true;
  }
  void Kill() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

uint16_t FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::vector<std::byte> Value(uint64_t seed, size_t size) {
  std::vector<std::byte> v(size);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 8 <= size; i += 8) {
    const uint64_t r = rng();
    std::memcpy(v.data() + i, &r, 8);
  }
  return v;
}

bool WaitFor(const std::function<bool()>& done, milliseconds timeout) {
  const auto end = SteadyClock::now() + timeout;
  while (SteadyClock::now() < end) {  // bounded by the timeout
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return done();
}

}  // namespace

int RunFailoverBench(const FailoverBenchOptions& o) {
  const std::string dir = "/tmp/granary-bench-failover-" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0755);
  std::vector<Child> masters(static_cast<size_t>(o.masters));
  std::vector<uint16_t> grpc_ports;
  for (int i = 0; i < o.masters; ++i) {
    const uint16_t port = FreePort();
    grpc_ports.push_back(port);
    Child& m = masters[static_cast<size_t>(i)];
    m.args = {o.bin_dir + "/granary-master", "--host", "127.0.0.1", "--port",
              std::to_string(port), "--http-port", std::to_string(FreePort()), "--fast-port", "0",
              "--etcd", o.etcd, "--cluster-id", o.cluster_id, "--log-level", "warn"};
    m.args.insert(m.args.end(), o.master_flags.begin(), o.master_flags.end());
    m.log = dir + "/master-" + std::to_string(i) + ".log";
    if (!m.Start()) {
      std::fprintf(stderr, "failover: cannot start %s\n", m.args[0].c_str());
      return 1;
    }
  }
  const std::string address = "etcd://" + o.etcd;
  Child node;
  node.args = {o.bin_dir + "/granary-node", "--master", address, "--cluster-id", o.cluster_id,
               "--segment-size", std::to_string(o.segment_size), "--host", "127.0.0.1",
               "--name", "bench-failover-" + std::to_string(::getpid()), "--log-level", "warn"};
  node.log = dir + "/node.log";
  node.Start();
  struct Cleanup {
    std::vector<Child>* masters;
    Child* node;
    ~Cleanup() {
      node->Kill();
      for (auto& m : *masters) m.Kill();
    }
  } cleanup{&masters, &node};

  ClientOptions co;
  co.master_address = address;
  co.cluster_id = o.cluster_id;
  co.rpc_timeout_ms = 5000;
  co.use_shared_memory = false;
  auto connected = Client::Connect(co);
  if (!connected.ok()) {
    std::fprintf(stderr, "failover: %s\n", connected.status().ToString().c_str());
    return 1;
  }
  Client& client = **connected;
  auto standbys_caught_up = [&] {
    auto c = client.Cluster();
    if (!c.ok()) return false;
    int ready = 0;
    for (const auto& s : c->standbys) ready += s.connected && s.lag == 0;
    return ready >= o.masters - 1;
  };
  auto segments_up = [&] {
    auto s = client.ListSegments();
    return s.ok() && !s->empty();
  };
  if (!WaitFor(segments_up, milliseconds(20'000)) ||
      !WaitFor(standbys_caught_up, milliseconds(20'000))) {
    std::fprintf(stderr, "failover: the cluster did not come up (logs in %s)\n", dir.c_str());
    return 1;
  }
  uint64_t next = 1;
  if (o.full) {
    // Past the eviction watermark: from here on every put evicts something.
    const uint64_t count = o.segment_size / o.object_size * 5 / 4;
    for (uint64_t i = 0; i < count; ++i, ++next) {
      (void)client.Put("fill-" + std::to_string(next), Value(next, o.object_size));
    }
  }
  std::printf("failover: %d masters, %d kills, %s cache, rounds of %d objects of %llu bytes\n",
              o.masters, o.kills, o.full ? "a full" : "an empty", o.objects_per_round,
              static_cast<unsigned long long>(o.object_size));
  std::vector<double> took_ms;
  uint64_t acked_total = 0, readable_total = 0, wrong = 0;
  nlohmann::json rounds = nlohmann::json::array();
  for (int round = 0; round < o.kills; ++round) {
    std::vector<std::pair<std::string, uint64_t>> acked;
    for (int i = 0; i < o.objects_per_round; ++i, ++next) {
      const std::string key = "r" + std::to_string(round) + "-" + std::to_string(next);
      if (client.Put(key, Value(next, o.object_size)).ok()) acked.emplace_back(key, next);
    }
    auto cluster = client.Cluster();
    if (!cluster.ok()) {
      std::fprintf(stderr, "failover: no cluster status: %s\n",
                   cluster.status().ToString().c_str());
      return 1;
    }
    const uint16_t leader_port = static_cast<uint16_t>(
        std::stoi(cluster->leader_address.substr(cluster->leader_address.rfind(':') + 1)));
    const auto it = std::find(grpc_ports.begin(), grpc_ports.end(), leader_port);
    if (it == grpc_ports.end()) return 1;
    Child& leader = masters[static_cast<size_t>(it - grpc_ports.begin())];
    const auto killed = SteadyClock::now();
    leader.Kill();
    Status put;
    for (int attempt = 0; attempt < 50; ++attempt, ++next) {  // bounded: 50 puts of 5 s at most
      put = client.Put("after-" + std::to_string(next), Value(next, o.object_size));
      if (put.ok()) break;
    }
    const double ms =
        std::chrono::duration<double, std::milli>(SteadyClock::now() - killed).count();
    uint64_t readable = 0;
    std::vector<std::string> round_keys;
    for (const auto& [key, seed] : acked) {
      std::vector<std::byte> got(o.object_size);
      auto r = client.GetInto(key, got);
      readable += r.ok() && got == Value(seed, o.object_size);
      wrong += r.ok() && got != Value(seed, o.object_size);
      round_keys.push_back(key);
    }
    // An empty cache stays empty: eviction would otherwise take some of the next rounds' objects
    // (losing a cached object is allowed, but then this count would not say what it should).
    if (!o.full) (void)client.BatchRemove(round_keys);
    took_ms.push_back(put.ok() ? ms : -1);
    acked_total += acked.size();
    readable_total += readable;
    std::printf("  round %2d: kill -9 to first put %7.0f ms%s; %llu/%zu acknowledged objects "
                "read back exact\n",
                round + 1, ms, put.ok() ? "" : " (no put succeeded)",
                static_cast<unsigned long long>(readable), acked.size());
    rounds.push_back({{"failover_ms", put.ok() ? ms : -1},
                      {"acknowledged", acked.size()},
                      {"readable", readable}});
    leader.Start();  // the same ports: it comes back as a standby
    if (!WaitFor(standbys_caught_up, milliseconds(20'000))) {
      std::fprintf(stderr, "failover: the restarted master did not catch up (logs in %s)\n",
                   dir.c_str());
      return 1;
    }
  }
  std::vector<double> sorted = took_ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted.empty() ? 0 : sorted[sorted.size() / 2];
  const double worst = sorted.empty() ? 0 : sorted.back();
  std::printf("failover (kill -9 to first successful put): median %.0f ms, max %.0f ms over %zu "
              "kills; acknowledged objects readable: %llu/%llu; wrong reads: %llu\n",
              median, worst, sorted.size(), static_cast<unsigned long long>(readable_total),
              static_cast<unsigned long long>(acked_total), static_cast<unsigned long long>(wrong));
  if (!o.json_path.empty()) {
    nlohmann::json doc;
    doc["masters"] = o.masters;
    doc["kills"] = o.kills;
    doc["full"] = o.full;
    doc["object_size"] = o.object_size;
    doc["median_ms"] = median;
    doc["max_ms"] = worst;
    doc["acknowledged"] = acked_total;
    doc["readable"] = readable_total;
    doc["wrong"] = wrong;
    doc["rounds"] = rounds;
    doc["master_flags"] = o.master_flags;
    std::ofstream(o.json_path) << doc.dump(2) << "\n";
  }
  const bool any_failed = std::any_of(took_ms.begin(), took_ms.end(), [](double t) { return t < 0; });
  return any_failed || wrong != 0 || readable_total != acked_total ? 1 : 0;
}

}  // namespace granary::bench
