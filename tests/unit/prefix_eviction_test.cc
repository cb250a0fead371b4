// The prefix eviction policy (object_meta.h PrefixQueueStamp, evictor.h): s3fifo whose probation
// empties by the class a put batch gave each key - the batch's tail first, then keys of long
// batches, then the rest - and within a batch from the tail towards the head. Read objects still
// move to the main queue, a standby's replay makes the same choices, and a snapshot keeps the
// policy.
#include "master/master_config.h"
#include "master/policy/evictor.h"
#include "master/policy/offload_planner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace granary::master {
namespace {

constexpr uint64_t kMiB = 1 << 20;

MasterPolicy Under(EvictionPolicy policy) {
  MasterPolicy p;
  p.eviction_policy = policy;
  return p;
}
MasterPolicy Prefix() { return Under(EvictionPolicy::kPrefix); }

class PrefixEvictionTest : public ::testing::Test {
 protected:
  PrefixEvictionTest() : state_(Prefix(), &clock_), evictor_(&state_) {
    EXPECT_TRUE(state_.Mount({"node", {"seg", 400 * kMiB, "", "", "", 0, true}}).status.ok());
  }
  // One batch put of `keys`, in order, as an engine puts a request's missing blocks.
  void PutBatch(const std::vector<std::string>& keys) {
    auto started = state_.PutStart({"w", keys, std::vector<uint64_t>(keys.size(), kMiB), {}, false});
    for (const auto& s : started) ASSERT_TRUE(s.status.ok());
    for (const Status& s :
         state_.PutEnd({"w", keys, std::vector<uint64_t>(keys.size(), 0), Gens(started)})) {
      ASSERT_TRUE(s.ok());
    }
    clock_.Advance(Millis(1));
  }
  static std::vector<std::string> Chain(const std::string& name, int n) {
    std::vector<std::string> keys;
    for (int i = 0; i < n; ++i) keys.push_back(name + std::to_string(i));
    return keys;
  }
  // Whether its memory is still there (an object with a disk copy outlives its memory).
  bool Exists(const std::string& key) {
    auto stat = state_.Stat(key);
    return stat.ok() && !stat->replicas.empty();
  }
  // Evicts one object at a time: the order in which the policy lets them go.
  std::vector<std::string> EvictionOrder(const std::vector<std::string>& candidates, size_t count) {
    std::vector<std::string> order;
    for (size_t i = 0; i < count; ++i) {
      EXPECT_EQ(evictor_.EvictBytes(kMiB).objects, 1u);
      for (const auto& k : candidates) {
        if (!Exists(k) && std::find(order.begin(), order.end(), k) == order.end()) order.push_back(k);
      }
    }
    return order;
  }

