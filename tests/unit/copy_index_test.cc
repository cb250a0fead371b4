// The re-replication planner's index (MasterState::ScanCopyCandidates): every walk visits exactly
// the objects that a walk over every object finds needing copies (CopiesNeeded > 0, the planner's
// rule before the index), through random puts of 1-3 replicas, upserts, removes, demotions,
// disk copies registered and dropped, evictions, replica counts up and down, copies attached,
// failed and left under way, drains (kept, dropped, finished, undone), unmounts and remounts,
// node expiry; in a standby fed by replay and in a reloaded snapshot too; and the index holds
// nothing once the objects are gone.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <tuple>

#include "common/clock.h"
#include "master/policy/evictor.h"
#include "master/policy/replica_planner.h"
#include "master/state/master_state.h"
#include "master/state/state_codec.h"

namespace granary::master {
namespace {

constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;

std::set<std::string> NeedingByWalk(const MasterState& state) {
  std::set<std::string> keys;
  for (size_t s = 0; s < state.shard_count(); ++s) {
    state.ScanShard(s, [&](std::string_view key, const ObjectMeta& meta) {
      if (state.CopiesNeeded(meta) > 0) keys.emplace(key);
    });
  }
  return keys;
}

std::set<std::string> NeedingByIndex(const MasterState& state) {
  std::set<std::string> keys;
  state.ScanCopyCandidates([&](std::string_view key, const ObjectMeta& meta) {
    EXPECT_GT(state.CopiesNeeded(meta), 0u) << key << " was visited needing nothing";
    EXPECT_TRUE(keys.emplace(key).second) << key << " was visited twice";
  });
  return keys;
}

// Five segments on four nodes (n0 has two); n0 and n1 have disks.
class CopyIndexTest : public ::testing::Test {
 protected:
  // The standby takes the leader's segment id base, as a real one does from its snapshot (and as
  // the other standby tests do): each reading the wall clock, they could start from different
  // bases and diverge (about one run in 30 failed the replayed comparison).
  CopyIndexTest()
      : state_(Policy(), &clock_), standby_(Policy(), &clock_, state_.segment_id_base()) {}
  static MasterPolicy Policy() {
    MasterPolicy p;
    p.shard_count = 16;  // several keys a shard, so erasures meet other keys' entries
    return p;
  }
  static std::string NodeOf(const std::string& segment) {
    return segment == "s0a" || segment == "s0b" ? "n0" : "n" + segment.substr(1);
  }
  void Mount(const std::string& segment) {
    const std::string node = NodeOf(segment);
    state_.Mount({node, {segment, 4 * kMiB, "127.0.0.1:1", "shm-" + segment + std::to_string(token_),
                         node, ++token_, true}});
    state_.Ping(node);
  }
  void SetUp() override {
    state_.AddObserver([&](const Operation& op, const OpResult&) {
      auto decoded = DecodeOperation(EncodeOperation(op));
      ASSERT_TRUE(decoded.ok());
      ASSERT_TRUE(standby_.Replay(*decoded).ok());
    });
    for (const std::string segment : {"s0a", "s0b", "s1", "s2", "s3"}) Mount(segment);
  }
  void Check() {
    const std::set<std::string> expected = NeedingByWalk(state_);
    ASSERT_EQ(NeedingByIndex(state_), expected) << "step " << step_;
    needing_seen_ += expected.size();
  }

