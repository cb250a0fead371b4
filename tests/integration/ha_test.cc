// HA masters with a real etcd (docs/ha.md): standbys hold the leader's state, a killed leader is
// replaced with every acknowledged put, a paused or cut-off leader steps down and never serves
// beside its successor.
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "etcd/cluster_keys.h"
#include "etcd/etcd_client.h"
#include "ha_fixture.h"

namespace granary::it {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

std::vector<std::byte> Pattern(const std::string& key, size_t size) {
  std::vector<std::byte> v(size);
  std::mt19937_64 rng(std::hash<std::string>{}(key));
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t r = rng();
    std::memcpy(v.data() + i, &r, std::min<size_t>(8, size - i));
  }
  return v;
}

// The master's (seq, digest) at one moment.
std::optional<std::pair<uint64_t, std::string>> Digest(MasterProcess& m) {
  HttpResult r = HttpGet(m.http_port(), "/debug/digest", Millis(1000));
  if (r.status != 200) return std::nullopt;
  auto doc = nlohmann::json::parse(r.body, nullptr, false);
  if (!doc.is_object()) return std::nullopt;
  return std::make_pair(doc["seq"].get<uint64_t>(), doc["digest"].get<std::string>());
}

// Each standby's digest equals the leader's at a moment both report the same position, past
// min_seq. The leader keeps applying (sweeps every 100 ms), so a few tries may be needed.
void ExpectStandbysMatchTheLeader(HaCluster& cluster, uint64_t min_seq) {
  ASSERT_TRUE(cluster.WaitForStandbysCaughtUp(Millis(5000)));
  const int leader = cluster.LeaderIndex();
  ASSERT_GE(leader, 0);
  for (int i = 0; i < cluster.master_count(); ++i) {
    if (i == leader) continue;
    bool compared = false;
    for (int attempt = 0; attempt < 200 && !compared; ++attempt) {  // bounded
      auto a = Digest(cluster.master(leader));
      auto b = Digest(cluster.master(i));
      ASSERT_TRUE(a && b);
      if (a->first != b->first) continue;
      EXPECT_EQ(a->second, b->second) << "standby " << i << " differs at seq " << a->first;
      EXPECT_GT(a->first, min_seq);
      compared = true;
    }
    EXPECT_TRUE(compared) << "standby " << i << " never at the leader's position";
  }
}

TEST_F(HaTest, StandbysHoldTheLeadersStateAtTheSameSequenceNumber) {
  ASSERT_TRUE(cluster_.Start(3, 1, 64 * MiB));
  auto client = cluster_.MakeClient();
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 40; ++i) {
    const std::string key = "k" + std::to_string(i);
    auto value = Pattern(key, 16 * KiB);
    ASSERT_TRUE(client->Put(key, value).ok());
  }
  ASSERT_TRUE(client->BatchRemove({"k1", "k2"})[0].ok());
  ExpectStandbysMatchTheLeader(cluster_, 40);
}

// A leader that applies concurrent put starts as groups (--apply-groups) streams operations a
// standby, applying them one by one, turns into the same state.
TEST_F(HaTest, AStandbyOfALeaderApplyingPutGroupsHoldsItsState) {
  ASSERT_TRUE(cluster_.Start(2, 1, 64 * MiB, {"--apply-groups=true", "--apply-combine-waiting=1"}));
  const int leader = cluster_.LeaderIndex();
  ASSERT_GE(leader, 0);
  auto grouped = [&] {
    HttpResult r = HttpGet(cluster_.master(leader).http_port(), "/metrics", Millis(2000));
    const std::string name = "\ngranary_master_applies_grouped_total ";
    const size_t at = r.body.find(name);
    return at == std::string::npos ? -1.0 : std::stod(r.body.substr(at + name.size()));
  };
  constexpr int kWriters = 12, kBatch = 128;
  std::atomic<int> failed{0};
  int round = 0;
  for (; round < 20 && grouped() <= 0; ++round) {  // bounded: until some starts were grouped
    std::vector<std::thread> writers;
    for (int w = 0; w < kWriters; ++w) {
      writers.emplace_back([&, w] {
        auto client = cluster_.MakeClient();
        if (client == nullptr) {
          failed++;
          return;
        }
        for (int b = 0; b < 4; ++b) {
          std::vector<std::string> keys;
          std::vector<std::vector<std::byte>> values;
          std::vector<ByteSpan> spans;
          for (int k = 0; k < kBatch; ++k) {
            keys.push_back("g/" + std::to_string(round) + "/" + std::to_string(w) + "/" +
                           std::to_string(b) + "/" + std::to_string(k));
            values.push_back(Pattern(keys.back(), 512));
          }
          for (auto& v : values) spans.emplace_back(v);
          for (const Status& s : client->BatchPut(keys, spans)) failed += !s.ok();
        }
      });
    }
    for (auto& t : writers) t.join();
  }
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(grouped(), 0) << "no put start was applied in a group in " << round << " rounds";
  ExpectStandbysMatchTheLeader(cluster_, kWriters * 4);
}

