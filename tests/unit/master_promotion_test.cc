// Promotion (disk -> memory) in the master's model: the tracker counts reads of disk-only
// versions and queues them at --promote-after; PromoteStart allocates in the node's own segment
// (an incomplete replica no reader sees), PromoteEnd attaches it only for the still-committed
// version, and space a node may still write is freed only by the node's report, its next round,
// or its segment's unmount. Replay and snapshots reproduce all of it.
#include <gtest/gtest.h>

#include "master/policy/evictor.h"
#include "master/state/master_state.h"
#include "master/policy/promotion_tracker.h"
#include "master/state/state_codec.h"

namespace granary::master {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kDisk = 0xD15C;

MasterPolicy Policy() {
  MasterPolicy p;
  p.eviction_policy = EvictionPolicy::kLru;
  return p;
}

// "node" mounts a fresh 2 MiB segment and its disk registers an empty inventory.
void MountNodeWithDisk(MasterState& state) {
  ASSERT_TRUE(state.Mount({"node", {"seg", 2 * kMiB, "127.0.0.1:1", "granary-seg", "h", 1, true}})
                  .status.ok());
  state.Ping("node");
  ASSERT_TRUE(state.DiskRegister({"node", {}, kDisk, true}).empty());
}

class MasterPromotionTest : public ::testing::Test {
 protected:
  MasterPromotionTest() : state_(Policy(), &clock_) { MountNodeWithDisk(state_); }
  // `key` of `size` bytes exists on the node's disk only (at `location`), as after eviction.
  void OnDiskOnly(const std::string& key, uint64_t size, uint64_t location,
                  MasterState* state = nullptr) {
    MasterState& s = state ? *state : state_;
    auto put = s.PutStart({"w", {key}, {size}, {}, false})[0];
    ASSERT_TRUE(put.status.ok()) << put.status.ToString();
    ASSERT_TRUE(s.PutEnd({"w", {key}, {1000 + location}, {put.put_gen}})[0].ok());
    auto demote = s.DemoteStart({"node", {key}, kDisk})[0];
    ASSERT_TRUE(demote.status.ok()) << demote.status.ToString();
    ASSERT_TRUE(s.DemoteEnd({"node", {key}, {demote.version_gen}, {location}, kDisk})[0].ok());
    Evictor evictor(&s);
    evictor.EvictBytes(2 * kMiB);
    auto stat = s.Stat(key);
    ASSERT_TRUE(stat.ok());
    ASSERT_TRUE(stat->replicas.empty());
    ASSERT_EQ(stat->disk.size(), 1u);
  }
  ReadKeyResult Read(const std::string& key) {
    auto r = state_.GetReplicaList({"reader", {key}})[0];
    EXPECT_TRUE(state_.FinishRead({"reader", {key}})[0].ok());
    return r;
  }
  uint64_t Used() const { return state_.segments().used_bytes(); }

