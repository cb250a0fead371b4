// PutStarts applied as one group (master/state/master_state_put_group.cc) must leave the state,
// and give each caller the results, that applying them one by one in seq order gives: a replay
// of the numbered log into a fresh state (which applies one by one) must reach the same digest
// and answer every operation alike. The run mixes what a group must notice: keys repeated
// within a batch and across concurrent batches, keys with a pending write (live or zombie),
// upserts and refused re-puts of committed keys, invalid keys and sizes, whole-batch refusals,
// and segments too full to place a key.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "master/state/key_namespace.h"
#include "master/state/master_state.h"
#include "master/state/state_codec.h"

namespace granary::master {
namespace {

constexpr uint64_t kKiB = 1024;

MasterPolicy GroupPolicy() {
  MasterPolicy p;
  p.eviction_policy = EvictionPolicy::kS3Fifo;
  p.lease_ttl_ms = 50;
  p.put_discard_timeout_ms = 30;
  p.put_release_timeout_ms = 60;
  p.shard_count = 64;
  return p;
}

SegmentSpec Spec(const std::string& name, uint64_t size, uint64_t token) {
  return {name, size, "127.0.0.1:1", "granary-" + name, "host/boot", token, true,
          std::string(32, static_cast<char>(token))};
}

struct Logged {
  Operation op;
  OpResult result;
};

// The parts of a PutStart answer a caller acts on.
std::string Describe(const OpResult& result) {
  std::string out;
  if (const auto* started = std::get_if<std::vector<PutStartKeyResult>>(&result)) {
    for (const auto& r : *started) {
      out += std::to_string(static_cast<int>(r.status.code())) + ":" + r.status.message() + ":" +
             std::to_string(r.put_gen);
      for (const Extent& e : r.replicas) {
        out += "@" + std::to_string(e.segment_id) + "+" + std::to_string(e.offset) + "/" +
               std::to_string(e.length);
      }
      out += ";";
    }
  } else if (const auto* statuses = std::get_if<std::vector<Status>>(&result)) {
    for (const auto& s : *statuses) out += std::to_string(static_cast<int>(s.code())) + ";";
  }
  return out;
}

TEST(PutGroupTest, GroupedPutStartsReplayToTheSameStateAndAnswers) {
  ManualClock clock;
  MasterState leader(GroupPolicy(), &clock);
  leader.set_apply_turns(32, 1);  // combine whenever one caller waits: groups form
  leader.set_apply_groups(true);
  const std::string initial = leader.EncodeSnapshot();
  std::mutex log_mu;  // observers run under the apply lock; the lock only pleases the analysers
  std::vector<Logged> log;
  leader.AddObserver([&](const Operation& op, const OpResult& result) {
    std::lock_guard lock(log_mu);
    log.push_back({op, result});
  });
  // Small segments: big batches fill them, and some keys find no room.
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(leader.Mount({"node-" + std::to_string(s),
                              Spec("seg-" + std::to_string(s), 8192 * kKiB, 100 + s)})
                    .status.ok());
  }