TEST_F(HaTest, KillingTheLeaderLosesNoAcknowledgedPut) {
  ASSERT_TRUE(cluster_.Start(3, 2, 64 * MiB));
  auto client = cluster_.MakeClient();
  ASSERT_NE(client, nullptr);
  std::vector<std::string> acked;
  for (int i = 0; i < 100; ++i) {
    const std::string key = "obj-" + std::to_string(i);
    auto value = Pattern(key, 64 * KiB);
    Status s = client->Put(key, value);
    ASSERT_TRUE(s.ok()) << s.ToString();
    acked.push_back(key);
  }
  const int old_leader = cluster_.LeaderIndex();
  ASSERT_GE(old_leader, 0);
  const uint64_t old_term = (*cluster_.Status(old_leader))["term"].get<uint64_t>();

  ASSERT_TRUE(cluster_.master(old_leader).process().Kill(SIGKILL));
  const auto killed = SteadyClock::now();
  // The first put that succeeds after the kill (each put waits out the failover within its own
  // timeout, so a few attempts suffice).
  Status put;
  for (int attempt = 0; attempt < 20; ++attempt) {  // bounded
    const std::string key = "after-" + std::to_string(attempt);
    auto value = Pattern(key, 64 * KiB);
    put = client->Put(key, value);
    if (put.ok()) break;
  }
  const auto served = SteadyClock::now();
  ASSERT_TRUE(put.ok()) << put.ToString();
  const auto took = std::chrono::duration_cast<milliseconds>(served - killed).count();
  std::printf("failover: kill -9 to first successful put in %lld ms\n",
              static_cast<long long>(took));
  EXPECT_LT(took, 3000) << "the issue's bound for one failover";

  const int new_leader = cluster_.WaitForLeader(Millis(5000), old_leader);
  ASSERT_GE(new_leader, 0);
  EXPECT_GT((*cluster_.Status(new_leader))["term"].get<uint64_t>(), old_term);
  for (const auto& key : acked) {
    auto expected = Pattern(key, 64 * KiB);
    std::vector<std::byte> got(64 * KiB);
    auto r = client->GetInto(key, got);
    ASSERT_TRUE(r.ok()) << key << ": " << r.status().ToString();
    ASSERT_EQ(*r, expected.size());
    ASSERT_EQ(got, expected) << key << " read back different bytes";
  }
  // The client followed the new leader's record to its fast port's local socket (same host).
  HttpResult page = HttpGet(cluster_.master(new_leader).http_port(), "/metrics");
  const std::string series = "\ngranary_master_fast_local_connections_total ";
  const size_t at = page.body.find(series);
  ASSERT_NE(at, std::string::npos) << page.body.substr(0, 500);
  EXPECT_GE(std::stod(page.body.substr(at + series.size())), 1);
}