  ManualClock clock_;
  MasterState state_;
};

TEST_F(MasterPromotionTest, ReadsCountOnlyWhileDiskOnlyAndQueueAtTheThreshold) {
  PromotionTracker tracker(3);
  auto put = state_.PutStart({"w", {"mem"}, {64 * kKiB}, {}, false})[0];
  ASSERT_TRUE(state_.PutEnd({"w", {"mem"}, {7}, {put.put_gen}})[0].ok());
  for (int i = 0; i < 5; ++i) tracker.NoteRead("mem", Read("mem"));
  EXPECT_EQ(tracker.reads("mem", put.put_gen), 0u) << "a read from memory counted";
  EXPECT_EQ(tracker.due("node"), 0u);

  OnDiskOnly("k", 64 * kKiB, 5);
  const uint64_t gen = Read("k").version_gen;
  ASSERT_NE(gen, 0u);
  tracker.NoteRead("k", Read("k"));
  tracker.NoteRead("k", Read("k"));
  EXPECT_EQ(tracker.reads("k", gen), 2u);
  EXPECT_EQ(tracker.due("node"), 0u) << "queued below the threshold";
  tracker.NoteRead("k", Read("k"));
  EXPECT_EQ(tracker.due("node"), 1u);
  EXPECT_EQ(tracker.reads("k", gen), 0u) << "the count goes once queued";
  tracker.NoteRead("k", Read("k"));
  tracker.NoteRead("k", Read("k"));
  tracker.NoteRead("k", Read("k"));
  EXPECT_EQ(tracker.due("node"), 1u) << "a key is queued once";
  EXPECT_TRUE(tracker.Take("other-node", 10).empty());
  EXPECT_EQ(tracker.Take("node", 10), std::vector<std::string>{"k"});
  EXPECT_EQ(tracker.due("node"), 0u);

  // A failed answer does not count; a new version starts from zero.
  ReadKeyResult failed = Read("k");
  failed.status = Status(ErrorCode::OBJECT_NOT_FOUND, "unreachable");
  tracker.NoteRead("k", failed);
  EXPECT_EQ(tracker.reads("k", gen), 0u);
  tracker.NoteRead("k", Read("k"));
  ReadKeyResult newer = Read("k");
  newer.version_gen = gen + 100;
  tracker.NoteRead("k", newer);
  EXPECT_EQ(tracker.reads("k", gen), 0u);
  EXPECT_EQ(tracker.reads("k", gen + 100), 1u);
}

// Queues of nodes that died are never taken: all queues together stay under kMaxDueTotal, and
// taking keys makes room again.
TEST_F(MasterPromotionTest, QueuedKeysAreBoundedAcrossNodes) {
  PromotionTracker tracker(1);
  OnDiskOnly("k", 64 * kKiB, 5);
  ReadKeyResult answer = Read("k");
  ASSERT_FALSE(answer.disk.empty());
  const size_t per_node = 1000;
  const size_t nodes = PromotionTracker::kMaxDueTotal / per_node + 10;
  for (size_t n = 0; n < nodes; ++n) {
    answer.disk.front().node_id = "dead-" + std::to_string(n);
    for (size_t i = 0; i < per_node; ++i) tracker.NoteRead("key-" + std::to_string(i), answer);
  }
  EXPECT_EQ(tracker.due_total(), PromotionTracker::kMaxDueTotal);
  EXPECT_EQ(tracker.due("dead-" + std::to_string(nodes - 1)), 0u) << "queued past the bound";
  EXPECT_EQ(tracker.Take("dead-0", per_node).size(), per_node);
  EXPECT_EQ(tracker.due_total(), PromotionTracker::kMaxDueTotal - per_node);
  answer.disk.front().node_id = "live";
  tracker.NoteRead("fresh", answer);
  EXPECT_EQ(tracker.due("live"), 1u) << "taking keys did not make room";
}

TEST_F(MasterPromotionTest, ZeroDisablesPromotion) {
  PromotionTracker tracker(0);
  EXPECT_FALSE(tracker.enabled());
  OnDiskOnly("k", 64 * kKiB, 5);
  for (int i = 0; i < 100; ++i) tracker.NoteRead("k", Read("k"));
  EXPECT_EQ(tracker.due("node"), 0u);
  EXPECT_TRUE(tracker.Take("node", 10).empty());
}

TEST_F(MasterPromotionTest, TheItemQuotesTheAllocationAndTheEndAttachesIt) {
  OnDiskOnly("k", 100 * kKiB, 5);
  ASSERT_EQ(Used(), 0u);
  auto started = state_.PromoteStart({"node", {"k"}, kDisk, 1})[0];
  ASSERT_TRUE(started.status.ok()) << started.status.ToString();
  EXPECT_EQ(started.size, 100 * kKiB);
  EXPECT_EQ(started.checksum, 1005u);
  EXPECT_EQ(started.location, 5u);
  EXPECT_EQ(started.extent.length, 100 * kKiB);
  EXPECT_EQ(started.extent.segment_id, state_.segments().SegmentsOf("node").at(0));
  EXPECT_EQ(Used(), OccupiedBytes({started.extent})) << "the allocation is not held";
  EXPECT_TRUE(state_.Stat("k")->promoting);
  EXPECT_EQ(state_.PromotionsOf("node"), 1u);
  // While the node copies, readers keep the disk replica: the allocation is never named.
  auto during = Read("k");
  EXPECT_TRUE(during.replicas.empty());
  EXPECT_EQ(during.disk.size(), 1u);
  // A second start of the same key, any round, is refused.
  EXPECT_EQ(state_.PromoteStart({"node", {"k"}, kDisk, 1})[0].status.code(),
            ErrorCode::OBJECT_ALREADY_EXISTS);
  // Another node, or another round, cannot end it.
  EXPECT_EQ(state_.PromoteEnd({"intruder", 1, {"k"}, {started.version_gen}, {1}})[0].code(),
            ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(state_.PromoteEnd({"node", 7, {"k"}, {started.version_gen}, {1}})[0].code(),
            ErrorCode::ILLEGAL_CLIENT);
  ASSERT_TRUE(state_.PromoteEnd({"node", 1, {"k"}, {started.version_gen}, {1}})[0].ok());

  auto after = Read("k");
  ASSERT_EQ(after.replicas.size(), 1u) << "the memory replica was not attached";
  EXPECT_EQ(after.replicas[0].offset, started.extent.offset);
  EXPECT_EQ(after.replicas[0].segment_id, started.extent.segment_id);
  EXPECT_EQ(after.disk.size(), 1u) << "the disk copy stays";
  EXPECT_FALSE(state_.Stat("k")->promoting);
  EXPECT_EQ(state_.PromotionsOf("node"), 0u);
  // Now in memory: reads no longer count, a promotion is refused, and eviction demotes it again.
  PromotionTracker tracker(1);
  tracker.NoteRead("k", after);
  EXPECT_EQ(tracker.due("node"), 0u);
  EXPECT_EQ(state_.PromoteStart({"node", {"k"}, kDisk, 2})[0].status.code(),
            ErrorCode::OBJECT_ALREADY_EXISTS);
  Evictor evictor(&state_);
  EXPECT_EQ(evictor.EvictBytes(kMiB).objects, 1u);
  EXPECT_EQ(Used(), 0u);
  EXPECT_EQ(state_.BatchExist({"k"})[0], 1);
}

TEST_F(MasterPromotionTest, ANodeThatDidNotCopyGivesTheSpaceBack) {
  OnDiskOnly("k", 100 * kKiB, 5);
  auto started = state_.PromoteStart({"node", {"k"}, kDisk, 1})[0];
  ASSERT_TRUE(started.status.ok());
  ASSERT_TRUE(state_.PromoteEnd({"node", 1, {"k"}, {started.version_gen}, {0}})[0].ok());
  EXPECT_EQ(Used(), 0u);
  EXPECT_TRUE(Read("k").replicas.empty());
  EXPECT_FALSE(state_.Stat("k")->promoting);
}

TEST_F(MasterPromotionTest, ARemoveDuringAPromotionRefusesTheCommitAndFreesTheSpace) {
  OnDiskOnly("k", 100 * kKiB, 5);
  auto started = state_.PromoteStart({"node", {"k"}, kDisk, 1})[0];
  ASSERT_TRUE(started.status.ok());
  ASSERT_TRUE(state_.Remove({{"k"}, false})[0].ok());
  EXPECT_EQ(state_.BatchExist({"k"})[0], 0);
  EXPECT_EQ(state_.Stat("k").status().code(), ErrorCode::OBJECT_NOT_FOUND);
  // The node may still be writing: the space stays held until it says it is done.
  EXPECT_EQ(Used(), OccupiedBytes({started.extent}));
  EXPECT_EQ(state_.PromoteEnd({"node", 1, {"k"}, {started.version_gen}, {1}})[0].code(),
            ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(Used(), 0u);
  EXPECT_EQ(state_.BatchExist({"k"})[0], 0) << "the promotion brought a removed object back";
  // A new put of the key is unaffected.
  auto put = state_.PutStart({"w", {"k"}, {10 * kKiB}, {}, false})[0];
  ASSERT_TRUE(put.status.ok());
  ASSERT_TRUE(state_.PutEnd({"w", {"k"}, {9}, {put.put_gen}})[0].ok());
  EXPECT_EQ(Read("k").checksum, 9u);
}

TEST_F(MasterPromotionTest, AnUpsertCommittedDuringAPromotionWins) {
  OnDiskOnly("k", 100 * kKiB, 5);
  auto started = state_.PromoteStart({"node", {"k"}, kDisk, 1})[0];
  ASSERT_TRUE(started.status.ok());
  auto upsert = state_.PutStart({"w", {"k"}, {50 * kKiB}, {}, true})[0];
  ASSERT_TRUE(upsert.status.ok());
  ASSERT_TRUE(state_.PutEnd({"w", {"k"}, {77}, {upsert.put_gen}})[0].ok());
  EXPECT_EQ(state_.PromoteEnd({"node", 1, {"k"}, {started.version_gen}, {1}})[0].code(),
            ErrorCode::OBJECT_NOT_FOUND);
  auto read = Read("k");
  EXPECT_EQ(read.checksum, 77u);
  ASSERT_EQ(read.replicas.size(), 1u);
  EXPECT_EQ(read.replicas[0].length, 50 * kKiB) << "the old version's bytes became a replica";
  EXPECT_EQ(Used(), OccupiedBytes(read.replicas)) << "the promotion's space leaked";
}

TEST_F(MasterPromotionTest, RemoveAllAndRemoveByRegexDuringPromotionsLeakNothing) {
  OnDiskOnly("a/1", 100 * kKiB, 5);
  OnDiskOnly("b/1", 100 * kKiB, 6);
  auto started = state_.PromoteStart({"node", {"a/1", "b/1"}, kDisk, 1});
  ASSERT_TRUE(started[0].status.ok());
  ASSERT_TRUE(started[1].status.ok());
  EXPECT_EQ(state_.RemoveByRegex({"^a/", false}).removed, 1u);
  EXPECT_EQ(state_.RemoveAll({false}).removed, 1u);
  EXPECT_EQ(Used(), OccupiedBytes({started[0].extent, started[1].extent}));
  // One is reported, the other never is: the next round frees it.
  EXPECT_EQ(state_.PromoteEnd({"node", 1, {"a/1"}, {started[0].version_gen}, {1}})[0].code(),
            ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(Used(), OccupiedBytes({started[1].extent}));
  state_.PromoteStart({"node", {}, kDisk, 2});
  EXPECT_EQ(Used(), 0u);
  EXPECT_EQ(state_.PromotionsOf("node"), 0u);
  EXPECT_EQ(state_.BatchExist({"a/1", "b/1"}), (std::vector<int32_t>{0, 0}));
}

TEST_F(MasterPromotionTest, AnUnreportedPromotionIsFreedByTheNodesNextRoundNotBefore) {
  OnDiskOnly("k", 100 * kKiB, 5);
  auto started = state_.PromoteStart({"node", {"k"}, kDisk, 3})[0];
  ASSERT_TRUE(started.status.ok());
  const uint64_t held = OccupiedBytes({started.extent});
  // Time alone frees nothing: the node may still be writing.
  clock_.Advance(Millis(Policy().put_release_timeout_ms * 2));
  state_.Sweep();
  EXPECT_EQ(Used(), held);
  // Neither does another node's round, nor a late or repeated request of this node's rounds.
  state_.Ping("other");
  state_.PromoteStart({"other", {}, kDisk + 1, 9});
  state_.PromoteStart({"node", {}, kDisk, 3});
  state_.PromoteStart({"node", {}, kDisk, 2});
  EXPECT_EQ(Used(), held);
  EXPECT_TRUE(state_.Stat("k")->promoting);
  // The node's next round proves round 3 is over.
  state_.PromoteStart({"node", {}, kDisk, 4});
  EXPECT_EQ(Used(), 0u);
  EXPECT_FALSE(state_.Stat("k")->promoting);
  // Its late report changes nothing: the object stays disk-only.
  EXPECT_EQ(state_.PromoteEnd({"node", 3, {"k"}, {started.version_gen}, {1}})[0].code(),
            ErrorCode::INVALID_WRITE);
  EXPECT_TRUE(Read("k").replicas.empty());
  // The key can be promoted again in a later round, and a stale report of round 3 cannot take it.
  auto again = state_.PromoteStart({"node", {"k"}, kDisk, 5})[0];
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(state_.PromoteEnd({"node", 3, {"k"}, {again.version_gen}, {1}})[0].code(),
            ErrorCode::ILLEGAL_CLIENT);
  ASSERT_TRUE(state_.PromoteEnd({"node", 5, {"k"}, {again.version_gen}, {1}})[0].ok());
  EXPECT_EQ(Read("k").replicas.size(), 1u);
}

TEST_F(MasterPromotionTest, AnUnmountTakesThePromotionWithTheSegment) {
  OnDiskOnly("k", 100 * kKiB, 5);
  auto started = state_.PromoteStart({"node", {"k"}, kDisk, 1})[0];
  ASSERT_TRUE(started.status.ok());
  ASSERT_TRUE(state_.Unmount({"node", "seg"}).status.ok());
  EXPECT_FALSE(state_.Stat("k")->promoting);
  EXPECT_EQ(state_.PromotionsOf("node"), 0u);
  EXPECT_EQ(state_.PromoteEnd({"node", 1, {"k"}, {started.version_gen}, {1}})[0].code(),
            ErrorCode::INVALID_WRITE);
  EXPECT_TRUE(state_.Stat("k")->replicas.empty());
  // The remounted segment (a new mount) starts empty.
  ASSERT_TRUE(state_.Mount({"node", {"seg", 2 * kMiB, "127.0.0.1:1", "granary-seg", "h", 2, true}})
                  .status.ok());
  EXPECT_EQ(Used(), 0u);
}

TEST_F(MasterPromotionTest, OnlyWhereTheSegmentStaysBelowTheEvictionWatermark) {
  OnDiskOnly("k", kMiB, 5);
  // 1.5 MiB of other objects: promoting 1 MiB would take the 2 MiB segment past 90%.
  auto put = state_.PutStart({"w", {"big"}, {1536 * kKiB}, {}, false})[0];
  ASSERT_TRUE(put.status.ok());
  ASSERT_TRUE(state_.PutEnd({"w", {"big"}, {1}, {put.put_gen}})[0].ok());
  const uint64_t used = Used();
  EXPECT_EQ(state_.PromoteStart({"node", {"k"}, kDisk, 1})[0].status.code(),
            ErrorCode::NO_AVAILABLE_HANDLE);
  EXPECT_EQ(Used(), used);
  EXPECT_EQ(state_.BatchExist({"big"})[0], 1) << "a promotion evicted another object";
  // Not on another node's segment either, nor for a copy on another disk.
  ASSERT_TRUE(state_.Mount({"n2", {"seg2", 8 * kMiB, "127.0.0.1:2", "granary-seg2", "h", 3, true}})
                  .status.ok());
  state_.Ping("n2");
  EXPECT_EQ(state_.PromoteStart({"n2", {"k"}, kDisk, 1})[0].status.code(),
            ErrorCode::OBJECT_NOT_FOUND);
  ASSERT_TRUE(state_.Remove({{"big"}, false})[0].ok());
  EXPECT_TRUE(state_.PromoteStart({"node", {"k"}, kDisk, 2})[0].status.ok());
}

// The history carries promotions like every other change: replaying it, or a snapshot taken with
// promotions under way plus what followed, gives the same state.
TEST(MasterPromotionHistory, ReplayAndSnapshotsReproduceTheSameState) {
  ManualClock clock;
  MasterState leader(Policy(), &clock, 1000);
  std::vector<Operation> log;
  leader.AddObserver([&](const Operation& op, const OpResult&) { log.push_back(op); });
  MountNodeWithDisk(leader);
  auto on_disk = [&](const std::string& key, uint64_t location) {
    auto put = leader.PutStart({"w", {key}, {64 * kKiB}, {}, false})[0];
    ASSERT_TRUE(leader.PutEnd({"w", {key}, {location}, {put.put_gen}})[0].ok());
    auto demote = leader.DemoteStart({"node", {key}, kDisk})[0];
    ASSERT_TRUE(leader.DemoteEnd({"node", {key}, {demote.version_gen}, {location}, kDisk})[0].ok());
  };
  for (int i = 0; i < 6; ++i) on_disk("k" + std::to_string(i), 10 + i);
  Evictor evictor(&leader);
  evictor.EvictBytes(2 * kMiB);
  clock.Advance(Millis(3));
  auto first = leader.PromoteStart({"node", {"k0", "k1", "k2", "k3"}, kDisk, 1});
  for (const auto& r : first) ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  leader.PromoteEnd({"node", 1, {"k0", "k1"}, {first[0].version_gen, first[1].version_gen}, {1, 0}});
  leader.Remove({{"k2"}, false});
  const std::string mid = leader.EncodeSnapshot();  // k2 and k3 still under way
  const uint64_t mid_seq = leader.last_seq();
  auto second = leader.PromoteStart({"node", {"k4", "k5"}, kDisk, 2});  // frees k2's and k3's
  leader.PromoteEnd({"node", 2, {"k4"}, {second[0].version_gen}, {1}});
  EXPECT_EQ(leader.Stat("k0")->replicas.size(), 1u);
  EXPECT_EQ(leader.Stat("k4")->replicas.size(), 1u);
  EXPECT_TRUE(leader.Stat("k5")->promoting);

  ManualClock other(42);
  MasterState follower(Policy(), &other, 1000);
  for (const auto& op : log) {
    auto decoded = DecodeOperation(EncodeOperation(op));
    ASSERT_TRUE(decoded.ok());
    ASSERT_TRUE(follower.Replay(*decoded).ok());
  }
  EXPECT_EQ(follower.Digest(), leader.Digest());
  EXPECT_EQ(follower.segments().used_bytes(), leader.segments().used_bytes());
  EXPECT_TRUE(follower.Stat("k5")->promoting);

  MasterState restored(Policy(), &other, 1000);
  ASSERT_TRUE(restored.LoadSnapshot(mid).ok());
  EXPECT_TRUE(restored.Stat("k3")->promoting) << "the snapshot lost a promotion under way";
  for (const auto& op : log) {
    if (op.seq > mid_seq) {
      ASSERT_TRUE(restored.Replay(op).ok());
    }
  }
  EXPECT_EQ(restored.Digest(), leader.Digest());
  EXPECT_EQ(restored.PromotionsOf("node"), 1u);
  // And the restored state goes on like the leader: the last promotion ends the same way.
  leader.PromoteEnd({"node", 2, {"k5"}, {second[1].version_gen}, {1}});
  ASSERT_TRUE(restored.Replay(log.back()).ok());
  EXPECT_EQ(restored.Digest(), leader.Digest());
  EXPECT_EQ(restored.Stat("k5")->replicas.size(), 1u);
}

}  // namespace
}  // namespace granary::master
