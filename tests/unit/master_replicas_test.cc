// Replica counts, re-replication copies and drains in the master's model (operations.h:
// SetReplicasOp, ReplicaCopyStartOp/EndOp, DrainOp, DrainFinishOp): a copy is never named to a
// reader before its end attaches it to the version it copied; space a copying node may still
// write is freed only by its report, its next round or its segment's unmount; a drained segment
// takes no allocation and its name no mount. Replay and snapshots reproduce all of it.
#include <gtest/gtest.h>

#include "master/policy/replica_planner.h"
#include "master/state/master_state.h"
#include "master/state/state_codec.h"

namespace granary::master {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kKiB = 1 << 10;

MasterPolicy Policy() {
  MasterPolicy p;
  p.eviction_policy = EvictionPolicy::kLru;
  return p;
}

class MasterReplicasTest : public ::testing::Test {
 protected:
  MasterReplicasTest() : state_(Policy(), &clock_) {
    for (int i = 0; i < 3; ++i) Mount(i);
  }
  void Mount(int i) {
    const std::string n = std::to_string(i);
    ASSERT_TRUE(state_
                    .Mount({"node" + n,
                            {"seg" + n, 4 * kMiB, "127.0.0.1:" + n, "granary-seg" + n, "h", 1,
                             true}})
                    .status.ok());
  }
  uint64_t SegmentId(int i) { return state_.segments().FindByName("seg" + std::to_string(i))->id; }
  void Put(const std::string& key, uint32_t replicas, uint64_t size = 64 * kKiB) {
    PlacementConfig config;
    config.replica_num = replicas;
    auto put = state_.PutStart({"w", {key}, {size}, config, false})[0];
    ASSERT_TRUE(put.status.ok()) << put.status.ToString();
    ASSERT_TRUE(state_.PutEnd({"w", {key}, {77}, {put.put_gen}})[0].ok());
  }
  size_t Replicas(const std::string& key) { return state_.Stat(key)->replicas.size(); }
  // The node holding none of key's replicas.
  std::string Outsider(const std::string& key) {
    auto st = state_.Stat(key);
    for (int i = 0; i < 3; ++i) {
      bool holds = false;
      for (const auto& e : st->replicas) holds |= e.segment_id == SegmentId(i);
      if (!holds) return "node" + std::to_string(i);
    }
    return "";
  }