// Sends one-key puts to every master directly (its own address, not the leader's) from a thread,
// recording each success with its send and receive times and the term it carried. If two
// masters ever served at once, a success of a lower term would have been sent after a success of
// a higher term came back: Check() looks for exactly that.
class ServingProbe {
 public:
  explicit ServingProbe(HaCluster* cluster) : cluster_(cluster) {}
  ~ServingProbe() { Stop(); }
  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  struct Success {
    int master;
    uint64_t term;
    SteadyClock::time_point sent, received;
  };
  ::testing::AssertionResult Check() const {
    for (const auto& a : successes_) {
      for (const auto& b : successes_) {
        if (a.term < b.term && a.sent > b.received) {
          return ::testing::AssertionFailure()
                 << "master " << a.master << " (term " << a.term << ") served a put sent after "
                 << "master " << b.master << " (term " << b.term << ") had answered one";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }
  std::set<uint64_t> Terms() const {
    std::set<uint64_t> t;
    for (const auto& s : successes_) t.insert(s.term);
    return t;
  }
  size_t successes() const { return successes_.size(); }

 private:
  void Run() {
    uint64_t n = 0;
    while (!stop_.load()) {  // bounded by Stop()
      for (int i = 0; i < cluster_->master_count() && !stop_.load(); ++i) {
        MasterProcess& m = cluster_->master(i);
        auto channel = MakeChannel(m.address());
        auto stub = pb::Master::NewStub(channel);
        pb::BatchPutStartRequest req;
        req.set_client_id("probe");
        req.add_keys("probe-" + std::to_string(n++));
        req.add_sizes(4096);
        pb::BatchPutStartResponse resp;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(300));
        const auto sent = SteadyClock::now();
        grpc::Status s = stub->BatchPutStart(&ctx, req, &resp);
        const auto received = SteadyClock::now();
        if (s.ok() && resp.results_size() == 1 && resp.results(0).code() == 0) {
          successes_.push_back({i, resp.term(), sent, received});
        }
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
  }
  HaCluster* cluster_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<Success> successes_;  // the probe thread's until Stop()
};

void PausedLeaderStepsDown(HaCluster& cluster_, std::vector<std::string> flags) {
  ASSERT_TRUE(cluster_.Start(3, 1, 64 * MiB, flags));
  const int old_leader = cluster_.LeaderIndex();
  ASSERT_GE(old_leader, 0);
  // A client that knew the old leader: once a call to the paused one fails (its timeout), the
  // next ones find the new leader.
  ClientOptions short_calls;
  short_calls.rpc_timeout_ms = 1500;
  auto client = cluster_.MakeClient(false, short_calls);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("before-pause", Pattern("before-pause", 4096)).ok());
  ServingProbe probe(&cluster_);
  probe.Start();
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_TRUE(cluster_.master(old_leader).process().Kill(SIGSTOP));
  ASSERT_TRUE(cluster_.master(old_leader).process().WaitStopped(Millis(2000)));
  // Longer than its lease (1 s): etcd expires it and a standby takes over.
  const int new_leader = cluster_.WaitForLeader(Millis(5000), old_leader);
  ASSERT_GE(new_leader, 0);
  bool put = false;
  for (int i = 0; i < 5 && !put; ++i) {  // bounded: at most one call times out on the old one
    Status st = client->Put("during-pause-" + std::to_string(i), Pattern("p", 4096));
    put = st.ok();
    if (!put) std::printf("put during the pause: %s\n", st.ToString().c_str());
  }
  EXPECT_TRUE(put) << "the client stayed on the paused leader";
  std::this_thread::sleep_for(milliseconds(1500));
  ASSERT_TRUE(cluster_.master(old_leader).process().Kill(SIGCONT));
  EXPECT_TRUE(cluster_.WaitForRole(old_leader, "standby", Millis(5000)))
      << "the old leader did not rejoin as a standby";
  std::this_thread::sleep_for(milliseconds(1000));
  probe.Stop();
  EXPECT_TRUE(probe.Check());
  EXPECT_GE(probe.Terms().size(), 2u) << "the probe saw no failover: it proves nothing";
  EXPECT_TRUE(cluster_.WaitForStandbysCaughtUp(Millis(5000)));
}

TEST_F(HaTest, APausedLeaderStepsDownAndNeverServesBesideItsSuccessor) {
  PausedLeaderStepsDown(cluster_, {});
}

// Without a synchronous standby to wait for, only the lease keeps a resumed leader from serving.
TEST_F(HaTest, APausedAsynchronousLeaderStopsServingByItsLeaseAlone) {
  PausedLeaderStepsDown(cluster_, {"--sync-standbys", "0"});
}

void CutOffLeaderStepsDown(HaCluster& cluster_, std::vector<std::string> flags) {
  ASSERT_TRUE(cluster_.Start(3, 1, 64 * MiB, flags, /*proxied=*/true));
  const int old_leader = cluster_.LeaderIndex();
  ASSERT_GE(old_leader, 0);
  ServingProbe probe(&cluster_);
  probe.Start();
  std::this_thread::sleep_for(milliseconds(300));
  // Clients and nodes still reach it; etcd does not.
  ASSERT_TRUE(cluster_.proxy(old_leader).SetMode(TcpProxy::Mode::kBlackhole));
  const int new_leader = cluster_.WaitForLeader(Millis(6000), old_leader);
  ASSERT_GE(new_leader, 0);
  auto old_status = cluster_.Status(old_leader);
  ASSERT_TRUE(old_status);
  EXPECT_NE((*old_status)["role"], "leader") << "two leaders";
  std::this_thread::sleep_for(milliseconds(1000));
  ASSERT_TRUE(cluster_.proxy(old_leader).SetMode(TcpProxy::Mode::kForward));
  EXPECT_TRUE(cluster_.WaitForRole(old_leader, "standby", Millis(6000)));
  std::this_thread::sleep_for(milliseconds(500));
  probe.Stop();
  EXPECT_TRUE(probe.Check());
  EXPECT_GE(probe.Terms().size(), 2u);
}

TEST_F(HaTest, ALeaderCutOffFromEtcdStepsDownInTime) { CutOffLeaderStepsDown(cluster_, {}); }

// Asynchronous: no standby's silence stops the cut-off leader, only its own lease clock.
TEST_F(HaTest, AnAsynchronousLeaderCutOffFromEtcdStopsServingByItsLeaseAlone) {
  CutOffLeaderStepsDown(cluster_, {"--sync-standbys", "0"});
}

TEST_F(HaTest, TheSynchronousStandbyKilledIsReplacedAndCatchesUpWhenBack) {
  ASSERT_TRUE(cluster_.Start(3, 1, 64 * MiB));
  auto client = cluster_.MakeClient();
  ASSERT_NE(client, nullptr);
  const int leader = cluster_.LeaderIndex();
  ASSERT_GE(leader, 0);
  int sync = -1;
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto s = cluster_.Status(leader);
        if (!s) return false;
        for (const auto& st : (*s)["standbys"]) {
          if (!st["synchronous"].get<bool>()) continue;
          for (int i = 0; i < cluster_.master_count(); ++i) {
            auto m = cluster_.Status(i);
            if (m && (*m)["member_id"] == st["id"]) sync = i;
          }
        }
        return sync >= 0;
      },
      Millis(5000)));
  ASSERT_TRUE(client->Put("before", Pattern("before", 4096)).ok());
  cluster_.master(sync).process().KillAndReap();
  // Puts go on: the leader names the other standby (a blip of at most the standby timeout).
  for (int i = 0; i < 20; ++i) {
    const std::string key = "during-" + std::to_string(i);
    Status s = client->Put(key, Pattern(key, 4096));
    ASSERT_TRUE(s.ok()) << key << ": " << s.ToString();
  }
  ASSERT_TRUE(cluster_.RestartMaster(sync));
  EXPECT_TRUE(cluster_.WaitForRole(sync, "standby", Millis(5000)));
  EXPECT_TRUE(cluster_.WaitForStandbysCaughtUp(Millis(5000)));
  auto s = cluster_.Status(sync);
  ASSERT_TRUE(s);
  EXPECT_GE((*s)["following"]["snapshots_loaded"].get<uint64_t>(), 1u)
      << "a restarted master has no state: it must start from a snapshot";
}


