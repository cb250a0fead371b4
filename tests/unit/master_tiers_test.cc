// Tiers in the master's model (Master core v2, part 3): an object's copies are memory replicas
// and disk replicas; a demotion (memory -> a node's disk) runs beside a pending write without
// colliding with it; eviction demotes an object that has a disk copy instead of dropping it.
#include <gtest/gtest.h>

#include <algorithm>

#include "master/policy/evictor.h"
#include "master/state/master_state.h"
#include "master/policy/offload_planner.h"

namespace granary::master {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kDisk = 0xD15C;  // "node"'s disk
constexpr uint64_t kDisk2 = 0xD15C2;

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
    if (end) {
      EXPECT_TRUE(state_.PutEnd({"w", {key}, {started.put_gen}, {started.put_gen}})[0].ok());
    }
    return started;
  }
  // The node's disk completes an (empty) inventory: it may offload from then on.
  void RegisterDisk(const std::string& node, uint64_t disk) {
    state_.Ping(node);
    ASSERT_TRUE(state_.DiskRegister({node, {}, disk, true}).empty());
    ASSERT_TRUE(state_.DiskKnown(disk));
  }
  // The disk's garbage as (key, location) pairs, oldest first.
  std::vector<std::pair<std::string, uint64_t>> Garbage(uint64_t disk) {
    std::vector<std::pair<std::string, uint64_t>> out;
    for (const auto& g : state_.DiskGarbageOf(disk, 1000, 1 << 20)) out.emplace_back(g.key, g.location);
    return out;
  }
  // The disk's newest garbage entry, or ("", 0).
  std::pair<std::string, uint64_t> Newest(uint64_t disk) {
    auto all = Garbage(disk);
    return all.empty() ? std::pair<std::string, uint64_t>{} : all.back();
  }
  // Puts `key` and attaches a copy of it on `disk` at `location` through a demotion.
  void PutOnDisk(const std::string& key, uint64_t location, uint64_t disk = kDisk,
                 const std::string& node = "node") {
    Put(key, kKiB);
    auto started = state_.DemoteStart({node, {key}, disk})[0];
    ASSERT_TRUE(started.status.ok()) << key << ": " << started.status.ToString();
    ASSERT_TRUE(state_.DemoteEnd({node, {key}, {started.version_gen}, {location}, disk})[0].ok());
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
  RegisterDisk("node", kDisk);
  Put("k", kMiB);
  auto started = state_.DemoteStart({"node", {"k"}, kDisk})[0];
  ASSERT_TRUE(started.status.ok()) << started.status.ToString();
  EXPECT_EQ(started.size, kMiB);
  ASSERT_EQ(started.replicas.size(), 1u);
  EXPECT_TRUE(state_.Stat("k")->demoting);
  Evictor evictor(&state_);
  EXPECT_EQ(evictor.EvictBytes(kMiB).objects, 0u) << "evicted memory a demotion is copying";
  ASSERT_TRUE(state_.DemoteEnd({"node", {"k"}, {started.version_gen}, {4242}, kDisk})[0].ok());
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
  // Not garbage: the disk, back under a new process, would re-attach what is still committed.
  EXPECT_TRUE(Garbage(kDisk).empty());
}

