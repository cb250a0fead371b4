// Tiers in the master's model (Master core v2, part 3): an object's copies are memory replicas
// and disk replicas; a demotion (memory -> a node's disk) runs beside a pending write without
// colliding with it; eviction demotes an object that has a disk copy instead of dropping it.
#include <gtest/gtest.h>

#include "master/evictor.h"
#include "master/master_state.h"

namespace granary::master {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kKiB = 1 << 10;

class MasterTiersTest : public ::testing::Test {
 protected:
  MasterTiersTest() : state_(Policy(), &clock_) {
    EXPECT_TRUE(state_.Mount({"node", {"seg", 2 * kMiB, "127.0.0.1:1", "granary-seg", "h", 1, true}})
                    .status.ok());
  }
  static MasterPolicy Policy() {
    MasterPolicy p;
    p.eviction_policy = EvictionPolicy::kLru;
    return p;
  }
  PutStartKeyResult Put(const std::string& key, uint64_t size, bool upsert = false,
                        bool end = true) {
    auto started = state_.PutStart({"w", {key}, {size}, {}, upsert})[0];
    EXPECT_TRUE(started.status.ok()) << key << ": " << started.status.ToString();
    if (end) EXPECT_TRUE(state_.PutEnd({"w", {key}, {started.put_gen}, {started.put_gen}})[0].ok());
    return started;
  }
  bool CanAllocate(uint64_t size) {
    auto probe = state_.PutStart({"probe", {"probe"}, {size}, {}, false})[0];
    if (!probe.status.ok()) return false;
    EXPECT_TRUE(state_.PutRevoke({"probe", {"probe"}, {probe.put_gen}})[0].ok());
    return true;
  }