  ManualClock clock_;
  MasterState state_;
  Evictor evictor_;
};

TEST_F(PrefixEvictionTest, AChainLeavesFromItsTailAndItsTailFirstOfAll) {
  PutBatch(Chain("a", 4));
  PutBatch({"solo"});  // a batch of one key is no tail: its block was not re-hashed
  PutBatch(Chain("b", 3));
  std::vector<std::string> all = {"a0", "a1", "a2", "a3", "solo", "b0", "b1", "b2"};
  EXPECT_EQ(EvictionOrder(all, 8),
            (std::vector<std::string>{"a3", "b2", "a2", "a1", "a0", "solo", "b1", "b0"}));
}

TEST_F(PrefixEvictionTest, KeysOfLongBatchesLeaveBeforeThoseOfShortOnes) {
  PutBatch(Chain("long", 40));  // a long new stretch of prompt: a pasted document
  PutBatch(Chain("mid", 10));
  PutBatch(Chain("short", 3));  // a conversation's next turn
  std::vector<std::string> all = Chain("long", 40);
  for (const auto& k : Chain("mid", 10)) all.push_back(k);
  for (const auto& k : Chain("short", 3)) all.push_back(k);
  auto order = EvictionOrder(all, 53);
  ASSERT_EQ(order.size(), 53u);
  // Tails, then the long batch from its tail, then the 10-key batch, then the short one.
  EXPECT_EQ(std::vector<std::string>(order.begin(), order.begin() + 3),
            (std::vector<std::string>{"long39", "mid9", "short2"}));
  EXPECT_EQ(order[3], "long38");
  EXPECT_EQ(order[41], "long0");
  EXPECT_EQ(order[42], "mid8");
  EXPECT_EQ(order[50], "mid0");
  EXPECT_EQ(order[51], "short1");
  EXPECT_EQ(order[52], "short0");
}

TEST_F(PrefixEvictionTest, WithADiskTierOnlyKeysWithADiskCopyJumpTheQueue) {
  PutBatch(Chain("short", 3));
  PutBatch(Chain("long", 40));
  // The node's disk holds copies of long20..long38: those may leave memory early (demoted, still
  // readable); long0..long19 would be dropped, so they wait their FIFO turn.
  DiskRegisterOp disk{"node", {}, /*disk_id=*/42, true};
  for (int i = 20; i <= 38; ++i) disk.entries.push_back({"long" + std::to_string(i), kMiB, 0, 1000u + i});
  for (const Status& s : state_.DiskRegister(disk)) ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(state_.AnyDiskKnown());
  std::vector<std::string> all = Chain("short", 3);
  for (const auto& k : Chain("long", 40)) all.push_back(k);
  std::vector<std::string> want = {"short2", "long39"};                       // tails
  for (int i = 38; i >= 20; --i) want.push_back("long" + std::to_string(i));  // class 1, on disk
  want.insert(want.end(), {"short1", "short0"});                            // FIFO
  for (int i = 19; i >= 0; --i) want.push_back("long" + std::to_string(i));
  EXPECT_EQ(EvictionOrder(all, 43), want);
  EXPECT_EQ(state_.BatchExist({"long30"})[0], 1) << "demoted, not dropped";
  EXPECT_EQ(state_.BatchExist({"long10"})[0], 0);
}

TEST_F(PrefixEvictionTest, ATailReadOnProbationMovesToMainLikeAnyObject) {
  PutBatch(Chain("a", 3));
  ASSERT_TRUE(state_.GetReplicaList({"r", {"a0", "a1", "a2"}})[0].status.ok());
  ASSERT_TRUE(state_.FinishRead({"r", {"a0", "a1", "a2"}})[0].ok());
  PutBatch(Chain("b", 3));
  EXPECT_EQ(evictor_.EvictBytes(3 * kMiB).objects, 3u);
  for (const auto& k : Chain("a", 3)) EXPECT_TRUE(Exists(k)) << k << " was read: in main now";
  for (const auto& k : Chain("b", 3)) EXPECT_FALSE(Exists(k)) << k;
}

TEST_F(PrefixEvictionTest, AStandbysReplayChoosesTheSameVictims) {
  std::vector<Operation> log;
  state_.AddObserver([&](const Operation& op, const OpResult&) { log.push_back(op); });
  for (int i = 0; i < 40; ++i) {
    PutBatch(Chain("c" + std::to_string(i) + "-", 1 + i % 12));
    if (i % 4 == 1) {
      const std::string key = "c" + std::to_string(i / 2) + "-0";
      if (Exists(key)) {
        state_.GetReplicaList({"r", {key}});
        state_.FinishRead({"r", {key}});
      }
    }
    if (i % 8 == 7) evictor_.EvictBytes(20 * kMiB);
  }
  ManualClock standby_clock;
  MasterState standby(Prefix(), &standby_clock, state_.segment_id_base());
  ASSERT_TRUE(standby.Mount({"node", {"seg", 400 * kMiB, "", "", "", 0, true}}).status.ok());
  for (const auto& op : log) standby.Apply(op);
  standby_clock.Advance(Millis(clock_.NowMs() - standby_clock.NowMs()));
  Evictor standby_evictor(&standby);
  EXPECT_GT(evictor_.EvictBytes(30 * kMiB).objects, 0u);
  EXPECT_GT(standby_evictor.EvictBytes(30 * kMiB).objects, 0u);
  for (int i = 0; i < 40; ++i) {
    for (const auto& key : Chain("c" + std::to_string(i) + "-", 1 + i % 12)) {
      EXPECT_EQ(standby.BatchExist({key})[0], state_.BatchExist({key})[0]) << key;
    }
  }
}

TEST_F(PrefixEvictionTest, ASnapshotKeepsThePolicyAndAnUnknownOneIsRefused) {
  PutBatch(Chain("a", 2));
  const std::string snapshot = state_.EncodeSnapshot();
  auto policy = MasterState::SnapshotPolicy(snapshot);
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  EXPECT_EQ(policy->eviction_policy, EvictionPolicy::kPrefix);
  // The policy byte follows allow_evict_soft_pinned; find it by encoding another policy.
  ManualClock other_clock;
  MasterState other(Under(EvictionPolicy::kLru), &other_clock, state_.segment_id_base());
  const std::string lru_snapshot = other.EncodeSnapshot();
  size_t at = 0;
  while (at < std::min(snapshot.size(), lru_snapshot.size()) && snapshot[at] == lru_snapshot[at]) ++at;
  ASSERT_LT(at, snapshot.size());
  ASSERT_EQ(static_cast<uint8_t>(snapshot[at]), 2u);
  std::string unknown = snapshot;
  unknown[at] = 3;
  EXPECT_FALSE(MasterState::SnapshotPolicy(unknown).ok());
}

TEST_F(PrefixEvictionTest, LazyOffloadFollowsTheQueuesAndCopiesNoUnreadTail) {
  EXPECT_TRUE(state_.DiskRegister({"node", {}, /*disk_id=*/42, true}).empty());  // node has a disk
  PutBatch({"m"});
  ASSERT_EQ(evictor_.EvictBytes(kMiB).objects, 1u);
  PutBatch({"m"});  // remembered by the ghost: straight to the main queue
  PutBatch(Chain("short", 3));
  PutBatch(Chain("long", 34));
  PutBatch(Chain("mid", 9));
  OffloadPlanner planner(&state_, {Persistence::kLazy, 0.0});
  std::vector<std::string> want;
  for (int i = 32; i >= 0; --i) want.push_back("long" + std::to_string(i));  // class 1
  for (int i = 7; i >= 0; --i) want.push_back("mid" + std::to_string(i));    // class 2
  want.insert(want.end(), {"short1", "short0"});                           // class 3
  want.push_back("m");                                                     // main
  // The tails (short2, long33, mid8) are not copied: memory eviction drops them.
  EXPECT_EQ(planner.Plan("node", 1000, 1ull << 40), want);
  EXPECT_EQ(planner.Plan("node", 3, 1ull << 40),
            (std::vector<std::string>{"long32", "long31", "long30"}));
  // A tail that is read (it goes to the main queue at eviction's next pass) is copied with the
  // main queue's objects.
  ASSERT_TRUE(state_.GetReplicaList({"r", {"short2"}})[0].status.ok());
  ASSERT_TRUE(state_.FinishRead({"r", {"short2"}})[0].ok());
  want.push_back("short2");
  EXPECT_EQ(planner.Plan("node", 1000, 1ull << 40), want);
  // An eager put's tail is copied all the same: the put asked for it.
  PlacementConfig eager;
  eager.persistence = PutPersistence::kEager;
  auto started = state_.PutStart({"w", {"e0", "e1"}, {kMiB, kMiB}, eager, false});
  ASSERT_EQ(started.size(), 2u);
  ASSERT_TRUE(started[1].status.ok());
  for (const Status& s : state_.PutEnd({"w", {"e0", "e1"}, {0, 0}, Gens(started)})) {
    ASSERT_TRUE(s.ok());
  }
  const std::vector<std::string> plan = planner.Plan("node", 2, 1ull << 40);
  EXPECT_EQ(plan, (std::vector<std::string>{"e0", "e1"})) << "eager first, tail included";
}

TEST_F(PrefixEvictionTest, AHistoryOfS3FifoLoadsUnderPrefixAndTheOtherWayButNotUnderLru) {
  PutBatch(Chain("a", 3));
  const std::string prefix_snapshot = state_.EncodeSnapshot();
  auto load_under = [&](EvictionPolicy policy, const std::string& snapshot) {
    ManualClock clock;
    MasterState loaded(Under(policy), &clock, state_.segment_id_base());
    Status s = loaded.LoadSnapshot(snapshot);
    if (s.ok()) {
      EXPECT_EQ(loaded.object_count(), 3u);
      EXPECT_EQ(loaded.policy().eviction_policy, policy) << "the configured policy goes on";
    }
    return s;
  };
  EXPECT_TRUE(load_under(EvictionPolicy::kS3Fifo, prefix_snapshot).ok());
  EXPECT_TRUE(load_under(EvictionPolicy::kPrefix, prefix_snapshot).ok());
  EXPECT_EQ(load_under(EvictionPolicy::kLru, prefix_snapshot).code(), ErrorCode::INVALID_PARAMS);

  ManualClock clock;
  MasterState old(Under(EvictionPolicy::kS3Fifo), &clock, state_.segment_id_base());
  ASSERT_TRUE(old.Mount({"node", {"seg", 400 * kMiB, "", "", "", 0, true}}).status.ok());
  auto started = old.PutStart({"w", {"x", "y", "z"}, {kMiB, kMiB, kMiB}, {}, false});
  ASSERT_TRUE(old.PutEnd({"w", {"x", "y", "z"}, {0, 0, 0}, Gens(started)})[0].ok());
  const std::string s3fifo_snapshot = old.EncodeSnapshot();
  EXPECT_TRUE(load_under(EvictionPolicy::kPrefix, s3fifo_snapshot).ok());
  EXPECT_EQ(load_under(EvictionPolicy::kLru, s3fifo_snapshot).code(), ErrorCode::INVALID_PARAMS);
  // A standby adopts its leader's policy as it is.
  ManualClock standby_clock;
  MasterState standby(Under(EvictionPolicy::kLru), &standby_clock, state_.segment_id_base());
  ASSERT_TRUE(standby.LoadSnapshot(s3fifo_snapshot, /*adopt_policy=*/true).ok());
  EXPECT_EQ(standby.policy().eviction_policy, EvictionPolicy::kS3Fifo);
}

TEST(PrefixEvictionConfig, PrefixIsAcceptedByName) {
  MasterConfig config;
  // The master's default is prefix; a state machine built with no policy (tests, the benches'
  // in-process states) keeps s3fifo, the order those were written against.
  EXPECT_EQ(config.EffectivePolicy().eviction_policy, EvictionPolicy::kPrefix);
  EXPECT_EQ(MasterPolicy{}.eviction_policy, EvictionPolicy::kS3Fifo);
  config.eviction_policy = "prefix";
  EXPECT_TRUE(ValidateMasterConfig(config).ok());
  EXPECT_EQ(config.EffectivePolicy().eviction_policy, EvictionPolicy::kPrefix);
  config.eviction_policy = "s3fifo";
  EXPECT_EQ(config.EffectivePolicy().eviction_policy, EvictionPolicy::kS3Fifo);
  config.eviction_policy = "prefixes";
  EXPECT_EQ(ValidateMasterConfig(config).code(), ErrorCode::INVALID_PARAMS);
}

}  // namespace
}  // namespace granary::master