  ManualClock clock_;
  MasterState state_;
};

TEST_F(MasterReplicasTest, RaiseIsCopiedAndAttachedOnlyAtTheEnd) {
  Put("k", 1);
  EXPECT_EQ(state_.Stat("k")->want_replicas, 1u);
  ASSERT_TRUE(state_.SetReplicas({{"k"}, 2})[0].ok());
  EXPECT_EQ(state_.Stat("k")->want_replicas, 2u);
  EXPECT_EQ(Replicas("k"), 1u) << "a raise allocates nothing until a node copies";
  const std::string target = Outsider("k");
  const uint64_t used = state_.segments().used_bytes();
  auto started = state_.ReplicaCopyStart({target, {"k"}, 1})[0];
  ASSERT_TRUE(started.status.ok()) << started.status.ToString();
  EXPECT_EQ(started.sources.size(), 1u);
  EXPECT_GT(state_.segments().used_bytes(), used) << "the copy's allocation counts as used";
  // Until the end, readers are named only the old replica.
  auto read = state_.GetReplicaList({"reader", {"k"}})[0];
  ASSERT_EQ(read.replicas.size(), 1u);
  EXPECT_NE(read.replicas[0].offset + (read.replicas[0].segment_id << 32),
            started.extent.offset + (started.extent.segment_id << 32));
  EXPECT_TRUE(state_.Stat("k")->copying);
  // A second node asking for the same key gets nothing: one copy at a time.
  EXPECT_FALSE(state_.ReplicaCopyStart({"other", {"k"}, 1})[0].status.ok());
  // Another round's or another node's end is refused and changes nothing.
  EXPECT_EQ(state_.ReplicaCopyEnd({target, 2, {"k"}, {started.version_gen}, {1}})[0].code(),
            ErrorCode::ILLEGAL_CLIENT);
  ASSERT_TRUE(state_.ReplicaCopyEnd({target, 1, {"k"}, {started.version_gen}, {1}})[0].ok());
  EXPECT_EQ(Replicas("k"), 2u);
  EXPECT_FALSE(state_.Stat("k")->copying);
  EXPECT_EQ(state_.copies_attached(), 1u);
  // Enough now: no more copies are started.
  EXPECT_EQ(state_.ReplicaCopyStart({Outsider("k"), {"k"}, 1})[0].status.code(),
            ErrorCode::OBJECT_ALREADY_EXISTS);
}

TEST_F(MasterReplicasTest, NodeHoldingAReplicaIsNotAskedAndLowerDropsSurplusAtOnce) {
  Put("k", 3);
  ASSERT_EQ(Replicas("k"), 3u);
  ASSERT_TRUE(state_.SetReplicas({{"k"}, 4})[0].ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(state_.ReplicaCopyStart({"node" + std::to_string(i), {"k"}, 1})[0].status.code(),
              ErrorCode::OBJECT_ALREADY_EXISTS)
        << "a node got a second replica of one object";
  }
  const uint64_t used = state_.segments().used_bytes();
  ASSERT_TRUE(state_.SetReplicas({{"k"}, 1})[0].ok());
  EXPECT_EQ(Replicas("k"), 1u);
  EXPECT_LT(state_.segments().used_bytes(), used) << "unlocked surplus freed at once";
  // Bad counts and keys.
  EXPECT_EQ(state_.SetReplicas({{"k"}, 0})[0].code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(state_.SetReplicas({{"k"}, kMaxReplicas + 1})[0].code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(state_.SetReplicas({{"missing"}, 2})[0].code(), ErrorCode::OBJECT_NOT_FOUND);
}

TEST_F(MasterReplicasTest, ReadLockedSurplusWaitsForTheLock) {
  Put("k", 2);
  ASSERT_TRUE(state_.GetReplicaList({"reader", {"k"}})[0].status.ok());  // locked, not finished
  const size_t deferred = state_.deferred_free_count();
  ASSERT_TRUE(state_.SetReplicas({{"k"}, 1})[0].ok());
  EXPECT_EQ(state_.deferred_free_count(), deferred + 1) << "a reader's replica freed under it";
}

TEST_F(MasterReplicasTest, UnreportedCopyIsFreedByTheNextRoundNotBefore) {
  Put("k", 1);
  ASSERT_TRUE(state_.SetReplicas({{"k"}, 2})[0].ok());
  const std::string target = Outsider("k");
  const uint64_t before = state_.segments().used_bytes();
  ASSERT_TRUE(state_.ReplicaCopyStart({target, {"k"}, 1})[0].status.ok());
  clock_.Advance(std::chrono::hours(1));
  state_.Sweep();
  EXPECT_GT(state_.segments().used_bytes(), before) << "swept while the node may still write";
  EXPECT_EQ(state_.CopiesOf(target), 1u);
  // The node's next round: round 1 is over, its allocation goes back.
  state_.ReplicaCopyStart({target, {}, 2});
  EXPECT_EQ(state_.segments().used_bytes(), before);
  EXPECT_EQ(state_.CopiesOf(target), 0u);
  // A promotion round of the same node does not end copies (and the reverse).
  ASSERT_TRUE(state_.ReplicaCopyStart({target, {"k"}, 3})[0].status.ok());
  state_.PromoteStart({target, {}, 1, 99});
  EXPECT_EQ(state_.CopiesOf(target), 1u);
}

TEST_F(MasterReplicasTest, CopyOfAReplacedVersionIsFreedNotAttached) {
  Put("k", 1);
  ASSERT_TRUE(state_.SetReplicas({{"k"}, 2})[0].ok());
  const std::string target = Outsider("k");
  auto started = state_.ReplicaCopyStart({target, {"k"}, 1})[0];
  ASSERT_TRUE(started.status.ok());
  ASSERT_TRUE(state_.Remove({{"k"}, true})[0].ok());
  Put("k", 1);  // another version
  EXPECT_EQ(state_.ReplicaCopyEnd({target, 1, {"k"}, {started.version_gen}, {1}})[0].code(),
            ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(Replicas("k"), 1u);
}

TEST_F(MasterReplicasTest, DrainTakesNoAllocationsCountsItsReplicasAsMissingAndRefusesItsName) {
  Put("k", 1);
  const auto st = state_.Stat("k");
  int holder = -1;
  for (int i = 0; i < 3; ++i) {
    if (st->replicas[0].segment_id == SegmentId(i)) holder = i;
  }
  ASSERT_GE(holder, 0);
  const std::string name = "seg" + std::to_string(holder);
  const uint64_t holder_id = SegmentId(holder);
  ASSERT_TRUE(state_.Drain({name, false, false}).status.ok());
  EXPECT_EQ(state_.Drain({name, false, false}).status.code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  for (int i = 0; i < 20; ++i) {
    Put("new" + std::to_string(i), 1);
    EXPECT_NE(state_.Stat("new" + std::to_string(i))->replicas[0].segment_id, SegmentId(holder))
        << "a put landed on a draining segment";
  }
  // Its replica counts as missing: an outsider copies it.
  const std::string target = Outsider("k");
  auto copy = state_.ReplicaCopyStart({target, {"k"}, 1})[0];
  ASSERT_TRUE(copy.status.ok()) << copy.status.ToString();
  ASSERT_TRUE(state_.ReplicaCopyEnd({target, 1, {"k"}, {copy.version_gen}, {1}})[0].ok());
  EXPECT_EQ(Replicas("k"), 2u);
  ReplicaPlanner planner(&state_);
  EXPECT_EQ(planner.FinishedDrains(clock_.NowMs() + 1), std::vector<std::string>{name});
  auto finished = state_.DrainFinish({name});
  ASSERT_TRUE(finished.status.ok());
  EXPECT_EQ(Replicas("k"), 1u);
  EXPECT_NE(state_.Stat("k")->replicas[0].segment_id, holder_id);
  // The name is refused until undrained.
  EXPECT_EQ(state_.Mount({"node" + std::to_string(holder),
                          {name, 4 * kMiB, "127.0.0.1:9", "granary-x", "h", 5, true}})
                .status.code(),
            ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  ASSERT_TRUE(state_.Drain({name, false, true}).status.ok());
  EXPECT_TRUE(state_.Mount({"node" + std::to_string(holder),
                            {name, 4 * kMiB, "127.0.0.1:9", "granary-x", "h", 5, true}})
                  .status.ok());
}

TEST_F(MasterReplicasTest, ReplayAndSnapshotReproduceCopiesAndDrains) {
  MasterState replica(Policy(), &clock_, state_.segment_id_base());
  ASSERT_TRUE(replica.LoadSnapshot(state_.EncodeSnapshot()).ok());  // the fixture's mounts
  state_.AddObserver([&](const Operation& op, const OpResult&) {
    auto decoded = DecodeOperation(EncodeOperation(op));
    ASSERT_TRUE(decoded.ok());
    ASSERT_TRUE(replica.Replay(*decoded).ok());
  });
  Put("a", 1);
  Put("b", 2);
  ASSERT_TRUE(state_.SetReplicas({{"a", "b"}, 3})[0].ok());
  ASSERT_TRUE(state_.ReplicaCopyStart({Outsider("a"), {"a"}, 1})[0].status.ok());
  ASSERT_TRUE(state_.Drain({"seg2", false, false}).status.ok());
  EXPECT_EQ(replica.Digest(), state_.Digest());
  MasterState loaded(Policy(), &clock_);
  ASSERT_TRUE(loaded.LoadSnapshot(state_.EncodeSnapshot()).ok());
  EXPECT_EQ(loaded.Digest(), state_.Digest());
  EXPECT_EQ(loaded.copies_in_flight(), 1u);
  EXPECT_TRUE(loaded.segments().IsDraining(loaded.segments().FindByName("seg2")->id));
  EXPECT_EQ(loaded.Stat("b")->want_replicas, 3u);
  ASSERT_TRUE(state_.DrainFinish({"seg2"}).status.ok());
  EXPECT_EQ(replica.Digest(), state_.Digest());
  ASSERT_TRUE(loaded.LoadSnapshot(state_.EncodeSnapshot()).ok());
  EXPECT_EQ(loaded.Digest(), state_.Digest());
}

TEST_F(MasterReplicasTest, PlannerHandsOutOnlyWhatANodeCanTakeAndIdlesWithoutScanning) {
  for (int i = 0; i < 10; ++i) Put("p" + std::to_string(i), 1);
  ReplicaPlanner planner(&state_, 1e6);
  EXPECT_TRUE(planner.Take("node0", 100, 1000).empty());
  const uint64_t scans = planner.GetStats().scans;
  EXPECT_TRUE(planner.Take("node0", 100, 1001).empty());
  EXPECT_EQ(planner.GetStats().scans, scans) << "scanned again with nothing changed";
  std::vector<std::string> keys;
  for (int i = 0; i < 10; ++i) keys.push_back("p" + std::to_string(i));
  ASSERT_TRUE(state_.SetReplicas({keys, 2})[0].ok());
  auto taken = planner.Take("node0", 100, 1002);
  for (const auto& k : taken) {
    auto stat = state_.Stat(k);  // held: a range over the temporary's member would dangle
    ASSERT_TRUE(stat.ok()) << k;
    for (const auto& e : stat->replicas) EXPECT_NE(e.segment_id, SegmentId(0)) << k;
  }
  EXPECT_EQ(planner.GetStats().backlog_objects + taken.size(), 10u);
}

TEST_F(MasterReplicasTest, WorkNoNodeCanTakeIsNotRescannedUntilTheStateMoves) {
  Put("x", 3);  // on all three nodes
  ASSERT_TRUE(state_.SetReplicas({{"x"}, 4})[0].ok());
  ReplicaPlanner planner(&state_, 1e6);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(planner.Take("node" + std::to_string(i), 10, 1000 + i).empty());
  }
  const uint64_t scans = planner.GetStats().scans;
  EXPECT_EQ(planner.GetStats().backlog_objects, 1u);
  EXPECT_TRUE(planner.Take("node0", 10, 1000 + 10 * ReplicaPlanner::kRescanMs).empty());
  EXPECT_EQ(planner.GetStats().scans, scans) << "rescanned work no node could take";
  Mount(3);  // a node that can take it: the epoch moves
  EXPECT_EQ(planner.Take("node3", 10, 1000 + 11 * ReplicaPlanner::kRescanMs),
            std::vector<std::string>{"x"});
}

}  // namespace
}  // namespace granary::master

namespace granary::master {
namespace {

// Load-aware placement: a node that joins empty gets more than a rotation's share of new puts
// (it has the most room) but not every one (Mooncake's #3688: a rejoining node took them all).
TEST(PlacementTest, EmptyJoinerGetsMoreThanItsShareButNotEverything) {
  ManualClock clock;
  MasterState state(Policy(), &clock);
  for (int i = 0; i < 3; ++i) {
    const std::string n = std::to_string(i);
    ASSERT_TRUE(state.Mount({"node" + n, {"seg" + n, 8 * kMiB, "e", "s" + n, "h", 1, true}})
                    .status.ok());
  }
  for (int i = 0; i < 48; ++i) {  // 3 MiB on the three: about half of each
    auto put = state.PutStart({"w", {"old" + std::to_string(i)}, {192 * kKiB}, {}, false})[0];
    ASSERT_TRUE(put.status.ok());
  }
  ASSERT_TRUE(state.Mount({"node3", {"seg3", 8 * kMiB, "e", "s3", "h", 1, true}}).status.ok());
  const uint64_t joiner = state.segments().FindByName("seg3")->id;
  int on_joiner = 0;
  const int puts = 40;
  for (int i = 0; i < puts; ++i) {
    auto put = state.PutStart({"w", {"new" + std::to_string(i)}, {16 * kKiB}, {}, false})[0];
    ASSERT_TRUE(put.status.ok());
    on_joiner += put.replicas[0].segment_id == joiner;
  }
  EXPECT_GT(on_joiner, puts / 4 + 2) << "no more than a rotation's share";
  EXPECT_LT(on_joiner, puts) << "the empty node took every new put";
}

}  // namespace
}  // namespace granary::master
