// Eviction order (least recently accessed first) and its exemptions: read-locked, in flight,
// hard-pinned never; soft-pinned only when nothing else is left.
#include "master/evictor.h"

#include <gtest/gtest.h>

namespace granary::master {
namespace {

constexpr uint64_t kMiB = 1 << 20;

class EvictorTest : public ::testing::Test {
 protected:
  explicit EvictorTest(MasterPolicy policy = {}) : state_(policy, &clock_), evictor_(&state_) {
    EXPECT_TRUE(state_.Mount({"node", {"seg", 100 * kMiB, ""}}).status.ok());
  }

  void Put(const std::string& key, uint64_t size, PlacementConfig config = {}) {
    ASSERT_TRUE(state_.PutStart({"w", {key}, {size}, config, false})[0].status.ok()) << key;
    ASSERT_TRUE(state_.PutEnd({"w", {key}, {0}})[0].ok());
    clock_.Advance(Millis(1));
  }
  void Touch(const std::string& key) {
    ASSERT_TRUE(state_.GetReplicaList({"r", {key}})[0].status.ok());
    ASSERT_TRUE(state_.FinishRead({"r", {key}})[0].ok());
    clock_.Advance(Millis(1));
  }
  bool Exists(const std::string& key) { return state_.BatchExist({key})[0] == 1; }

