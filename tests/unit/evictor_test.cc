// Eviction order (lru: least recently accessed first; s3fifo: probation, main queue, ghost) and its
// exemptions under both: read-locked, in flight, hard-pinned never; soft-pinned only when nothing
// else is left.
#include "master/policy/evictor.h"
#include "master/master_config.h"
#include "master/codec/binary_codec.h"
#include "master/state/ghost_index.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <functional>

namespace granary::master {
namespace {

constexpr uint64_t kMiB = 1 << 20;

class EvictorTest : public ::testing::Test {
 protected:
  static MasterPolicy Lru() {
    MasterPolicy p;
    p.eviction_policy = EvictionPolicy::kLru;
    return p;
  }
  explicit EvictorTest(MasterPolicy policy = Lru()) : state_(policy, &clock_), evictor_(&state_) {
    EXPECT_TRUE(state_.Mount({"node", {"seg", 100 * kMiB, "", "", "", 0, true}}).status.ok());
  }

  void Put(const std::string& key, uint64_t size, PlacementConfig config = {}) {
    auto started = state_.PutStart({"w", {key}, {size}, config, false});
    ASSERT_TRUE(started[0].status.ok()) << key;
    ASSERT_TRUE(state_.PutEnd({"w", {key}, {0}, Gens(started)})[0].ok());
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
    const std::string key = "t" + std::to_string(i);
    ASSERT_TRUE(state_.PutEnd({"w", {key}, {0}, {state_.Stat(key)->put_gen}})[0].ok());
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
  EXPECT_TRUE(state_.PutEnd({"w", {"inflight"}, {0}, {state_.Stat("inflight")->put_gen}})[0].ok()) << "the put in flight survived";

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
    MasterPolicy p = Lru();
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
  for (int i = 0; i < 100; ++i) Put("k" + std::to_string(i), kMiB);  // full
  EXPECT_GE(evictor_.EvictForAllocation(kMiB, kMiB).bytes, 5 * kMiB);
  EXPECT_GE(evictor_.EvictForAllocation(20 * kMiB, 20 * kMiB).bytes, 20 * kMiB);
}

TEST_F(EvictorTest, EvictForAllocationEvictsNothingWhenTheSpaceIsAlreadyFree) {
  // Another put's eviction got there first: this one must not take a second share.
  for (int i = 0; i < 50; ++i) Put("k" + std::to_string(i), kMiB);
  EXPECT_EQ(evictor_.EvictForAllocation(kMiB, kMiB).objects, 0u);
  EXPECT_EQ(state_.object_count(), 50u);
}

TEST_F(EvictorTest, OneAllocationNeverFlushesMoreThanAQuarterOfTheCache) {
  for (int i = 0; i < 100; ++i) Put("k" + std::to_string(i), kMiB);
  EvictResult r = evictor_.EvictForAllocation(90 * kMiB, 90 * kMiB);
  EXPECT_LE(r.bytes, 26 * kMiB);
  EXPECT_GE(state_.object_count(), 74u);
}

// Half the cache free but in 1 MiB holes, every other remaining object read recently: the bytes
// are there, one segment lacks a block. Evicting the globally oldest bytes would leave 3 MiB holes;
// eviction must instead clear one run of the short segment, the run whose newest object is oldest.
void FragmentWithHotObjectsEvery4MiB(MasterState& state,
                                     const std::function<void(const std::string&)>& put,
                                     const std::function<void(const std::string&)>& touch) {
  for (int i = 0; i < 100; ++i) put("k" + std::to_string(i));
  for (int i = 0; i < 100; i += 2) ASSERT_TRUE(state.Remove({{"k" + std::to_string(i)}, false})[0].ok());
  for (int i = 3; i < 100; i += 4) touch("k" + std::to_string(i));
}

TEST_F(EvictorTest, ScatteredFreeSpaceEvictsOneRunOnTheShortSegment) {
  FragmentWithHotObjectsEvery4MiB(
      state_, [&](const std::string& k) { Put(k, kMiB); }, [&](const std::string& k) { Touch(k); });
  ASSERT_EQ(state_.segments().Usage()[0].stats.free_bytes, 50 * kMiB);
  ASSERT_LT(state_.segments().Usage()[0].stats.largest_free_block, 8 * kMiB);
  EvictResult r = evictor_.EvictForAllocation(8 * kMiB, 8 * kMiB);
  EXPECT_LE(r.objects, 5u) << "evicted more than one run's objects";
  EXPECT_GE(state_.segments().Usage()[0].stats.largest_free_block, 8 * kMiB);
  auto placed = state_.PutStart({"w", {"big"}, {8 * kMiB}, {}, false});
  EXPECT_TRUE(placed[0].status.ok()) << placed[0].status.ToString();
  EXPECT_TRUE(Exists("k99")) << "the most recently read object went";
  EXPECT_TRUE(Exists("k97"));
}

TEST_F(EvictorTest, ScatteredFreeSpaceAmongPinnedObjectsEvictsNothing) {
  // Every other MiB hard-pinned: no run of 8 MiB can be freed, so nothing is evicted for it.
  PlacementConfig pinned;
  pinned.with_hard_pin = true;
  for (int i = 0; i < 100; ++i) Put("k" + std::to_string(i), kMiB, i % 2 ? pinned : PlacementConfig{});
  for (int i = 0; i < 100; i += 2) ASSERT_TRUE(state_.Remove({{"k" + std::to_string(i)}, false})[0].ok());
  EvictResult r = evictor_.EvictForAllocation(8 * kMiB, 8 * kMiB);
  EXPECT_EQ(r.objects, 0u);
  EXPECT_EQ(state_.object_count(), 50u);
}

TEST_F(EvictorTest, ReplicasCountTowardsFreedBytes) {
  ASSERT_TRUE(state_.Mount({"node2", {"seg2", 100 * kMiB, "", "", "", 0, true}}).status.ok());
  PlacementConfig two;
  two.replica_num = 2;
  Put("a", kMiB, two);
  Put("b", kMiB, two);
  EvictResult r = evictor_.EvictBytes(2 * kMiB);
  EXPECT_EQ(r.objects, 1u);
  EXPECT_EQ(r.bytes, 2 * kMiB);
}

class S3FifoTest : public EvictorTest {
 protected:
  static MasterPolicy S3Fifo() {
    MasterPolicy p;
    p.eviction_policy = EvictionPolicy::kS3Fifo;
    return p;
  }
  S3FifoTest() : EvictorTest(S3Fifo()) {}
};

TEST_F(EvictorTest, LruEvictsAnObjectReadBeforeANewerOneHitWonder) {
  Put("hot", kMiB);
  Touch("hot");
  Put("cold", kMiB);
  evictor_.EvictBytes(kMiB);
  EXPECT_FALSE(Exists("hot")) << "lru: its last read is older than the other's put";
  EXPECT_TRUE(Exists("cold"));
}

TEST_F(S3FifoTest, OneHitWonderGoesBeforeAnObjectReadOnProbation) {
  Put("hot", kMiB);
  Touch("hot");
  Put("cold", kMiB);
  EvictResult r = evictor_.EvictBytes(kMiB);
  EXPECT_EQ(r.objects, 1u);
  EXPECT_TRUE(Exists("hot")) << "read while on probation: promoted to the main queue";
  EXPECT_FALSE(Exists("cold")) << "never read";
}

TEST_F(S3FifoTest, ProbationIsFirstInFirstOut) {
  for (int i = 0; i < 10; ++i) Put("k" + std::to_string(i), kMiB);
  EXPECT_EQ(evictor_.EvictBytes(3 * kMiB).objects, 3u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(Exists("k" + std::to_string(i)), i >= 3) << i;
}

TEST_F(S3FifoTest, GhostSendsAReputKeyStraightToMain) {
  Put("again", kMiB);
  Put("filler", kMiB);
  evictor_.EvictBytes(kMiB);
  ASSERT_FALSE(Exists("again"));
  EXPECT_EQ(state_.ghost_count(), 1u);
  Put("again", kMiB);  // remembered: enters the main queue
  EXPECT_EQ(state_.ghost_count(), 0u);
  for (int i = 0; i < 5; ++i) Put("new" + std::to_string(i), kMiB);
  evictor_.EvictBytes(2 * kMiB);
  EXPECT_TRUE(Exists("again")) << "in main, while probation holds more than its share";
  EXPECT_FALSE(Exists("filler"));
  EXPECT_FALSE(Exists("new0"));
  EXPECT_TRUE(Exists("new1"));
}

TEST_F(S3FifoTest, MainQueueGivesAReadObjectAnotherPass) {
  Put("m1", kMiB);
  Put("m2", kMiB);
  Put("x", kMiB);
  Touch("m1");
  Touch("m2");
  evictor_.EvictBytes(kMiB);  // m1, m2 promoted; x evicted
  ASSERT_FALSE(Exists("x"));
  Touch("m1");  // m1 is older in main, but read again
  evictor_.EvictBytes(kMiB);
  EXPECT_TRUE(Exists("m1"));
  EXPECT_FALSE(Exists("m2"));
  evictor_.EvictBytes(kMiB);  // m1 spent its read on the last pass
  EXPECT_FALSE(Exists("m1"));
}

TEST_F(S3FifoTest, KeepsThePromisesOfLru) {
  Put("locked", kMiB);
  PlacementConfig hard;
  hard.with_hard_pin = true;
  Put("pinned", kMiB, hard);
  PlacementConfig soft;
  soft.with_soft_pin = true;
  Put("soft", kMiB, soft);
  ASSERT_TRUE(state_.PutStart({"w", {"inflight"}, {kMiB}, {}, false})[0].status.ok());
  Put("plain", kMiB);
  ASSERT_TRUE(state_.GetReplicaList({"reader", {"locked"}})[0].status.ok());

  EvictResult r = evictor_.EvictBytes(kMiB);
  EXPECT_EQ(r.objects, 1u);
  EXPECT_FALSE(Exists("plain"));
  EXPECT_TRUE(Exists("soft")) << "soft-pinned go last";
  evictor_.EvictBytes(100 * kMiB);
  EXPECT_FALSE(Exists("soft"));
  EXPECT_TRUE(Exists("locked"));
  EXPECT_TRUE(Exists("pinned"));
  EXPECT_TRUE(state_.PutEnd({"w", {"inflight"}, {0}, {state_.Stat("inflight")->put_gen}})[0].ok()) << "the put in flight survived";
}

TEST_F(S3FifoTest, PinnedBytesDoNotCountTowardsTheProbationShare) {
  // Hard-pinned objects never leave probation; were their bytes counted, probation would always
  // look over its 10% share and every newcomer would be evicted before any stale main object.
  PlacementConfig hard;
  hard.with_hard_pin = true;
  for (int i = 0; i < 6; ++i) Put("pinned" + std::to_string(i), kMiB, hard);
  for (int i = 0; i < 10; ++i) Put("m" + std::to_string(i), kMiB);
  ASSERT_EQ(evictor_.EvictBytes(10 * kMiB).objects, 10u);  // m0..m9 go, remembered by the ghost
  for (int i = 0; i < 10; ++i) Put("m" + std::to_string(i), kMiB);  // back: straight to main
  Put("fresh", kMiB);  // probation: 1 of 11 evictable MiB, under its share
  ASSERT_EQ(evictor_.EvictBytes(kMiB).objects, 1u);
  EXPECT_TRUE(Exists("fresh"));
  EXPECT_FALSE(Exists("m0")) << "the oldest unread object of the main queue goes";
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(Exists("pinned" + std::to_string(i)));
}

TEST_F(S3FifoTest, ReadBetweenChoiceAndApplyEarnsAnotherPass) {
  Put("a", kMiB);
  Touch("a");
  EvictResult r = state_.Evict(EvictOp{{"a"}, false, {}});
  EXPECT_EQ(r.objects, 0u) << "the evictor saw it unread; a read since wins it a pass";
  EXPECT_TRUE(Exists("a"));
}

// The ghost keeps fingerprints only in its FIFO (an entry's number follows from its place) and
// its index in an open-addressing table: a state whose ghost has wrapped (entries left its FIFO)
// and holds re-added keys loads to the same snapshot and ghost, and encodes to fixed bytes.
TEST(S3FifoGhostTest, TheGhostKeepsItsSnapshotBytes) {
  ManualClock clock;
  MasterPolicy policy;
  policy.eviction_policy = EvictionPolicy::kS3Fifo;
  MasterState state(policy, &clock, /*segment_id_base=*/uint64_t{1} << 32);  // fixed: same bytes
  Evictor evictor(&state);
  ASSERT_TRUE(state.Mount({"node", {"seg", 100 * kMiB, "", "", "", 0, true}}).status.ok());
  auto put = [&](const std::string& key) {
    auto started = state.PutStart({"w", {key}, {kMiB}, {}, false});
    ASSERT_TRUE(started[0].status.ok()) << key;
    ASSERT_TRUE(state.PutEnd({"w", {key}, {0}, {started[0].put_gen}})[0].ok());
    clock.Advance(Millis(1));
  };
  for (int i = 0; i < 400; ++i) {
    put("k" + std::to_string(i));
    const std::string again = "k" + std::to_string(i / 3);
    if (i % 7 == 0 && state.BatchExist({again})[0] == 0) put(again);  // a ghost hit, or a re-add
    if (i % 10 == 9) evictor.EvictBytes(12 * kMiB);
  }
  ASSERT_GT(state.ghost_count(), 16u);
  const std::string snapshot = state.EncodeSnapshot();
  ManualClock other_clock;
  MasterState restored(policy, &other_clock, uint64_t{1} << 32);
  ASSERT_TRUE(restored.LoadSnapshot(snapshot).ok());
  EXPECT_EQ(restored.EncodeSnapshot(), snapshot);
  EXPECT_EQ(restored.ghost_count(), state.ghost_count());
  // What a build of 3593b64 (the ghost as a deque of pairs and an unordered_map) encoded for the
  // same operations was 3,822 bytes; snapshot format 9 (extents without an allocator handle, an
  // allocator without nodes for allocations, the ghost's fingerprints of 32 bits and no entry
  // numbers in its FIFO) made it these 3,268 bytes, this digest.
  EXPECT_EQ(snapshot.size(), 3268u);
  EXPECT_EQ(state.Digest(), 0x1571f5ed18694724ull);
}

// The ghost's index keeps 32 bits of an entry's number, which name one entry only within its
// FIFO: a load refuses a live entry outside the FIFO, one whose FIFO place holds another key's
// fingerprint or is not its key's newest, a key listed twice, and a fingerprint of 0 (no key's).
TEST(S3FifoGhostTest, ALoadRefusesAGhostEntryTheFifoDoesNotHold) {
  ManualClock clock;
  MasterPolicy policy;
  policy.eviction_policy = EvictionPolicy::kS3Fifo;
  MasterState state(policy, &clock, uint64_t{1} << 32);
  Evictor evictor(&state);
  ASSERT_TRUE(state.Mount({"node", {"seg", 100 * kMiB, "", "", "", 0, true}}).status.ok());
  auto started = state.PutStart({"w", {"a"}, {kMiB}, {}, false});
  ASSERT_TRUE(started[0].status.ok());
  ASSERT_TRUE(state.PutEnd({"w", {"a"}, {0}, {started[0].put_gen}})[0].ok());
  ASSERT_EQ(evictor.EvictBytes(kMiB).objects, 1u);
  ASSERT_EQ(state.ghost_count(), 1u);
  const std::string snapshot = state.EncodeSnapshot();

  // a's stripe: next 1, a FIFO of one (its fingerprint), one live entry (its fingerprint, 0).
  const uint32_t fp = GhostFingerprint(XXH3_64bits("a", 1));
  // A stripe's bytes: next, the FIFO's fingerprints, the live (fingerprint, entry) pairs.
  auto stripe = [](uint64_t next, std::vector<uint32_t> fifo,
                   std::vector<std::pair<uint32_t, uint64_t>> live) {
    Encoder e;
    uint64_t n = fifo.size(), m = live.size();
    e(next); e(n);
    for (uint32_t f : fifo) e(f);
    e(m);
    for (auto [f, entry] : live) {
      e(f); e(entry);
    }
    return e.Take();
  };
  const std::string genuine = stripe(1, {fp}, {{fp, 0}});
  const size_t at = snapshot.find(genuine);
  ASSERT_NE(at, std::string::npos) << "the ghost's layout changed: update this test";
  ASSERT_EQ(snapshot.find(genuine, at + 1), std::string::npos);
  auto with = [&](const std::string& forged) {
    std::string bytes = snapshot;
    bytes.replace(at, genuine.size(), forged);
    return bytes;
  };
  {
    MasterState copy(policy, &clock, uint64_t{1} << 32);
    ASSERT_TRUE(copy.LoadSnapshot(with(genuine)).ok());
    EXPECT_EQ(copy.ghost_count(), 1u);
  }
  {
    // Two entries of a, the second live: as a re-evicted key leaves it.
    MasterState copy(policy, &clock, uint64_t{1} << 32);
    ASSERT_TRUE(copy.LoadSnapshot(with(stripe(2, {fp, fp}, {{fp, 1}}))).ok());
    EXPECT_EQ(copy.ghost_count(), 1u);
  }
  // Each forged stripe is refused by its own check (the message after "malformed ghost: ").
  const std::pair<const char*, std::string> refused[] = {
      {"an entry never numbered", with(stripe(1, {fp}, {{fp, 1}}))},
      {"a live entry that left the FIFO", with(stripe(2, {fp}, {{fp, 0}}))},
      {"another key's entry", with(stripe(1, {fp}, {{fp ^ 1, 0}}))},
      {"a key listed twice", with(stripe(2, {fp, fp}, {{fp, 1}, {fp, 1}}))},
      {"a live entry older than its key's newest", with(stripe(2, {fp, fp}, {{fp, 0}}))},
      {"a fingerprint of 0", with(stripe(1, {0}, {{fp, 0}}))},
  };
  for (const auto& [why, bytes] : refused) {
    MasterState copy(policy, &clock, uint64_t{1} << 32);
    const Status loaded = copy.LoadSnapshot(bytes);
    EXPECT_FALSE(loaded.ok()) << why;
    EXPECT_NE(loaded.message().find(std::string("malformed ghost: ") + why), std::string::npos)
        << why << ": " << loaded.message();
    EXPECT_EQ(copy.ghost_count(), 0u) << "a refused load changes nothing";
  }
}

TEST_F(S3FifoTest, ReplayingTheOperationsGivesTheSameQueues) {
  std::vector<Operation> log;
  state_.AddObserver([&](const Operation& op, const OpResult&) { log.push_back(op); });
  for (int i = 0; i < 60; ++i) {
    Put("k" + std::to_string(i), kMiB);
    if (i % 3 == 0 && Exists("k" + std::to_string(i / 2))) Touch("k" + std::to_string(i / 2));
    if (i % 10 == 9) evictor_.EvictBytes(4 * kMiB);
  }
  ManualClock standby_clock;
  MasterState standby(S3Fifo(), &standby_clock, state_.segment_id_base());
  ASSERT_TRUE(standby.Mount({"node", {"seg", 100 * kMiB, "", "", "", 0, true}}).status.ok());  // as the fixture did
  for (const auto& op : log) standby.Apply(op);
  EXPECT_EQ(standby.object_count(), state_.object_count());
  EXPECT_EQ(standby.ghost_count(), state_.ghost_count());
  // Same queues: the next eviction chooses the same objects on both.
  standby_clock.Advance(Millis(clock_.NowMs() - standby_clock.NowMs()));
  Evictor standby_evictor(&standby);
  evictor_.EvictBytes(10 * kMiB);
  standby_evictor.EvictBytes(10 * kMiB);
  for (int i = 0; i < 60; ++i) {
    std::string key = "k" + std::to_string(i);
    EXPECT_EQ(standby.BatchExist({key})[0], state_.BatchExist({key})[0]) << key;
  }
}

TEST(EvictionPolicyConfig, PrefixByDefaultLruOnRequestNothingElse) {
  MasterConfig config;
  EXPECT_EQ(config.EffectivePolicy().eviction_policy, EvictionPolicy::kPrefix);
  config.eviction_policy = "lru";
  EXPECT_TRUE(ValidateMasterConfig(config).ok());
  EXPECT_EQ(config.EffectivePolicy().eviction_policy, EvictionPolicy::kLru);
  config.eviction_policy = "arc";
  EXPECT_EQ(ValidateMasterConfig(config).code(), ErrorCode::INVALID_PARAMS);
  config.eviction_policy = "lru";
  EXPECT_EQ(config.EffectiveOffload().persistence, Persistence::kLazy);
  config.persistence = "eager";
  EXPECT_TRUE(ValidateMasterConfig(config).ok());
  EXPECT_EQ(config.EffectiveOffload().persistence, Persistence::kEager);
  config.persistence = "always";
  EXPECT_EQ(ValidateMasterConfig(config).code(), ErrorCode::INVALID_PARAMS);
}

}  // namespace
}  // namespace granary::master

namespace granary::master {
namespace {
TEST_F(S3FifoTest, ScatteredFreeSpaceEvictsOneRunOnTheShortSegment) {
  FragmentWithHotObjectsEvery4MiB(
      state_, [&](const std::string& k) { Put(k, kMiB); }, [&](const std::string& k) { Touch(k); });
  EvictResult r = evictor_.EvictForAllocation(8 * kMiB, 8 * kMiB);
  EXPECT_LE(r.objects, 5u);
  EXPECT_GE(state_.segments().Usage()[0].stats.largest_free_block, 8 * kMiB);
  auto placed = state_.PutStart({"w", {"big"}, {8 * kMiB}, {}, false});
  EXPECT_TRUE(placed[0].status.ok()) << placed[0].status.ToString();
  EXPECT_TRUE(Exists("k99"));
}
}  // namespace
}  // namespace granary::master