  ManualClock clock_;
  MasterState state_;
};

TEST_F(MasterTiersTest, ADemotedObjectKeepsItsDiskReplicaWhenEvictedFromMemory) {
  Put("k", kMiB);
  auto started = state_.DemoteStart({"node", {"k"}})[0];
  ASSERT_TRUE(started.status.ok()) << started.status.ToString();
  EXPECT_EQ(started.size, kMiB);
  ASSERT_EQ(started.replicas.size(), 1u);
  EXPECT_TRUE(state_.Stat("k")->demoting);
  Evictor evictor(&state_);
  EXPECT_EQ(evictor.EvictBytes(kMiB).objects, 0u) << "evicted memory a demotion is copying";
  ASSERT_TRUE(state_.DemoteEnd({"node", {"k"}, {started.version_gen}, {4242}})[0].ok());
  auto stat = state_.Stat("k");
  ASSERT_EQ(stat->disk.size(), 1u);
  EXPECT_EQ(stat->disk[0].location, 4242u);
  EXPECT_EQ(stat->disk[0].node_id, "node");

  // Eviction now demotes: the memory goes, the object stays readable from disk.
  EXPECT_EQ(evictor.EvictBytes(kMiB).objects, 1u);
  EXPECT_EQ(state_.BatchExist({"k"})[0], 1);
  EXPECT_TRUE(state_.Stat("k")->replicas.empty());
  EXPECT_EQ(state_.segments().used_bytes(), 0u);
  EXPECT_EQ(evictor.EvictBytes(kMiB).objects, 0u) << "nothing of memory left to evict";
  auto read = state_.GetReplicaList({"r", {"k"}})[0];
  ASSERT_TRUE(read.status.ok());
  EXPECT_TRUE(read.replicas.empty());
  ASSERT_EQ(read.disk.size(), 1u);

  // Its node dies: the disk copy is out of reach, and the object with it.
  state_.Ping("node");
  clock_.Advance(Millis(MasterPolicy{}.client_ttl_ms + 1));
  state_.ExpireClient("node");
  EXPECT_EQ(state_.BatchExist({"k"})[0], 0);
}

TEST_F(MasterTiersTest, AnUpsertAndADemotionOfOneObjectDoNotCollide) {
  Put("k", kMiB);
  auto demotion = state_.DemoteStart({"node", {"k"}})[0];
  ASSERT_TRUE(demotion.status.ok());
  // A new version is written and committed while the node copies the old one.
  auto upsert = Put("k", kMiB, /*upsert=*/true, /*end=*/false);
  EXPECT_TRUE(state_.Stat("k")->demoting);
  EXPECT_NE(state_.Stat("k")->put_gen, 0u);
  ASSERT_TRUE(state_.PutEnd({"w", {"k"}, {7}, {upsert.put_gen}})[0].ok());
  // The old version's memory is still being read by the demotion: nobody may get it.
  EXPECT_FALSE(CanAllocate(kMiB)) << "memory under a demotion was handed out";
  // The copy is of a version that is gone: refused, and the node deletes it.
  EXPECT_EQ(state_.DemoteEnd({"node", {"k"}, {demotion.version_gen}, {1}})[0].code(),
            ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_TRUE(state_.Stat("k")->disk.empty());
  EXPECT_EQ(state_.GetReplicaList({"r", {"k"}})[0].checksum, 7u);
  EXPECT_TRUE(CanAllocate(kMiB)) << "the demotion's memory never came back";
}

TEST_F(MasterTiersTest, ARemoveDuringADemotionHoldsTheMemoryUntilItEnds) {
  Put("k", kMiB);
  Put("other", kMiB);
  auto demotion = state_.DemoteStart({"node", {"k"}})[0];
  ASSERT_TRUE(demotion.status.ok());
  ASSERT_TRUE(state_.Remove({{"k"}, false})[0].ok());
  EXPECT_EQ(state_.BatchExist({"k"})[0], 0);
  EXPECT_FALSE(CanAllocate(kMiB));
  ASSERT_TRUE(state_.DemoteAbort({"node", {"k"}, {demotion.version_gen}})[0].ok());
  EXPECT_TRUE(CanAllocate(kMiB));
  EXPECT_EQ(state_.Stat("k").status().code(), ErrorCode::OBJECT_NOT_FOUND);
}

TEST_F(MasterTiersTest, OnlyTheDemotingNodeMayEndItAndStalledDemotionsTimeOut) {
  Put("k", kMiB);
  auto demotion = state_.DemoteStart({"node", {"k"}})[0];
  ASSERT_TRUE(demotion.status.ok());
  EXPECT_EQ(state_.DemoteStart({"node2", {"k"}})[0].status.code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ(state_.DemoteEnd({"node2", {"k"}, {demotion.version_gen}, {1}})[0].code(),
            ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(state_.DemoteEnd({"node", {"k"}, {demotion.version_gen + 1}, {1}})[0].code(),
            ErrorCode::ILLEGAL_CLIENT);
  clock_.Advance(Millis(MasterPolicy{}.put_release_timeout_ms));
  EXPECT_EQ(state_.Sweep().aborted_demotions, 1u);
  EXPECT_FALSE(state_.Stat("k")->demoting);
  EXPECT_EQ(state_.DemoteEnd({"node", {"k"}, {demotion.version_gen}, {1}})[0].code(),
            ErrorCode::INVALID_WRITE);
}

TEST_F(MasterTiersTest, AnObjectOnDiskOnlySurvivesItsSegmentsUnmount) {
  Put("k", kMiB);
  auto demotion = state_.DemoteStart({"disk-node", {"k"}})[0];
  ASSERT_TRUE(state_.DemoteEnd({"disk-node", {"k"}, {demotion.version_gen}, {9}})[0].ok());
  ASSERT_TRUE(state_.Unmount({"node", "seg"}).status.ok());
  EXPECT_EQ(state_.BatchExist({"k"})[0], 1) << "the disk replica still holds it";
  EXPECT_TRUE(state_.Stat("k")->replicas.empty());
}

// A node that restarts (or a restarted master) learns what the node's disk holds again: unknown
// keys come back as disk-only objects; a committed key with the same bytes gains the replica; a
// key being written or holding other bytes refuses the copy.
TEST_F(MasterTiersTest, DiskRegisterBringsCopiesBackAndRefusesOtherBytes) {
  state_.Ping("node");
  Put("same", kKiB);
  Put("other", kKiB);
  auto writing = state_.PutStart({"w", {"writing"}, {kKiB}, {}, false})[0];
  ASSERT_TRUE(writing.status.ok());
  const uint64_t same_sum = state_.Stat("same")->checksum;
  const uint64_t other_sum = state_.Stat("other")->checksum;
  auto results = state_.DiskRegister({"node",
                                      {{"fresh", 3 * kMiB, 77, 1},
                                       {"same", kKiB, same_sum, 2},
                                       {"other", kKiB, other_sum + 1, 3},
                                       {"writing", kMiB, 5, 4},
                                       {"", kMiB, 5, 5},
                                       {"zero", 0, 5, 6}}});
  ASSERT_EQ(results.size(), 6u);
  EXPECT_TRUE(results[0].ok()) << results[0].ToString();
  EXPECT_TRUE(results[1].ok()) << results[1].ToString();
  EXPECT_EQ(results[2].code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ(results[3].code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ(results[4].code(), ErrorCode::INVALID_KEY);
  EXPECT_EQ(results[5].code(), ErrorCode::INVALID_PARAMS);

  // A disk-only object larger than any segment is readable (from disk) and takes no memory.
  auto fresh = state_.GetReplicaList({"r", {"fresh"}})[0];
  ASSERT_TRUE(fresh.status.ok()) << fresh.status.ToString();
  EXPECT_EQ(fresh.size, 3 * kMiB);
  EXPECT_EQ(fresh.checksum, 77u);
  EXPECT_TRUE(fresh.replicas.empty());
  ASSERT_EQ(fresh.disk.size(), 1u);
  EXPECT_EQ(fresh.disk[0].location, 1u);
  EXPECT_EQ(state_.Stat("same")->disk.size(), 1u);
  EXPECT_EQ(state_.Stat("same")->replicas.size(), 1u);
  EXPECT_TRUE(state_.Stat("other")->disk.empty());
  // Registering again is idempotent (a retried RPC), and a moved copy updates its location.
  EXPECT_TRUE(state_.DiskRegister({"node", {{"fresh", 3 * kMiB, 77, 11}}})[0].ok());
  ASSERT_EQ(state_.Stat("fresh")->disk.size(), 1u);
  EXPECT_EQ(state_.Stat("fresh")->disk[0].location, 11u);
  // An unknown node cannot register: its copies would never expire with it.
  EXPECT_EQ(state_.DiskRegister({"stranger", {{"x", kMiB, 1, 1}}})[0].code(),
            ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(state_.BatchExist({"x"})[0], 0);
}

// The node's disk eviction: the master stops naming a dropped copy at once; an object left with
// no copy is gone; a copy in memory keeps it.
TEST_F(MasterTiersTest, DiskDropForgetsTheCopyAndTheObjectWhenNothingElseHoldsIt) {
  state_.Ping("node");
  Put("both", kMiB);
  const uint64_t sum = state_.Stat("both")->checksum;
  ASSERT_TRUE(state_.DiskRegister({"node", {{"both", kMiB, sum, 8}, {"disk", kMiB, 9, 9}}})[0].ok());
  auto dropped = state_.DiskDrop({"node", {"both", "disk", "disk", "nope"}, {8, 10, 9, 1}});
  EXPECT_TRUE(dropped[0].ok());
  EXPECT_EQ(dropped[1].code(), ErrorCode::OBJECT_NOT_FOUND) << "wrong location dropped a copy";
  EXPECT_TRUE(dropped[2].ok());
  EXPECT_EQ(dropped[3].code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(state_.BatchExist({"both", "disk"}), (std::vector<int32_t>{1, 0}));
  EXPECT_TRUE(state_.Stat("both")->disk.empty());
  EXPECT_EQ(state_.DiskDrop({"node", {"a", "b"}, {1}})[0].code(), ErrorCode::INVALID_PARAMS);
}

// Replay and snapshots carry the disk inventory like every other operation.
TEST_F(MasterTiersTest, DiskInventoryReplaysToTheSameDigest) {
  ManualClock clock;
  MasterState leader(Policy(), &clock, 1000);
  std::vector<Operation> log;
  leader.AddObserver([&](const Operation& op, const OpResult&) { log.push_back(op); });
  ASSERT_TRUE(leader.Mount({"node", {"seg", 2 * kMiB, "127.0.0.1:1", "granary-seg", "h", 1, true}})
                  .status.ok());
  leader.Ping("node");
  auto started = leader.PutStart({"w", {"k"}, {kMiB}, {}, false})[0];
  ASSERT_TRUE(leader.PutEnd({"w", {"k"}, {42}, {started.put_gen}})[0].ok());
  clock.Advance(Millis(5));
  leader.DiskRegister({"node", {{"k", kMiB, 42, 5}, {"d", 4096, 1, 6}, {"e", 4096, 2, 7}}});
  leader.DiskDrop({"node", {"d"}, {6}});

  MasterState follower(Policy(), &clock, 1000);
  for (const auto& op : log) ASSERT_TRUE(follower.Replay(op).ok());
  EXPECT_EQ(follower.Digest(), leader.Digest());
  EXPECT_EQ(follower.Stat("k")->disk.size(), 1u);
  EXPECT_EQ(follower.BatchExist({"d", "e"}), (std::vector<int32_t>{0, 1}));
  MasterState restored(Policy(), &clock, 1000);
  ASSERT_TRUE(restored.LoadSnapshot(leader.EncodeSnapshot()).ok());
  EXPECT_EQ(restored.Digest(), leader.Digest());
}

}  // namespace
}  // namespace granary::master