// Every master killed at once: no master holds the state any more. The next leader starts from
// an empty state, as a restarted master does: memory objects are lost, and what a node's disk
// holds comes back when the node registers it again.
TEST_F(HaTest, EveryMasterKilledAtOnceLosesMemoryObjectsButNotDiskCopies) {
  TempDir disk("granary-ha-disk");
  ASSERT_TRUE(cluster_.Start(2, 0, 0, {"--persistence", "none"}));
  ASSERT_TRUE(cluster_.AddNode(32 * MiB, {"--disk-dir", disk.path(), "--disk-size", "128MiB",
                                          "--offload-interval", "100ms"}));
  auto client = cluster_.MakeClient();
  ASSERT_NE(client, nullptr);
  ReplicateConfig on_disk;
  on_disk.persistence = Persistence::kEager;
  for (int i = 0; i < 10; ++i) {
    const std::string key = "disk-" + std::to_string(i);
    ASSERT_TRUE(client->Put(key, Pattern(key, 32 * KiB), on_disk).ok());
    const std::string mem = "mem-" + std::to_string(i);
    ASSERT_TRUE(client->Put(mem, Pattern(mem, 32 * KiB)).ok());
  }
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (int i = 0; i < 10; ++i) {
          auto st = client->Stat("disk-" + std::to_string(i));
          if (!st.ok() || st->disk_replicas.empty()) return false;
        }
        return true;
      },
      Millis(10'000)));
  for (int i = 0; i < cluster_.master_count(); ++i) cluster_.master(i).process().Kill(SIGKILL);
  for (int i = 0; i < cluster_.master_count(); ++i) {
    cluster_.master(i).process().Wait(Millis(2000));
    ASSERT_TRUE(cluster_.RestartMaster(i));
  }
  ASSERT_GE(cluster_.WaitForLeader(Millis(10'000)), 0);
  auto st = cluster_.Status(cluster_.LeaderIndex());
  ASSERT_TRUE(st);
  // The disk copies come back once the node has remounted and registered its inventory.
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::vector<std::byte> got(32 * KiB);
        auto r = client->GetInto("disk-9", got);
        return r.ok();
      },
      Millis(15'000)))
      << "the disk copies did not come back";
  for (int i = 0; i < 10; ++i) {
    const std::string key = "disk-" + std::to_string(i);
    std::vector<std::byte> got(32 * KiB);
    auto r = client->GetInto(key, got);
    ASSERT_TRUE(r.ok()) << key << ": " << r.status().ToString();
    EXPECT_EQ(got, Pattern(key, 32 * KiB)) << key;
    std::vector<std::byte> lost(32 * KiB);
    auto m = client->GetInto("mem-" + std::to_string(i), lost);
    EXPECT_EQ(m.status().code(), ErrorCode::OBJECT_NOT_FOUND)
        << "a memory-only object outlived every master";
  }
}

// With --allow-serving-alone, a leader whose every standby is gone serves on (and says so);
// without it, it refuses changes until a standby is back.
TEST_F(HaTest, ALeaderWithoutStandbysServesAloneOnlyWhenAllowed) {
  ASSERT_TRUE(cluster_.Start(2, 1, 32 * MiB));
  auto client = cluster_.MakeClient(false, [] {
    ClientOptions o;
    o.rpc_timeout_ms = 1500;
    return o;
  }());
  ASSERT_NE(client, nullptr);
  const int leader = cluster_.LeaderIndex();
  ASSERT_GE(leader, 0);
  ASSERT_TRUE(client->Put("k0", Pattern("k0", 4096)).ok());
  const int standby = 1 - leader;
  cluster_.master(standby).process().KillAndReap();
  std::this_thread::sleep_for(milliseconds(1000));  // past the standby timeout (500 ms)
  Status refused = client->Put("k1", Pattern("k1", 4096));
  EXPECT_EQ(refused.code(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS) << refused.ToString();
  auto metrics = HttpGet(cluster_.master(leader).http_port(), "/metrics");
  EXPECT_NE(metrics.body.find("granary_master_ha_serving_alone 0"), std::string::npos);
  // The standby returns: changes are taken again.
  ASSERT_TRUE(cluster_.RestartMaster(standby));
  ASSERT_TRUE(WaitUntil([&] { return client->Put("k2", Pattern("k2", 4096)).ok(); },
                        Millis(10'000)));
}

TEST_F(HaTest, ALeaderAllowedToServeAloneSaysSoAndServes) {
  ASSERT_TRUE(cluster_.Start(2, 1, 32 * MiB, {"--allow-serving-alone"}));
  auto client = cluster_.MakeClient();
  ASSERT_NE(client, nullptr);
  const int leader = cluster_.LeaderIndex();
  ASSERT_GE(leader, 0);
  cluster_.master(1 - leader).process().KillAndReap();
  ASSERT_TRUE(WaitUntil([&] { return client->Put("alone", Pattern("alone", 4096)).ok(); },
                        Millis(5000)));
  auto metrics = HttpGet(cluster_.master(leader).http_port(), "/metrics");
  EXPECT_NE(metrics.body.find("granary_master_ha_serving_alone 1"), std::string::npos)
      << metrics.body;
  EXPECT_NE(cluster_.master(leader).Log().find("serving alone"), std::string::npos);
}

// etcd itself restarted: the leader cannot renew meanwhile and stops serving; once etcd is back
// a leader serves again, with every acknowledged put.
TEST_F(HaTest, AnEtcdRestartPausesServiceWithoutSplitBrainAndLosesNothing) {
  ASSERT_TRUE(cluster_.Start(3, 1, 32 * MiB));
  auto client = cluster_.MakeClient();
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 20; ++i) {
    const std::string key = "e-" + std::to_string(i);
    ASSERT_TRUE(client->Put(key, Pattern(key, 8 * KiB)).ok());
  }
  ServingProbe probe(&cluster_);
  probe.Start();
  cluster_.etcd().Kill();
  std::this_thread::sleep_for(milliseconds(2000));
  EXPECT_LT(cluster_.LeaderIndex(), 0) << "a leader served without etcd for longer than a lease";
  ASSERT_TRUE(cluster_.etcd().Restart());
  ASSERT_GE(cluster_.WaitForLeader(Millis(15'000)), 0);
  ASSERT_TRUE(WaitUntil([&] { return client->Put("after", Pattern("after", 4096)).ok(); },
                        Millis(10'000)));
  probe.Stop();
  EXPECT_TRUE(probe.Check());
  for (int i = 0; i < 20; ++i) {
    const std::string key = "e-" + std::to_string(i);
    std::vector<std::byte> got(8 * KiB);
    auto r = client->GetInto(key, got);
    ASSERT_TRUE(r.ok()) << key << ": " << r.status().ToString();
    EXPECT_EQ(got, Pattern(key, 8 * KiB));
  }
}


// kill -9 of the leader while writers and readers run: every put acknowledged before or after
// the kill reads back exact; a read never returns other bytes; a put that failed around the kill
// left its key absent or holding one of the values tried, the same on every read.
TEST_F(HaTest, KillingTheLeaderUnderLoadLosesNoAcknowledgedPutAndReadsNothingWrong) {
  ASSERT_TRUE(cluster_.Start(3, 2, 64 * MiB));
  constexpr size_t kSize = 16 * KiB;
  constexpr int kWriters = 2;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> wrong{0}, mismatches{0}, reads{0};
  std::mutex mu;
  std::vector<std::string> acked;                            // under mu
  std::map<std::string, std::vector<std::string>> retried;   // key -> values tried, under mu
  std::vector<SteadyClock::time_point> acked_at;             // under mu
  auto value_of = [&](const std::string& key, int attempt) {
    return Pattern(key + "#" + std::to_string(attempt), kSize);
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      auto client = cluster_.MakeClient();
      if (!client) return;
      ReplicateConfig two;
      two.replica_num = 2;
      // Paced (~150 puts/s each), so the segments never fill: eviction would lose objects.
      for (int i = 0; !stop.load(); ++i) {  // bounded by stop
        std::this_thread::sleep_for(milliseconds(5));
        const std::string key = "w" + std::to_string(w) + "-" + std::to_string(i);
        Status s = client->Put(key, value_of(key, 0), two);
        if (!s.ok()) {
          // A failed put is retried once with other bytes: whichever lands, one version only.
          Status again = client->Put(key, value_of(key, 1), two);
          std::lock_guard lock(mu);
          retried[key] = {"0", "1"};
          if (again.ok()) acked.push_back(key);
          continue;
        }
        std::lock_guard lock(mu);
        acked.push_back(key);
        acked_at.push_back(SteadyClock::now());
      }
    });
  }
  threads.emplace_back([&] {
    auto client = cluster_.MakeClient();
    if (!client) return;
    std::mt19937 rng(7);
    while (!stop.load()) {  // bounded by stop
      std::string key;
      {
        std::lock_guard lock(mu);
        if (!acked.empty()) key = acked[rng() % acked.size()];
      }
      if (key.empty()) {
        std::this_thread::sleep_for(milliseconds(5));
        continue;
      }
      std::vector<std::byte> got(kSize);
      auto r = client->GetInto(key, got);
      reads++;
      if (r.status().code() == ErrorCode::CHECKSUM_MISMATCH) mismatches++;
      if (!r.ok()) continue;
      bool matches = got == value_of(key, 0);
      {
        std::lock_guard lock(mu);
        if (retried.count(key)) matches = matches || got == value_of(key, 1);
      }
      if (!matches) wrong++;
    }
  });
  std::this_thread::sleep_for(milliseconds(800));
  const int old_leader = cluster_.LeaderIndex();
  ASSERT_GE(old_leader, 0);
  ASSERT_TRUE(cluster_.master(old_leader).process().Kill(SIGKILL));
  const auto killed = SteadyClock::now();
  std::this_thread::sleep_for(milliseconds(3000));
  stop = true;
  for (auto& t : threads) t.join();

  EXPECT_EQ(wrong.load(), 0u) << "reads returned other bytes than the put's";
  EXPECT_EQ(mismatches.load(), 0u) << "a checksum caught what the fences should have prevented";
  EXPECT_GT(reads.load(), 100u);
  int after = 0;
  for (auto t : acked_at) after += t > killed;
  EXPECT_GT(after, 0) << "no put succeeded after the kill";
  auto client = cluster_.MakeClient();
  ASSERT_NE(client, nullptr);
  for (const auto& key : acked) {
    // Every replica the same: read it a few times (a read picks one replica).
    std::vector<std::byte> first;
    for (int i = 0; i < 3; ++i) {
      std::vector<std::byte> got(kSize);
      auto r = client->GetInto(key, got);
      ASSERT_TRUE(r.ok()) << key << ": " << r.status().ToString();
      const bool ok = got == value_of(key, 0) || (retried.count(key) && got == value_of(key, 1));
      ASSERT_TRUE(ok) << key << " holds bytes of no put";
      if (i == 0) first = got;
      ASSERT_EQ(got, first) << key << " has two versions";
    }
  }
  for (const auto& [key, values] : retried) {
    std::vector<std::byte> got(kSize);
    auto r = client->GetInto(key, got);
    if (r.ok()) {
      EXPECT_TRUE(got == value_of(key, 0) || got == value_of(key, 1)) << key;
    } else {
      EXPECT_EQ(r.status().code(), ErrorCode::OBJECT_NOT_FOUND) << key << ": " << r.status().ToString();
    }
  }
  std::printf("load across the kill: %zu puts acknowledged (%d after the kill), %zu retried, "
              "%llu reads\n",
              acked.size(), after, retried.size(), static_cast<unsigned long long>(reads.load()));
}

// The nodes keep their mounts across a failover: the new leader already knows their segments,
// so none remounts (no new token, no new memory) and their objects stay readable.
TEST_F(HaTest, NodesKeepTheirMountsAcrossAFailover) {
  ASSERT_TRUE(cluster_.Start(3, 2, 32 * MiB));
  auto client = cluster_.MakeClient();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("kept", Pattern("kept", 8 * KiB)).ok());
  const int old_leader = cluster_.LeaderIndex();
  ASSERT_GE(old_leader, 0);
  ASSERT_TRUE(cluster_.master(old_leader).process().Kill(SIGKILL));
  ASSERT_GE(cluster_.WaitForLeader(Millis(5000), old_leader), 0);
  ASSERT_TRUE(WaitUntil([&] { return client->Put("next", Pattern("next", 4096)).ok(); },
                        Millis(5000)));
  std::this_thread::sleep_for(milliseconds(1000));  // several heartbeats with the new leader
  for (size_t i = 0; i < cluster_.node_count(); ++i) {
    EXPECT_EQ(cluster_.node(i).AllLogs().find("remounted"), std::string::npos)
        << cluster_.node(i).name() << " remounted across the failover";
  }
  std::vector<std::byte> got(8 * KiB);
  auto r = client->GetInto("kept", got);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(got, Pattern("kept", 8 * KiB));
}


// A node whose last heartbeat is older than the client TTL (3 s here) when a new leader takes
// over keeps its segment if it pings the new leader within a TTL of the takeover: the new leader
// expires no client before then (it could not have been pinged sooner).
TEST_F(HaTest, ANewLeaderGivesEveryNodeAFullTtlBeforeItExpiresOne) {
  ASSERT_TRUE(cluster_.Start(3, 1, 32 * MiB));
  auto client = cluster_.MakeClient();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("kept", Pattern("kept", 8 * KiB)).ok());
  ASSERT_TRUE(cluster_.WaitForStandbysCaughtUp(Millis(5000)));
  const int old_leader = cluster_.LeaderIndex();
  ASSERT_GE(old_leader, 0);
  ASSERT_TRUE(cluster_.node(0).Kill(SIGSTOP));  // its last ping is now
  std::this_thread::sleep_for(milliseconds(2500));
  ASSERT_TRUE(cluster_.master(old_leader).process().Kill(SIGKILL));
  ASSERT_GE(cluster_.WaitForLeader(Millis(5000), old_leader), 0);
  // Past the node's TTL as the old leader counted it, well within one from the takeover.
  std::this_thread::sleep_for(milliseconds(1000));
  ASSERT_TRUE(cluster_.node(0).Kill(SIGCONT));
  std::this_thread::sleep_for(milliseconds(1500));  // pings with the new leader
  EXPECT_EQ(cluster_.node(0).AllLogs().find("remounted"), std::string::npos)
      << "the new leader expired the node it had not heard from yet";
  std::vector<std::byte> got(8 * KiB);
  auto r = client->GetInto("kept", got);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(got, Pattern("kept", 8 * KiB));
}

// The leader record says serving only once that master answers: through a failover, every time
// etcd names a serving leader, a call to that address right away is answered, not refused.
TEST_F(HaTest, TheLeaderRecordSaysServingOnlyOnceItsMasterAnswers) {
  ASSERT_TRUE(cluster_.Start(3, 1, 32 * MiB));
  auto etcd = etcd::EtcdClient::Connect(cluster_.endpoints(), 1000);
  ASSERT_TRUE(etcd.ok());
  const std::string key = etcd::LeaderKey(cluster_.cluster_id());
  const int old_leader = cluster_.LeaderIndex();
  ASSERT_GE(old_leader, 0);
  auto before = (*etcd)->Get(key);
  ASSERT_TRUE(before.ok() && *before);
  ASSERT_TRUE(cluster_.master(old_leader).process().Kill(SIGKILL));
  // The dead leader's record stays until its lease expires: only later records count.
  int64_t checked_revision = (*before)->mod_revision;
  int answered = 0;
  const auto end = SteadyClock::now() + milliseconds(8000);
  while (SteadyClock::now() < end && answered == 0) {  // bounded by `end`
    std::this_thread::sleep_for(milliseconds(5));
    auto kv = (*etcd)->Get(key);
    if (!kv.ok() || !*kv || (*kv)->mod_revision == checked_revision) continue;
    auto record = etcd::ParseLeaderRecord((*kv)->value);
    ASSERT_TRUE(record.ok());
    if (!record->serving) continue;
    checked_revision = (*kv)->mod_revision;
    // The master the record names, at once: it must serve (not refuse as a standby or a
    // leader still taking over).
    auto stub = pb::Master::NewStub(MakeChannel(record->grpc));
    pb::BatchExistRequest req;
    req.add_keys("k");
    pb::BatchExistResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(2000));
    grpc::Status s = stub->BatchExist(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << record->grpc << " is named serving but answered " << s.error_message();
    ++answered;
  }
  EXPECT_GT(answered, 0) << "no serving leader was seen after the kill";
}

// A three-member etcd loses the member the masters talk to: the masters' etcd client moves to
// another member; at most one master serves throughout, and service goes on with every
// acknowledged put.
TEST(HaEtcdClusterTest, OneOfThreeEtcdMembersKilledLeavesNoSplitBrainAndServiceResumes) {
  HaCluster cluster("", 3);
  ASSERT_TRUE(cluster.Start(3, 1, 32 * MiB));
  auto client = cluster.MakeClient();
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 20; ++i) {
    const std::string key = "m-" + std::to_string(i);
    ASSERT_TRUE(client->Put(key, Pattern(key, 8 * KiB)).ok());
  }
  ServingProbe probe(&cluster);
  probe.Start();
  cluster.etcd_cluster().Kill(0);  // the first endpoint: where every client connected first
  std::this_thread::sleep_for(milliseconds(1500));
  ASSERT_TRUE(WaitUntil([&] { return client->Put("after", Pattern("after", 4096)).ok(); },
                        Millis(15'000)))
      << cluster.Logs();
  ASSERT_GE(cluster.WaitForLeader(Millis(10'000)), 0);
  probe.Stop();
  EXPECT_TRUE(probe.Check());
  for (int i = 0; i < 20; ++i) {
    const std::string key = "m-" + std::to_string(i);
    std::vector<std::byte> got(8 * KiB);
    auto r = client->GetInto(key, got);
    ASSERT_TRUE(r.ok()) << key << ": " << r.status().ToString();
    EXPECT_EQ(got, Pattern(key, 8 * KiB));
  }
  ASSERT_TRUE(cluster.etcd_cluster().Restart(0));
  if (::testing::Test::HasFailure()) std::fprintf(stderr, "%s\n", cluster.Logs().c_str());
}

}  // namespace
}  // namespace granary::it