TEST_F(MasterTiersTest, AnUpsertAndADemotionOfOneObjectDoNotCollide) {
  RegisterDisk("node", kDisk);
  Put("k", kMiB);
  auto demotion = state_.DemoteStart({"node", {"k"}, kDisk})[0];
  ASSERT_TRUE(demotion.status.ok());
  // A new version is written and committed while the node copies the old one.
  auto upsert = Put("k", kMiB, /*upsert=*/true, /*end=*/false);
  EXPECT_TRUE(state_.Stat("k")->demoting);
  EXPECT_NE(state_.Stat("k")->put_gen, 0u);
  ASSERT_TRUE(state_.PutEnd({"w", {"k"}, {7}, {upsert.put_gen}})[0].ok());
  // The old version's memory is still being read by the demotion: nobody may get it.
  EXPECT_FALSE(CanAllocate(kMiB)) << "memory under a demotion was handed out";
  // The copy is of a version that is gone: refused, and the node deletes it.
  EXPECT_EQ(state_.DemoteEnd({"node", {"k"}, {demotion.version_gen}, {1}, kDisk})[0].code(),
            ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_TRUE(state_.Stat("k")->disk.empty());
  EXPECT_EQ(Garbage(kDisk), (std::vector<std::pair<std::string, uint64_t>>{{"k", 1}}));
  EXPECT_EQ(state_.GetReplicaList({"r", {"k"}})[0].checksum, 7u);
  EXPECT_TRUE(CanAllocate(kMiB)) << "the demotion's memory never came back";
}

TEST_F(MasterTiersTest, ARemoveDuringADemotionHoldsTheMemoryUntilItEnds) {
  RegisterDisk("node", kDisk);
  Put("k", kMiB);
  Put("other", kMiB);
  auto demotion = state_.DemoteStart({"node", {"k"}, kDisk})[0];
  ASSERT_TRUE(demotion.status.ok());
  ASSERT_TRUE(state_.Remove({{"k"}, false})[0].ok());
  EXPECT_EQ(state_.BatchExist({"k"})[0], 0);
  EXPECT_FALSE(CanAllocate(kMiB));
  ASSERT_TRUE(state_.DemoteAbort({"node", {"k"}, {demotion.version_gen}})[0].ok());
  EXPECT_TRUE(CanAllocate(kMiB));
  EXPECT_EQ(state_.Stat("k").status().code(), ErrorCode::OBJECT_NOT_FOUND);
}

TEST_F(MasterTiersTest, OnlyTheDemotingNodeMayEndItAndStalledDemotionsTimeOut) {
  RegisterDisk("node", kDisk);
  RegisterDisk("node2", kDisk2);
  Put("k", kMiB);
  auto demotion = state_.DemoteStart({"node", {"k"}, kDisk})[0];
  ASSERT_TRUE(demotion.status.ok());
  EXPECT_EQ(state_.DemoteStart({"node2", {"k"}, kDisk2})[0].status.code(),
            ErrorCode::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ(state_.DemoteEnd({"node2", {"k"}, {demotion.version_gen}, {1}, kDisk2})[0].code(),
            ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(state_.DemoteEnd({"node", {"k"}, {demotion.version_gen + 1}, {1}, kDisk})[0].code(),
            ErrorCode::ILLEGAL_CLIENT);
  clock_.Advance(Millis(MasterPolicy{}.put_release_timeout_ms));
  EXPECT_EQ(state_.Sweep().aborted_demotions, 1u);
  EXPECT_FALSE(state_.Stat("k")->demoting);
  EXPECT_EQ(state_.DemoteEnd({"node", {"k"}, {demotion.version_gen}, {2}, kDisk})[0].code(),
            ErrorCode::INVALID_WRITE);
  // Each refused copy is its disk's to delete (the node deletes it at once; if that answer is
  // lost, the garbage names it again).
  EXPECT_EQ(Garbage(kDisk2), (std::vector<std::pair<std::string, uint64_t>>{{"k", 1}}));
  EXPECT_EQ(Garbage(kDisk), (std::vector<std::pair<std::string, uint64_t>>{{"k", 1}, {"k", 2}}));
}

TEST_F(MasterTiersTest, OnlyADiskThatRegisteredItsInventoryMayOffload) {
  Put("k", kMiB);
  state_.Ping("node");
  EXPECT_EQ(state_.DemoteStart({"node", {"k"}, kDisk})[0].status.code(), ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(state_.DemoteStart({"node", {"k"}, 0})[0].status.code(), ErrorCode::INVALID_PARAMS);
  // A registration that is not complete yet does not count.
  ASSERT_TRUE(state_.DiskRegister({"node", {}, kDisk, false}).empty());
  EXPECT_FALSE(state_.DiskKnown(kDisk));
  EXPECT_EQ(state_.DemoteStart({"node", {"k"}, kDisk})[0].status.code(), ErrorCode::ILLEGAL_CLIENT);
  ASSERT_TRUE(state_.DiskRegister({"node", {}, kDisk, true}).empty());
  EXPECT_TRUE(state_.DemoteStart({"node", {"k"}, kDisk})[0].status.ok());
  EXPECT_EQ(state_.DiskRegister({"node", {{"x", kKiB, 1, 1}}, 0, true})[0].code(),
            ErrorCode::INVALID_PARAMS);
}

TEST_F(MasterTiersTest, AnObjectOnDiskOnlySurvivesItsSegmentsUnmount) {
  RegisterDisk("disk-node", kDisk2);
  Put("k", kMiB);
  auto demotion = state_.DemoteStart({"disk-node", {"k"}, kDisk2})[0];
  ASSERT_TRUE(state_.DemoteEnd({"disk-node", {"k"}, {demotion.version_gen}, {9}, kDisk2})[0].ok());
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
                                       {"zero", 0, 5, 6}},
                                      kDisk,
                                      true});
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
  EXPECT_TRUE(state_.DiskRegister({"node", {{"fresh", 3 * kMiB, 77, 11}}, kDisk, true})[0].ok());
  ASSERT_EQ(state_.Stat("fresh")->disk.size(), 1u);
  EXPECT_EQ(state_.Stat("fresh")->disk[0].location, 11u);
  // An unknown node cannot register: its copies would never expire with it.
  EXPECT_EQ(state_.DiskRegister({"stranger", {{"x", kMiB, 1, 1}}, kDisk2, true})[0].code(),
            ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(state_.BatchExist({"x"})[0], 0);
}

// The node's disk eviction: the master stops naming a dropped copy at once; an object left with
// no copy is gone; a copy in memory keeps it.
TEST_F(MasterTiersTest, DiskDropForgetsTheCopyAndTheObjectWhenNothingElseHoldsIt) {
  state_.Ping("node");
  Put("both", kMiB);
  const uint64_t sum = state_.Stat("both")->checksum;
  ASSERT_TRUE(
      state_.DiskRegister({"node", {{"both", kMiB, sum, 8}, {"disk", kMiB, 9, 9}}, kDisk, true})[0]
          .ok());
  auto dropped = state_.DiskDrop({"node", {"both", "disk", "disk", "nope"}, {8, 10, 9, 1}});
  EXPECT_TRUE(dropped[0].ok());
  EXPECT_EQ(dropped[1].code(), ErrorCode::OBJECT_NOT_FOUND) << "wrong location dropped a copy";
  EXPECT_TRUE(dropped[2].ok());
  EXPECT_EQ(dropped[3].code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(state_.BatchExist({"both", "disk"}), (std::vector<int32_t>{1, 0}));
  EXPECT_TRUE(state_.Stat("both")->disk.empty());
  EXPECT_EQ(state_.DiskDrop({"node", {"a", "b"}, {1}})[0].code(), ErrorCode::INVALID_PARAMS);
  EXPECT_TRUE(Garbage(kDisk).empty()) << "the node's own drops are not garbage: it deleted them";
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
  leader.DiskRegister({"node", {{"k", kMiB, 42, 5}, {"d", 4096, 1, 6}, {"e", 4096, 2, 7}}, kDisk,
                      true});
  leader.DiskDrop({"node", {"d"}, {6}});
  // Garbage and its acknowledgement travel the same way.
  leader.Remove({{"e"}, false});
  leader.DiskRegister({"node", {{"gone", 4096, 3, 8}, {"gone2", 4096, 3, 9}}, kDisk, true});
  auto garbage = leader.DiskGarbageOf(kDisk, 10, 1 << 20);
  ASSERT_EQ(garbage.size(), 3u);
  ASSERT_TRUE(leader.DiskGarbageAck({"node", kDisk, {garbage[1].id}})[0].ok());

  MasterState follower(Policy(), &clock, 1000);
  for (const auto& op : log) ASSERT_TRUE(follower.Replay(op).ok());
  EXPECT_EQ(follower.Digest(), leader.Digest());
  EXPECT_EQ(follower.Stat("k")->disk.size(), 1u);
  EXPECT_EQ(follower.BatchExist({"d", "e", "gone"}), (std::vector<int32_t>{0, 0, 0}));
  auto names = [](const std::vector<GarbageEntry>& entries) {
    std::vector<std::pair<uint64_t, std::string>> out;
    for (const auto& g : entries) out.emplace_back(g.id, g.key);
    return out;
  };
  const auto expected = names(leader.DiskGarbageOf(kDisk, 10, 1 << 20));
  ASSERT_EQ(expected.size(), 2u);
  EXPECT_EQ(names(follower.DiskGarbageOf(kDisk, 10, 1 << 20)), expected);
  EXPECT_TRUE(follower.DiskKnown(kDisk));
  MasterState restored(Policy(), &clock, 1000);
  ASSERT_TRUE(restored.LoadSnapshot(leader.EncodeSnapshot()).ok());
  EXPECT_EQ(restored.Digest(), leader.Digest());
  EXPECT_EQ(names(restored.DiskGarbageOf(kDisk, 10, 1 << 20)), expected);
  EXPECT_TRUE(restored.DiskKnown(kDisk));
  // The restored state refuses what the leader refuses: the garbage, and unknown keys.
  restored.Ping("node");
  auto again = restored.DiskRegister({"node", {{"e", 4096, 2, 7}, {"new", 4096, 2, 10}}, kDisk, true});
  EXPECT_EQ(again[0].code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(again[1].code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(restored.BatchExist({"e", "new"}), (std::vector<int32_t>{0, 0}));
}


// Stale copies (docs/disk.md): whenever a record lets a disk copy go without its node having
// dropped it, the copy becomes garbage of its disk, named by (key, location).
TEST_F(MasterTiersTest, EveryWayARecordLetsACopyGoMakesItDiskGarbage) {
  RegisterDisk("node", kDisk);
  RegisterDisk("node2", kDisk2);
  using Places = std::vector<std::pair<std::string, uint64_t>>;
  // A remove, and a removal by pattern or of everything, forced or not.
  PutOnDisk("removed", 1);
  ASSERT_TRUE(state_.Remove({{"removed"}, false})[0].ok());
  EXPECT_EQ(Garbage(kDisk), (Places{{"removed", 1}}));
  PutOnDisk("re/a", 2);
  PutOnDisk("re/b", 3, kDisk2, "node2");
  EXPECT_EQ(state_.RemoveByRegex({"^re/", false}).removed, 2u);
  EXPECT_EQ(Garbage(kDisk), (Places{{"removed", 1}, {"re/a", 2}}));
  EXPECT_EQ(Garbage(kDisk2), (Places{{"re/b", 3}}));
  PutOnDisk("all", 4);
  EXPECT_EQ(state_.RemoveAll({true}).removed, 1u);
  EXPECT_EQ(Newest(kDisk), (std::pair<std::string, uint64_t>{"all", 4}));

  // An upsert's commit: the replaced version's copies, on every disk that had one.
  PutOnDisk("upserted", 5);
  auto second = state_.DemoteStart({"node2", {"upserted"}, kDisk2})[0];
  ASSERT_TRUE(second.status.ok());
  ASSERT_TRUE(state_.DemoteEnd({"node2", {"upserted"}, {second.version_gen}, {6}, kDisk2})[0].ok());
  auto upsert = Put("upserted", kKiB, /*upsert=*/true, /*end=*/false);
  EXPECT_EQ(Newest(kDisk).first, "all") << "garbage before the new version commits";
  ASSERT_TRUE(state_.PutEnd({"w", {"upserted"}, {99}, {upsert.put_gen}})[0].ok());
  EXPECT_EQ(Newest(kDisk), (std::pair<std::string, uint64_t>{"upserted", 5}));
  EXPECT_EQ(Newest(kDisk2), (std::pair<std::string, uint64_t>{"upserted", 6}));
  EXPECT_TRUE(state_.Stat("upserted")->disk.empty());

  // A registration the master refuses: other bytes committed, a put in flight, an unknown key.
  Put("other", kKiB);
  auto writing = state_.PutStart({"w", {"writing"}, {kKiB}, {}, false})[0];
  ASSERT_TRUE(writing.status.ok());
  auto refused = state_.DiskRegister({"node",
                                      {{"other", kKiB, state_.Stat("other")->checksum + 1, 7},
                                       {"writing", kKiB, 1, 8},
                                       {"unknown", kKiB, 1, 9}},
                                      kDisk,
                                      true});
  EXPECT_EQ(refused[0].code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ(refused[1].code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ(refused[2].code(), ErrorCode::OBJECT_NOT_FOUND);
  const Places all = Garbage(kDisk);
  ASSERT_GE(all.size(), 3u);
  Places tail(all.end() - 3, all.end());  // a batch goes shard by shard
  std::sort(tail.begin(), tail.end());
  EXPECT_EQ(tail, (Places{{"other", 7}, {"unknown", 9}, {"writing", 8}}));

  // Eviction keeps a demoted object (its disk copy holds it): nothing to delete.
  PutOnDisk("kept", 10);
  const size_t before = Garbage(kDisk).size();
  Evictor evictor(&state_);
  evictor.EvictBytes(2 * kMiB);
  EXPECT_EQ(state_.BatchExist({"kept"})[0], 1);
  EXPECT_EQ(Garbage(kDisk).size(), before);
  EXPECT_EQ(state_.disk_garbage_count(), before + Garbage(kDisk2).size());
}

TEST_F(MasterTiersTest, AGarbageCopyIsRefusedEvenUnderTheSameBytes) {
  RegisterDisk("node", kDisk);
  PutOnDisk("k", 1);
  const uint64_t sum = state_.Stat("k")->checksum;
  ASSERT_TRUE(state_.Remove({{"k"}, false})[0].ok());
  // The same bytes are put again: the old place is still the node's to delete, so attaching it
  // would name a copy about to go.
  auto put = state_.PutStart({"w", {"k"}, {kKiB}, {}, false})[0];
  ASSERT_TRUE(state_.PutEnd({"w", {"k"}, {sum}, {put.put_gen}})[0].ok());
  auto again = state_.DiskRegister({"node", {{"k", kKiB, sum, 1}, {"k", kKiB, sum, 2}}, kDisk, true});
  EXPECT_EQ(again[0].code(), ErrorCode::OBJECT_NOT_FOUND) << again[0].ToString();
  EXPECT_TRUE(again[1].ok()) << "a copy of the committed bytes elsewhere is a good copy";
  ASSERT_EQ(state_.Stat("k")->disk.size(), 1u);
  EXPECT_EQ(state_.Stat("k")->disk[0].location, 2u);
}

// The first registration of a disk (a master that just started) may bring unknown keys back,
// over as many batches as it takes; once complete, the disk's unknown keys are refused: with the
// master's state continuous, such a copy was removed or replaced, or never attached.
TEST_F(MasterTiersTest, UnknownKeysComeBackOnlyWithADisksFirstInventory) {
  state_.Ping("node");
  ASSERT_TRUE(state_.DiskRegister({"node", {{"a", kKiB, 1, 1}}, kDisk, false})[0].ok());
  ASSERT_TRUE(state_.DiskRegister({"node", {{"b", kKiB, 2, 2}}, kDisk, true})[0].ok());
  EXPECT_EQ(state_.BatchExist({"a", "b"}), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(state_.DiskRegister({"node", {{"c", kKiB, 3, 3}}, kDisk, true})[0].code(),
            ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(state_.BatchExist({"c"})[0], 0);
  EXPECT_EQ(state_.Stat("c").status().code(), ErrorCode::OBJECT_NOT_FOUND) << "left a record";
  // Another disk still has its first inventory to give.
  state_.Ping("node2");
  EXPECT_TRUE(state_.DiskRegister({"node2", {{"c", kKiB, 3, 3}}, kDisk2, true})[0].ok());
}

// A node restarted on the same disk is a new client: its registration moves the disk's replicas
// to the new process instead of adding a second replica for the same copy, so the old process's
// expiry then takes nothing away.
TEST_F(MasterTiersTest, ARestartedNodeTakesOverItsDisksReplicas) {
  RegisterDisk("node", kDisk);
  PutOnDisk("k", 7);
  const uint64_t sum = state_.Stat("k")->checksum;
  state_.Ping("node-restarted");
  ASSERT_TRUE(state_.DiskRegister({"node-restarted", {{"k", kKiB, sum, 7}}, kDisk, true})[0].ok());
  auto disk = state_.Stat("k")->disk;
  ASSERT_EQ(disk.size(), 1u);
  EXPECT_EQ(disk[0].node_id, "node-restarted");
  EXPECT_EQ(disk[0].disk_id, kDisk);
  clock_.Advance(Millis(MasterPolicy{}.client_ttl_ms / 2 + 1));
  state_.Ping("node-restarted");
  clock_.Advance(Millis(MasterPolicy{}.client_ttl_ms / 2 + 1));
  state_.ExpireClient("node");
  EXPECT_EQ(state_.Stat("k")->disk.size(), 1u);
}

TEST_F(MasterTiersTest, AnAcknowledgementRemovesExactlyTheEntryItNames) {
  RegisterDisk("node", kDisk);
  RegisterDisk("node2", kDisk2);
  PutOnDisk("k", 1);
  ASSERT_TRUE(state_.Remove({{"k"}, false})[0].ok());
  auto first = state_.DiskGarbageOf(kDisk, 10, 1 << 20);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(state_.DiskGarbageAck({"node2", kDisk2, {first[0].id}})[0].code(),
            ErrorCode::OBJECT_NOT_FOUND) << "another disk acknowledged this disk's entry";
  EXPECT_EQ(state_.DiskGarbageAck({"node", kDisk, {first[0].id + 1}})[0].code(),
            ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(Garbage(kDisk).size(), 1u);

  // The disk reuses the location (the offset backend does) before acknowledging: the new copy
  // written there shows the old one is gone, and a later entry for the place is a new one, so
  // the late acknowledgement of the first cannot remove it.
  PutOnDisk("k", 1);
  EXPECT_TRUE(Garbage(kDisk).empty()) << "garbage named the place of an attached copy";
  ASSERT_TRUE(state_.Remove({{"k"}, false})[0].ok());
  auto second = state_.DiskGarbageOf(kDisk, 10, 1 << 20);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_GT(second[0].id, first[0].id);
  EXPECT_EQ(state_.DiskGarbageAck({"node", kDisk, {first[0].id}})[0].code(),
            ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(Garbage(kDisk).size(), 1u);
  ASSERT_TRUE(state_.DiskGarbageAck({"node", kDisk, {second[0].id}})[0].ok());
  EXPECT_TRUE(Garbage(kDisk).empty());
  EXPECT_EQ(state_.DiskGarbageAck({"node", kDisk, {second[0].id}})[0].code(),
            ErrorCode::OBJECT_NOT_FOUND) << "a repeated acknowledgement";

  // Another key written at the place is another copy: the garbage stays.
  PutOnDisk("k", 3);
  ASSERT_TRUE(state_.Remove({{"k"}, false})[0].ok());
  PutOnDisk("k2", 3);
  EXPECT_EQ(Garbage(kDisk), (std::vector<std::pair<std::string, uint64_t>>{{"k", 3}}));
}

TEST_F(MasterTiersTest, AnAnswerNamesTheOldestGarbageWithinItsBounds) {
  RegisterDisk("node", kDisk);
  for (int i = 0; i < 5; ++i) PutOnDisk("key-" + std::to_string(i), 10 + i);
  ASSERT_EQ(state_.RemoveAll({false}).removed, 5u);
  auto two = state_.DiskGarbageOf(kDisk, 2, 1 << 20);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].id + 1, two[1].id);
  EXPECT_EQ(state_.DiskGarbageOf(kDisk, 10, 6).size(), 1u) << "6 bytes of keys: one key";
  EXPECT_EQ(state_.DiskGarbageOf(kDisk, 10, 1).size(), 1u) << "always at least one";
  EXPECT_TRUE(state_.DiskGarbageOf(kDisk2, 10, 1 << 20).empty());
}

// The bound: the oldest entries are forgotten and counted. Their copies still never come back:
// the disk is known, so a copy of a key the master does not hold is refused anyway.
TEST(MasterTiersBound, GarbageBeyondTheBoundDropsTheOldestAndTheyStillNeverComeBack) {
  ManualClock clock;
  MasterPolicy policy;
  policy.disk_garbage_max_entries = 3;
  MasterState state(policy, &clock);
  ASSERT_TRUE(
      state.Mount({"node", {"seg", 2 * kMiB, "127.0.0.1:1", "granary-seg", "h", 1, true}}).status.ok());
  ASSERT_TRUE(state.DiskRegister({"node", {}, kDisk, true}).empty());
  for (int i = 0; i < 5; ++i) {
    const std::string key = "k" + std::to_string(i);
    auto put = state.PutStart({"w", {key}, {kKiB}, {}, false})[0];
    ASSERT_TRUE(state.PutEnd({"w", {key}, {7}, {put.put_gen}})[0].ok());
    auto demoted = state.DemoteStart({"node", {key}, kDisk})[0];
    ASSERT_TRUE(state.DemoteEnd({"node", {key}, {demoted.version_gen},
                                 {static_cast<uint64_t>(i + 1)}, kDisk})[0].ok());
  }
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(state.Remove({{"k" + std::to_string(i)}, false})[0].ok());
  EXPECT_EQ(state.disk_garbage_count(), 3u);
  EXPECT_EQ(state.disk_garbage_dropped(), 2u);
  auto left = state.DiskGarbageOf(kDisk, 10, 1 << 20);
  ASSERT_EQ(left.size(), 3u);
  EXPECT_EQ(left[0].key, "k2");
  auto back = state.DiskRegister({"node", {{"k0", kKiB, 7, 1}, {"k4", kKiB, 7, 5}}, kDisk, true});
  EXPECT_EQ(back[0].code(), ErrorCode::OBJECT_NOT_FOUND) << "a forgotten entry's copy came back";
  EXPECT_EQ(back[1].code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(state.BatchExist({"k0", "k4"}), (std::vector<int32_t>{0, 0}));
  // The refused k0 is garbage again (newest), pushing the next oldest out.
  auto now = state.DiskGarbageOf(kDisk, 10, 1 << 20);
  ASSERT_FALSE(now.empty());
  EXPECT_EQ(now.back().key, "k0");
  EXPECT_EQ(state.disk_garbage_dropped(), 3u);
}

// ---- per-put persistence (ReplicateConfig.persistence) and the offload planner ----

// A master under `policy` with one 2 MiB segment of "node", whose disk has registered.
class MasterTiersPersistence : public ::testing::Test {
 protected:
  struct Setup {
    ManualClock clock;
    MasterState state{MasterPolicy{}, &clock};
    OffloadPlanner planner;
    explicit Setup(Persistence policy) : planner(&state, {policy, 0.80}) {
      EXPECT_TRUE(state.Mount({"node", {"seg", 2 * kMiB, "127.0.0.1:1", "granary-seg", "h", 1, true}})
                      .status.ok());
      state.Ping("node");
      EXPECT_TRUE(state.DiskRegister({"node", {}, kDisk, true}).empty());
    }
    void Put(const std::string& key, uint64_t size, PutPersistence persistence,
             bool upsert = false) {
      PlacementConfig config;
      config.persistence = persistence;
      auto started = state.PutStart({"w", {key}, {size}, config, upsert})[0];
      ASSERT_TRUE(started.status.ok()) << key << ": " << started.status.ToString();
      ASSERT_TRUE(state.PutEnd({"w", {key}, {7}, {started.put_gen}})[0].ok());
    }
    bool Planned(const std::string& key) {
      auto plan = planner.Plan("node", 100, 64 * kMiB);
      return std::find(plan.begin(), plan.end(), key) != plan.end();
    }
  };
  static constexpr Persistence kPolicies[] = {Persistence::kEager, Persistence::kLazy,
                                              Persistence::kNone};
  static constexpr PutPersistence kPuts[] = {PutPersistence::kDefault, PutPersistence::kEager,
                                             PutPersistence::kLazy, PutPersistence::kNone};
};

TEST_F(MasterTiersPersistence, EveryMasterDefaultAndPerPutValueCombination) {
  for (Persistence policy : kPolicies) {
    for (PutPersistence put : kPuts) {
      SCOPED_TRACE("policy " + std::to_string(static_cast<int>(policy)) + ", put " +
                   std::to_string(static_cast<int>(put)));
      Setup s(policy);
      const Persistence wanted = put == PutPersistence::kDefault ? policy
                                 : put == PutPersistence::kEager ? Persistence::kEager
                                 : put == PutPersistence::kLazy  ? Persistence::kLazy
                                                                 : Persistence::kNone;
      EXPECT_EQ(EffectivePersistence(put, policy), wanted);
      s.Put("k", 64 * kKiB, put);
      // Memory below the watermark: only eager objects are offloaded.
      EXPECT_EQ(s.Planned("k"), wanted == Persistence::kEager);
      // Above it (a filler that is itself never offloaded): lazy ones too, none never.
      s.Put("filler", 1792 * kKiB, PutPersistence::kNone);
      EXPECT_FALSE(s.Planned("filler"));
      EXPECT_EQ(s.Planned("k"), wanted != Persistence::kNone);
      // The planner's pick is what a demotion then takes; a none object never gets a disk copy,
      // so memory eviction drops it.
      if (wanted == Persistence::kNone) {
        Evictor evictor(&s.state);
        evictor.EvictBytes(2 * kMiB);
        EXPECT_EQ(s.state.BatchExist({"k"})[0], 0) << "a none object outlived its memory";
      }
    }
  }
}

TEST_F(MasterTiersPersistence, EagerObjectsComeBeforeLazyOnesAndLazyOnesByLastRead) {
  Setup s(Persistence::kNone);
  s.Put("lazy-old", 64 * kKiB, PutPersistence::kLazy);
  s.clock.Advance(Millis(5));
  s.Put("lazy-new", 64 * kKiB, PutPersistence::kLazy);
  s.clock.Advance(Millis(5));
  s.Put("eager", 64 * kKiB, PutPersistence::kEager);
  s.Put("filler", 1600 * kKiB, PutPersistence::kDefault);  // master default none
  EXPECT_EQ(s.planner.Plan("node", 100, 64 * kMiB),
            (std::vector<std::string>{"eager", "lazy-old", "lazy-new"}));
  EXPECT_EQ(s.planner.Plan("node", 1, 64 * kMiB), (std::vector<std::string>{"eager"}));
}

TEST_F(MasterTiersPersistence, AnUpsertCarriesItsOwnPersistence) {
  Setup s(Persistence::kNone);
  s.Put("k", 64 * kKiB, PutPersistence::kEager);
  EXPECT_TRUE(s.Planned("k"));
  s.Put("k", 64 * kKiB, PutPersistence::kDefault, /*upsert=*/true);
  EXPECT_FALSE(s.Planned("k")) << "the upsert inherited the old version's eager";
  EXPECT_EQ(s.state.explicit_persistence_count(), 0u);
  s.Put("k", 64 * kKiB, PutPersistence::kEager, /*upsert=*/true);
  EXPECT_TRUE(s.Planned("k"));
  EXPECT_EQ(s.state.explicit_persistence_count(), 1u);
  // A pending upsert does not change what the committed version asked for.
  PlacementConfig none;
  none.persistence = PutPersistence::kNone;
  ASSERT_TRUE(s.state.PutStart({"w", {"k"}, {kKiB}, none, true})[0].status.ok());
  EXPECT_TRUE(s.Planned("k"));
  ASSERT_TRUE(s.state.Remove({{"k"}, true})[0].ok());
  EXPECT_EQ(s.state.explicit_persistence_count(), 0u);
}

TEST_F(MasterTiersPersistence, ItIsPartOfTheSnapshotAndDigest) {
  Setup a(Persistence::kLazy), b(Persistence::kLazy);
  a.Put("k", 64 * kKiB, PutPersistence::kEager);
  b.Put("k", 64 * kKiB, PutPersistence::kDefault);
  EXPECT_NE(a.state.Digest(), b.state.Digest()) << "persistence is not in the digest";
  Setup c(Persistence::kLazy);
  ASSERT_TRUE(c.state.LoadSnapshot(a.state.EncodeSnapshot()).ok());
  EXPECT_EQ(c.state.Digest(), a.state.Digest());
  EXPECT_EQ(c.state.explicit_persistence_count(), 1u);
  EXPECT_TRUE(c.Planned("k")) << "the loaded state forgot the put's eager";
}

TEST_F(MasterTiersPersistence, AnUnknownValueFailsThePutAndChangesNothing) {
  Setup s(Persistence::kLazy);
  PlacementConfig config;
  config.persistence = static_cast<PutPersistence>(4);
  auto started = s.state.PutStart({"w", {"a", "b"}, {kKiB, kKiB}, config, false});
  EXPECT_EQ(started[0].status.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(started[1].status.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(s.state.BatchExist({"a", "b"}), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(s.state.segments().used_bytes(), 0u);
  EXPECT_EQ(s.state.object_count(), 0u);
  EXPECT_EQ(s.state.pending_count(), 0u);
}

}  // namespace
}  // namespace granary::master