  ManualClock clock_;
  MasterState state_;
  Evictor evictor_;
};

TEST_F(EvictorTest, EvictsLeastRecentlyAccessedFirst) {
  for (int i = 0; i < 10; ++i) Put("k" + std::to_string(i), kMiB);
  Touch("k0");  // k0 becomes the most recent
  EvictResult r = evictor_.EvictBytes(3 * kMiB);
  EXPECT_EQ(r.objects, 3u);
  EXPECT_EQ(r.bytes, 3 * kMiB);
  EXPECT_TRUE(Exists("k0"));
  EXPECT_FALSE(Exists("k1"));
  EXPECT_FALSE(Exists("k2"));
  EXPECT_FALSE(Exists("k3"));
  EXPECT_TRUE(Exists("k4"));
}

TEST_F(EvictorTest, ExistenceChecksDoNotRefreshRecency) {
  Put("old", kMiB);
  Put("new", kMiB);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(Exists("old"));
  evictor_.EvictBytes(kMiB);
  EXPECT_FALSE(Exists("old"));
  EXPECT_TRUE(Exists("new"));
}

TEST_F(EvictorTest, TiesAreBrokenOnlyAsFarAsNeeded) {
  // Same access time for all: evict just enough of them.
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(state_.PutStart({"w", {"t" + std::to_string(i)}, {kMiB}, {}, false})[0].status.ok());
    ASSERT_TRUE(state_.PutEnd({"w", {"t" + std::to_string(i)}, {0}})[0].ok());
  }
  EvictResult r = evictor_.EvictBytes(2 * kMiB);
  EXPECT_EQ(r.objects, 2u);
  EXPECT_EQ(state_.object_count(), 8u);
}

TEST_F(EvictorTest, NeverTakesLockedInFlightOrHardPinned) {
  Put("locked", kMiB);
  PlacementConfig hard;
  hard.with_hard_pin = true;
  Put("pinned", kMiB, hard);
  ASSERT_TRUE(state_.PutStart({"w", {"inflight"}, {kMiB}, {}, false})[0].status.ok());
  Put("plain", kMiB);
  ASSERT_TRUE(state_.GetReplicaList({"reader", {"locked"}})[0].status.ok());

  EvictResult r = evictor_.EvictBytes(100 * kMiB);
  EXPECT_EQ(r.objects, 1u);
  EXPECT_FALSE(Exists("plain"));
  EXPECT_TRUE(Exists("locked"));
  EXPECT_TRUE(Exists("pinned"));
  EXPECT_TRUE(state_.PutEnd({"w", {"inflight"}, {0}})[0].ok()) << "the put in flight survived";

  clock_.Advance(Millis(MasterPolicy{}.lease_ttl_ms + 1));  // the reader died; its lock expires
  evictor_.EvictBytes(100 * kMiB);
  EXPECT_FALSE(Exists("locked"));
  EXPECT_TRUE(Exists("pinned"));
  EXPECT_TRUE(state_.Remove({{"pinned"}, false})[0].ok()) << "hard-pinned is still removable";
}

TEST_F(EvictorTest, SoftPinnedGoLast) {
  PlacementConfig soft;
  soft.with_soft_pin = true;
  Put("soft-old", kMiB, soft);
  Put("plain-new", kMiB);
  evictor_.EvictBytes(kMiB);
  EXPECT_TRUE(Exists("soft-old")) << "older, but soft-pinned";
  EXPECT_FALSE(Exists("plain-new"));
  evictor_.EvictBytes(kMiB);
  EXPECT_FALSE(Exists("soft-old")) << "nothing else left";
}

TEST_F(EvictorTest, SoftPinExpiresWithItsTtl) {
  PlacementConfig soft;
  soft.with_soft_pin = true;
  soft.soft_pin_ttl_ms = 1'000;
  Put("soft", kMiB, soft);
  Put("plain", kMiB);
  clock_.Advance(Millis(1'001));
  evictor_.EvictBytes(kMiB);
  EXPECT_FALSE(Exists("soft")) << "its pin expired, and it is the oldest";
  EXPECT_TRUE(Exists("plain"));
}

class EvictorNoSoftTest : public EvictorTest {
 protected:
  static MasterPolicy NoSoft() {
    MasterPolicy p;
    p.allow_evict_soft_pinned = false;
    return p;
  }
  EvictorNoSoftTest() : EvictorTest(NoSoft()) {}
};

TEST_F(EvictorNoSoftTest, SoftPinnedAreKeptWhenPolicyForbids) {
  PlacementConfig soft;
  soft.with_soft_pin = true;
  Put("soft", kMiB, soft);
  EXPECT_EQ(evictor_.EvictBytes(kMiB).objects, 0u);
  EXPECT_TRUE(Exists("soft"));
}

TEST_F(EvictorTest, WatermarkTriggersEvictionOfRatio) {
  for (int i = 0; i < 89; ++i) Put("k" + std::to_string(i), kMiB);
  EXPECT_EQ(evictor_.RunIfAboveWatermark().objects, 0u) << "89% is below the 90% watermark";
  Put("k89", kMiB);
  Put("k90", kMiB);
  EvictResult r = evictor_.RunIfAboveWatermark();
  // 91% used: back to 90%, plus 5% of the capacity.
  EXPECT_GE(r.bytes, 6 * kMiB);
  EXPECT_LE(r.bytes, 7 * kMiB);
  EXPECT_FALSE(Exists("k0"));
  EXPECT_TRUE(Exists("k90"));
}

TEST_F(EvictorTest, EvictForAllocationFreesAtLeastTheRatio) {
  for (int i = 0; i < 50; ++i) Put("k" + std::to_string(i), kMiB);
  EXPECT_GE(evictor_.EvictForAllocation(kMiB).bytes, 5 * kMiB);
  EXPECT_GE(evictor_.EvictForAllocation(20 * kMiB).bytes, 20 * kMiB);
}

TEST_F(EvictorTest, ReplicasCountTowardsFreedBytes) {
  ASSERT_TRUE(state_.Mount({"node2", {"seg2", 100 * kMiB, ""}}).status.ok());
  PlacementConfig two;
  two.replica_num = 2;
  Put("a", kMiB, two);
  Put("b", kMiB, two);
  EvictResult r = evictor_.EvictBytes(2 * kMiB);
  EXPECT_EQ(r.objects, 1u);
  EXPECT_EQ(r.bytes, 2 * kMiB);
}

}  // namespace
}  // namespace granary::master