  ManualClock clock_;
  MasterState state_;
  MasterState standby_;  // fed every operation by replay, as an HA standby is
  uint64_t token_ = 0;
  uint64_t step_ = 0;
  uint64_t needing_seen_ = 0;
};

TEST_F(CopyIndexTest, WalksEqualAWalkOverEveryObject) {
  const std::map<std::string, uint64_t> disks = {{"n0", 0xD0}, {"n1", 0xD1}};
  for (const auto& [node, disk] : disks) {
    ASSERT_TRUE(state_.DiskRegister({node, {}, disk, true}).empty());
  }
  const std::vector<std::string> segments = {"s0a", "s0b", "s1", "s2", "s3"};
  std::mt19937_64 rng(7);
  auto pick = [&](uint64_t n) { return rng() % n; };
  Evictor evictor(&state_);
  uint64_t location = 1;
  std::map<std::string, uint64_t> copy_rounds;  // each node's copy rounds count from 1
  std::vector<std::tuple<std::string, std::string, uint64_t, uint64_t>> copies;  // node, key, gen, round
  uint64_t drains = 0;
  for (step_ = 0; step_ < 4000; ++step_) {
    clock_.Advance(Millis(1 + pick(5)));
    const std::string key = "key-" + std::to_string(pick(150));
    const std::string segment = segments[pick(segments.size())];
    switch (pick(16)) {
      case 0:
      case 1:
      case 2: {  // a put or an upsert of 1-3 replicas (fewer when segments are full)
        PlacementConfig c;
        c.persistence = static_cast<PutPersistence>(pick(4));
        c.replica_num = 1 + static_cast<uint32_t>(pick(3));
        auto s = state_.PutStart({"w", {key}, {(1 + pick(24)) * 8 * kKiB}, c, pick(2) == 0})[0];
        if (s.status.ok()) state_.PutEnd({"w", {key}, {step_}, {s.put_gen}});
        break;
      }
      case 3:
        state_.Remove({{key}, true});
        break;
      case 4: {  // a node with a disk writes a copy of the key there
        const std::string node = pick(2) == 0 ? "n0" : "n1";
        auto d = state_.DemoteStart({node, {key}, disks.at(node)})[0];
        if (!d.status.ok()) break;
        if (pick(4) == 0) {
          state_.DemoteAbort({node, {key}, {d.version_gen}});
        } else {
          state_.DemoteEnd({node, {key}, {d.version_gen}, {location++}, disks.at(node)});
        }
        break;
      }
      case 5: {  // a disk drops a copy, or registers one again (a node's restart scan)
        auto stat = state_.Stat(key);
        if (!stat.ok() || stat->disk.empty()) break;
        const DiskReplica d = stat->disk[pick(stat->disk.size())];
        if (pick(2) == 0) {
          state_.DiskDrop({d.node_id, {key}, {d.location}});
        } else {
          state_.DiskRegister(
              {d.node_id, {{key, stat->size, stat->checksum, d.location}}, d.disk_id, false});
        }
        break;
      }
      case 6:
        evictor.EvictBytes((1 + pick(8)) * 64 * kKiB);
        break;
      case 7: {  // replica counts up or down
        state_.SetReplicas({{key}, 1 + static_cast<uint32_t>(pick(3))});
        break;
      }
      case 8:
      case 9: {  // a node starts a copy; it attaches, fails, or stays under way
        const std::string node = "n" + std::to_string(pick(4));
        const uint64_t round = ++copy_rounds[node];
        auto copy = state_.ReplicaCopyStart({node, {key}, round})[0];
        if (!copy.status.ok()) break;
        switch (pick(3)) {
          case 0:
            state_.ReplicaCopyEnd({node, round, {key}, {copy.version_gen}, {1}});
            break;
          case 1:
            state_.ReplicaCopyEnd({node, round, {key}, {copy.version_gen}, {0}});
            break;
          default:
            copies.emplace_back(node, key, copy.version_gen, round);
        }
        break;
      }
      case 10:
        if (!copies.empty()) {  // a copy left under way ends
          const size_t i = pick(copies.size());
          const auto [node, copied_key, gen, round] = copies[i];
          copies.erase(copies.begin() + static_cast<std::ptrdiff_t>(i));
          state_.ReplicaCopyEnd({node, round, {copied_key}, {gen}, {static_cast<uint8_t>(pick(2))}});
        }
        break;
      case 11:
        if (pick(6) == 0) {  // a drain starts (rarely dropping what it holds)
          if (state_.Drain({segment, pick(5) == 0, false}).status.ok()) drains++;
        }
        break;
      case 12:
        if (pick(4) == 0) {  // a drain is undone, or finishes (its segment unmounted)
          if (pick(2) == 0) {
            state_.Drain({segment, false, true});
          } else {
            state_.DrainFinish({segment});
          }
        }
        break;
      case 13:
        if (pick(10) == 0) {  // a segment goes (its node lost it) and comes back empty
          state_.Unmount({NodeOf(segment), segment});
          Mount(segment);
        } else if (pick(3) == 0) {
          Mount(segment);  // a drained segment's name is refused until undrained
        }
        break;
      default:
        Check();
        break;
    }
  }
  Check();
  EXPECT_GT(needing_seen_, 200u) << "nothing ever needed copies: the comparison proves little";
  EXPECT_GT(drains, 3u);

  // The standby that replayed every operation, and a reloaded snapshot, walk the same objects.
  EXPECT_EQ(NeedingByIndex(standby_), NeedingByWalk(standby_));
  EXPECT_EQ(NeedingByIndex(standby_), NeedingByWalk(state_));
  ManualClock clock2;
  clock2.Advance(Millis(clock_.NowMs()));
  MasterState reloaded(Policy(), &clock2);
  ASSERT_TRUE(reloaded.LoadSnapshot(state_.EncodeSnapshot()).ok());
  EXPECT_EQ(NeedingByIndex(reloaded), NeedingByWalk(state_));

  // n1 expires while n0's first segment drains: n1's disk copies go, and what is left only on
  // n0's disk needs a memory copy once n0's other segment goes too.
  for (const std::string segment : {"s0a", "s0b"}) {
    state_.Drain({segment, false, true});  // undone, if under way or done
    Mount(segment);
  }
  ASSERT_TRUE(state_.Drain({"s0a", false, false}).status.ok());
  Check();
  clock_.Advance(Millis(state_.policy().client_ttl_ms + 1));
  for (const std::string node : {"n0", "n2", "n3", "w"}) state_.Ping(node);
  state_.ExpireClient("n1");
  Check();
  state_.Unmount({"n0", "s0b"});
  Check();

  // Nothing stays listed for objects that are gone.
  for (const auto& [node, copied_key, gen, round] : copies) {
    state_.ReplicaCopyEnd({node, round, {copied_key}, {gen}, {0}});
  }
  state_.RemoveAll({true});
  clock_.Advance(Millis(state_.policy().put_release_timeout_ms + 1));
  state_.Sweep();
  Check();
  EXPECT_EQ(state_.object_count(), 0u);
  EXPECT_EQ(state_.copy_index_size(), 0u) << "the index kept keys of erased objects";
}

// An object no loss touched is never visited: the planner's walk after a node's death costs what
// that node held, not every object.
TEST_F(CopyIndexTest, AWalkVisitsWhatALostNodeHeldNotEveryObject) {
  PlacementConfig two;
  two.replica_num = 2;
  for (int i = 0; i < 400; ++i) {
    PlacementConfig c = i % 4 == 0 ? two : PlacementConfig{};
    const std::string key = "k" + std::to_string(i);
    auto s = state_.PutStart({"w", {key}, {4 * kKiB}, c, false})[0];
    ASSERT_TRUE(s.status.ok());
    ASSERT_TRUE(state_.PutEnd({"w", {key}, {1}, {s.put_gen}})[0].ok());
  }
  EXPECT_EQ(state_.copy_index_size(), 0u) << "objects with their replicas were listed";
  state_.Unmount({"n2", "s2"});
  const std::set<std::string> needing = NeedingByWalk(state_);
  EXPECT_GT(needing.size(), 5u);
  EXPECT_LT(needing.size(), 100u);
  EXPECT_EQ(state_.copy_index_size(), needing.size());
  EXPECT_EQ(NeedingByIndex(state_), needing);
  ReplicaPlanner planner(&state_, 1e6);
  planner.Take("n3", 1000, 1000);  // the rate's budget starts here, empty
  auto taken = planner.Take("n3", 1000, 2000);
  std::set<std::string> handed(taken.begin(), taken.end());
  for (const auto& key : handed) EXPECT_TRUE(needing.count(key)) << key;
  ASSERT_FALSE(taken.empty());
  auto copies = state_.ReplicaCopyStart({"n3", taken, 1});
  std::vector<uint64_t> gens;
  for (const auto& c : copies) gens.push_back(c.version_gen);
  state_.ReplicaCopyEnd({"n3", 1, taken, gens, std::vector<uint8_t>(taken.size(), 1)});
  // One more walk drops what was copied; the rest stays for nodes that can take it.
  const std::set<std::string> still = NeedingByWalk(state_);
  EXPECT_EQ(NeedingByIndex(state_), still);
  EXPECT_EQ(state_.copy_index_size(), still.size());
}

}  // namespace
}  // namespace granary::master
