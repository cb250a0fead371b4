// The ordered history of a real granary-master (Master core v2, part 1): several clients put,
// get, upsert and remove at once through real nodes while the store evicts; the master writes its
// history (--history-file). Replaying that file into a fresh state, or loading a snapshot the
// master served mid-run and replaying the rest, must reach the digest the master reports.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <random>
#include <thread>

#include "master/history/history_file.h"
#include "master/state/master_state.h"
#include "master/state/state_codec.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;

struct Fingerprint {
  uint64_t seq = 0;
  std::string digest;
};

std::optional<Fingerprint> FetchDigest(uint16_t http_port) {
  auto resp = HttpGet(http_port, "/debug/digest");
  auto doc = nlohmann::json::parse(resp.body, nullptr, false);
  if (resp.status != 200 || !doc.is_object()) return std::nullopt;
  return Fingerprint{doc["seq"].get<uint64_t>(), doc["digest"].get<std::string>()};
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A fresh state built under the policy the snapshot was made with.
std::unique_ptr<master::MasterState> StateFor(const std::string& snapshot, const Clock* clock) {
  auto policy = master::MasterState::SnapshotPolicy(snapshot);
  if (!policy.ok()) return nullptr;
  return std::make_unique<master::MasterState>(*policy, clock);
}

class HistoryReplayTest : public StoreTest {};

TEST_F(HistoryReplayTest, RealMasterUnderConcurrentClientsReplaysToTheSameDigest) {
  TempDir dir("granary-history");
  const std::string history = dir.path() + "/master.history";
  ASSERT_TRUE(cluster_.Start(3, 24 * MiB, {{"--history-file", history},
                                           {"--eviction-high-watermark", "0.7"}}));
  const uint16_t http = cluster_.master().http_port();

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> operations{0}, failures{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      auto client = cluster_.MakeClient(t % 2 == 0);
      if (!client) {
        failures++;
        return;
      }
      std::mt19937_64 rng(99 + t);
      while (!stop.load()) {
        const std::string key = "hist/" + std::to_string(rng() % 400);
        const int pick = static_cast<int>(rng() % 10);
        if (pick < 5) {
          std::vector<std::byte> value((16 + rng() % 1024) * KiB, std::byte(rng()));
          ReplicateConfig config;
          config.replica_num = 1 + static_cast<uint32_t>(rng() % 2);
          Status s = pick == 0 ? client->Upsert(key, value, config) : client->Put(key, value, config);
          // Expected refusals: a full store, and an upsert racing another put of its key.
          if (!s.ok() && s.code() != ErrorCode::NO_AVAILABLE_HANDLE &&
              !(pick == 0 && s.code() == ErrorCode::OBJECT_ALREADY_EXISTS)) {
            std::fprintf(stderr, "[history] put %s: %s\n", key.c_str(), s.ToString().c_str());
            failures++;
          }
        } else if (pick < 8) {
          (void)client->BatchGet({key, "hist/" + std::to_string(rng() % 400)});
        } else if (pick < 9) {
          (void)client->Remove(key);
        } else {
          (void)client->BatchExist({key});
        }
        operations++;
      }
    });
  }
  // A snapshot while the clients run, after a first part of the load and before a second (by
  // count, at least 1.5 s each: a slow build, e.g. under ThreadSanitizer, needs longer).
  const auto load_part = [&](uint64_t at_least) {
    const auto earliest = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    WaitUntil([&] { return std::chrono::steady_clock::now() >= earliest &&
                           operations.load() >= at_least; },
              Millis(30000), Millis(20));
  };
  load_part(200);
  auto snap = HttpGet(http, "/debug/snapshot");
  load_part(400);
  stop = true;
  for (auto& c : clients) c.join();
  ASSERT_EQ(snap.status, 200) << snap.error;
  EXPECT_EQ(failures.load(), 0u);
  ASSERT_GT(operations.load(), 200u) << "the load never got going";

  // The history covers eviction, not just puts and gets.
  const std::string metrics = HttpGet(http, "/metrics").body;
  EXPECT_EQ(metrics.find("granary_master_evicted_objects_total 0\n"), std::string::npos)
      << "nothing was evicted: the run did not fill the store";
  auto fingerprint = FetchDigest(http);
  ASSERT_TRUE(fingerprint.has_value());
  auto records = master::ReadHistoryRecords(history);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_GT(records->size(), 500u);

  // The whole history, from the state the master started in.
  ManualClock clock(1);  // replay never reads a clock
  auto replica = StateFor((*records)[0], &clock);
  ASSERT_TRUE(replica);
  Status replayed = master::ReplayHistory(*records, *replica, fingerprint->seq);
  ASSERT_TRUE(replayed.ok()) << replayed.ToString();
  EXPECT_EQ(Hex(replica->Digest()), fingerprint->digest) << "replay diverged from the master";

  // The mid-run snapshot plus the operations after it.
  auto from_snapshot = StateFor(snap.body, &clock);
  ASSERT_TRUE(from_snapshot);
  ASSERT_TRUE(from_snapshot->LoadSnapshot(snap.body).ok());
  const uint64_t snap_seq = from_snapshot->last_seq();
  ASSERT_GT(snap_seq, 0u);
  ASSERT_LT(snap_seq, fingerprint->seq);
  for (size_t i = 1; i < records->size(); ++i) {
    auto op = master::DecodeOperation((*records)[i]);
    ASSERT_TRUE(op.ok());
    if (op->seq <= snap_seq) continue;
    if (op->seq > fingerprint->seq) break;
    ASSERT_TRUE(from_snapshot->Replay(*op).ok()) << op->seq;
  }
  EXPECT_EQ(Hex(from_snapshot->Digest()), fingerprint->digest) << "snapshot + tail diverged";
}

}  // namespace
}  // namespace granary::it