  constexpr int kThreads = 6, kRounds = 1000;
  // Groups form only when callers meet in a turn: on a loaded machine a pass may see few, so
  // passes repeat (bounded) until both ways of a group were taken often enough.
  for (int pass = 0; pass < 8; ++pass) {
    if (pass > 0 && leader.applies_grouped() - leader.grouped_one_by_one() > 50 &&
        leader.grouped_one_by_one() > 0 && leader.apply_parts_helped() > 0) {
      break;
    }
    std::vector<std::thread> workers;
    for (int t = 0; t < kThreads; ++t) {
      workers.emplace_back([&, t, pass] {
        std::mt19937_64 rng(77 + t + 1000 * pass);
        const std::string client = "client-" + std::to_string(t % 4);  // two pairs share an id
        for (int i = 0; i < kRounds; ++i) {
          const int pick = static_cast<int>(rng() % 100);
          const int n = 16 + static_cast<int>(rng() % 48);
          std::vector<std::string> keys;
          std::vector<uint64_t> sizes;
          for (int k = 0; k < n; ++k) {
            // Mostly keys of this thread's own (new or put again), some from a small shared pool.
            if (rng() % 64 == 0) {
              keys.push_back("shared/" + std::to_string(rng() % 8));
            } else {
              keys.push_back("own/" + std::to_string(t) + "/" + std::to_string(rng() % 20000));
              // A third in a tenant's namespace: its usage is counted from the shard phases.
              if (rng() % 3 == 0) {
                keys.back() =
                    HeldKey(NamespacePrefix("tenant-" + std::to_string(t % 2)), keys.back());
              }
            }
            const int odd = static_cast<int>(rng() % 200);
            sizes.push_back(odd == 0 ? 0 : odd == 1 ? (64ull << 30) : (1 + rng() % 32) * kKiB);
            if (odd == 2) keys.back() = "";  // an invalid key
          }
          if (rng() % 6 == 0) keys.back() = keys.front();  // a key twice in one batch
          if (pick < 70) {
            PlacementConfig config;
            config.replica_num = 1 + static_cast<uint32_t>(rng() % 2);
            if (rng() % 40 == 0) config.persistence = static_cast<PutPersistence>(9);  // refused
            const std::string who = rng() % 60 == 0 ? std::string() : client;  // refused
            auto started = leader.PutStart({who, keys, sizes, config, rng() % 3 == 0});
            std::vector<std::string> ok_keys;
            std::vector<uint64_t> gens, sums;
            for (size_t k = 0; k < keys.size(); ++k) {
              if (!started[k].status.ok()) continue;
              ok_keys.push_back(keys[k]);
              gens.push_back(started[k].put_gen);
              sums.push_back(rng());
            }
            // Most puts end; some are revoked; some are left pending (their writer "died").
            const int fate = static_cast<int>(rng() % 20);
            if (ok_keys.empty()) continue;
            if (fate < 16) {
              leader.PutEnd({who, ok_keys, sums, gens});
            } else if (fate < 19) {
              leader.PutRevoke({who, ok_keys, gens, false});
            }
          } else if (pick < 90) {
            leader.Remove({keys, false});
          } else {
            clock.Advance(Millis(5));  // pending writes age into zombies
            leader.Sweep();
          }
        }
      });
    }
    for (auto& w : workers) w.join();
  }
  // Both ways of a group ran: placed as a group, and one by one after phase one's refusal.
  const uint64_t one_by_one = leader.grouped_one_by_one();
  EXPECT_GT(leader.applies_grouped() - one_by_one, 50u) << "few PutStarts were placed as a group";
  EXPECT_GT(leader.apply_parts_helped(), 0u) << "no part ran on a waiting caller's thread";
  EXPECT_GT(one_by_one, 0u) << "no group met a repeated or pending key";

  MasterState replica(GroupPolicy(), &clock);
  ASSERT_TRUE(replica.LoadSnapshot(initial).ok());
  size_t grouped_starts_compared = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    ASSERT_EQ(log[i].op.seq, i + 1) << "the history has a gap or a repeat";
    auto decoded = DecodeOperation(EncodeOperation(log[i].op));
    ASSERT_TRUE(decoded.ok());
    auto replayed = replica.Replay(*decoded);
    ASSERT_TRUE(replayed.ok()) << replayed.status().ToString();
    ASSERT_EQ(Describe(*replayed), Describe(log[i].result)) << "operation " << log[i].op.seq;
    grouped_starts_compared += std::holds_alternative<PutStartOp>(log[i].op.body);
  }
  EXPECT_GT(grouped_starts_compared, 1000u);
  EXPECT_EQ(replica.Digest(), leader.Digest()) << "the replay diverged from the grouped run";
  EXPECT_EQ(replica.pending_count(), leader.pending_count());
  EXPECT_EQ(replica.object_count(), leader.object_count());
  for (const char* tenant : {"tenant-0", "tenant-1"}) {
    EXPECT_EQ(replica.UsageOf(tenant).bytes, leader.UsageOf(tenant).bytes) << tenant;
    EXPECT_EQ(replica.UsageOf(tenant).objects, leader.UsageOf(tenant).objects) << tenant;
  }
  EXPECT_GT(leader.UsageOf("tenant-0").bytes, 0);
}

}  // namespace
}  // namespace granary::master
