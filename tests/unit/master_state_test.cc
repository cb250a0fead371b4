// Semantics of every master operation, with a manual clock so TTLs are tested without sleeping.
#include "master/state/master_state.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <set>
#include <span>
#include <string_view>

namespace granary::master {
namespace {

constexpr uint64_t kMiB = 1 << 20;

class MasterStateTest : public ::testing::Test {
 protected:
  MasterStateTest() : state_(Policy(), &clock_) {}

  static MasterPolicy Policy() {
    MasterPolicy p;
    p.lease_ttl_ms = 10'000;
    p.client_ttl_ms = 10'000;
    p.put_discard_timeout_ms = 30'000;
    p.put_release_timeout_ms = 600'000;
    return p;
  }

  uint64_t MountSeg(const std::string& client, const std::string& name, uint64_t size) {
    MountResult r = state_.Mount({client, {name, size, "127.0.0.1:1", "", "", 0, true}});
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    return r.segment_id;
  }

  PutStartKeyResult Start(const std::string& client, const std::string& key, uint64_t size,
                          PlacementConfig config = {}, bool upsert = false) {
    return state_.PutStart({client, {key}, {size}, config, upsert})[0];
  }
  Status End(const std::string& client, const std::string& key, uint64_t checksum = 7) {
    return state_.PutEnd({client, {key}, {checksum}, {Gen(key)}})[0];
  }
  void Put(const std::string& client, const std::string& key, uint64_t size,
           PlacementConfig config = {}) {
    ASSERT_TRUE(Start(client, key, size, config).status.ok());
    ASSERT_TRUE(End(client, key).ok());
  }
  // The pending put's generation, as its writer would quote it (0: none pending).
  uint64_t Gen(const std::string& key) {
    auto stat = state_.Stat(key);
    return stat.ok() ? stat->put_gen : 0;
  }
  ReadKeyResult Get(const std::string& client, const std::string& key) {
    return state_.GetReplicaList({client, {key}})[0];
  }
  int32_t Exists(const std::string& key) { return state_.BatchExist({key})[0]; }

  ManualClock clock_;
  MasterState state_;
};

TEST_F(MasterStateTest, PutEndGetRoundTrip) {
  MountSeg("node", "seg", 64 * kMiB);
  auto started = Start("w", "k", kMiB);
  ASSERT_TRUE(started.status.ok());
  ASSERT_EQ(started.replicas.size(), 1u);
  EXPECT_LE(started.replicas[0].offset + started.replicas[0].length, 64 * kMiB);
  EXPECT_EQ(Exists("k"), 0) << "an object being written is not visible";
  EXPECT_EQ(Get("r", "k").status.code(), ErrorCode::REPLICA_IS_NOT_READY);
  ASSERT_TRUE(End("w", "k", 0xabc).ok());
  EXPECT_EQ(Exists("k"), 1);
  auto got = Get("r", "k");
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.size, kMiB);
  EXPECT_EQ(got.checksum, 0xabcu);
  ASSERT_EQ(got.replicas.size(), 1u);
  EXPECT_EQ(got.replicas[0].offset, started.replicas[0].offset);
  EXPECT_EQ(state_.object_count(), 1u);
}

TEST_F(MasterStateTest, MissingObjectIsNotFound) {
  MountSeg("node", "seg", 64 * kMiB);
  EXPECT_EQ(Get("r", "nope").status.code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(state_.BatchGetSize({"nope"})[0], static_cast<int64_t>(ErrorCode::OBJECT_NOT_FOUND));
  EXPECT_EQ(state_.Remove({{"nope"}, false})[0].code(), ErrorCode::OBJECT_NOT_FOUND);
}

TEST_F(MasterStateTest, PutOfExistingOrInFlightKeyIsAlreadyExists) {
  MountSeg("node", "seg", 64 * kMiB);
  ASSERT_TRUE(Start("w", "k", kMiB).status.ok());
  EXPECT_EQ(Start("w2", "k", kMiB).status.code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  ASSERT_TRUE(End("w", "k", 1).ok());
  EXPECT_EQ(Start("w2", "k", 2 * kMiB).status.code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ(Get("r", "k").size, kMiB) << "the old value is kept";
}

// A client that lost the answer to its put (a failover) or gave up on it puts the key again:
// its own pending write is taken over (a new generation; the old one can no longer end), and its
// space is held until the release timeout, as a zombie's. Another client's is not.
TEST_F(MasterStateTest, AClientPuttingAKeyAgainTakesOverItsOwnPendingWrite) {
  MountSeg("node", "seg", 64 * kMiB);
  ASSERT_TRUE(Start("w", "k", kMiB).status.ok());
  const uint64_t first = Gen("k");
  EXPECT_EQ(Start("other", "k", kMiB).status.code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  auto again = Start("w", "k", 2 * kMiB);
  ASSERT_TRUE(again.status.ok()) << again.status.ToString();
  const uint64_t second = Gen("k");
  EXPECT_GT(second, first);
  EXPECT_EQ(state_.segments().used_bytes(), 3 * kMiB) << "the first write's extent is held";
  EXPECT_EQ(state_.PutEnd({"w", {"k"}, {7}, {first}})[0].code(), ErrorCode::ILLEGAL_CLIENT)
      << "the given-up write can no longer end";
  ASSERT_TRUE(End("w", "k").ok());
  EXPECT_EQ(Get("r", "k").size, 2 * kMiB);
  // Once committed, write-once holds for its own client too.
  EXPECT_EQ(Start("w", "k", kMiB).status.code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  clock_.Advance(Millis(600'001));
  state_.Sweep();
  EXPECT_EQ(state_.segments().used_bytes(), 2 * kMiB) << "freed after the release timeout";
}

TEST_F(MasterStateTest, DuplicateKeysInOneBatch) {
  MountSeg("node", "seg", 64 * kMiB);
  auto results = state_.PutStart({"w", {"k", "k"}, {kMiB, kMiB}, {}, false});
  EXPECT_TRUE(results[0].status.ok());
  EXPECT_EQ(results[1].status.code(), ErrorCode::OBJECT_ALREADY_EXISTS);
}

// Few shards, many keys: every shard holds dozens of a batch's keys. Each key's answer still
// lands at its own position, a repeated key is answered in the batch's order (the first one
// starts the put, a later one finds it in flight), and the query on views agrees with the one
// on strings.
// Batch lookups run stage by stage over the whole batch (MasterState::FindAll). Against a plain
// set, over random batches of present, removed, never-seen and repeated keys, with 2 shards of
// ~1500 objects (long bucket chains and many absent keys landing in occupied buckets).
// A state of `shards` shards with one 256 MiB segment: few shards, so each holds many keys.
class MasterStateBatchTest : public ::testing::Test {
 protected:
  std::unique_ptr<MasterState> Crowded(uint32_t shards) {
    MasterPolicy policy;
    policy.shard_count = shards;
    auto state = std::make_unique<MasterState>(policy, &clock_);
    EXPECT_TRUE(state->Mount({"node", {"seg", 256 * kMiB, "127.0.0.1:1", "", "", 0, true}}).status.ok());
    return state;
  }
  ManualClock clock_;
};

TEST_F(MasterStateBatchTest, BatchLookupsAgreeWithASetOverRandomBatches) {
  auto owned = Crowded(2);
  MasterState& state = *owned;
  std::set<std::string> present;
  std::vector<std::string> keys;
  for (int i = 0; i < 3000; ++i) keys.push_back("k/" + std::to_string(i * 7919 % 100003));
  for (size_t at = 0; at < keys.size(); at += 100) {
    std::vector<std::string> batch(keys.begin() + at, keys.begin() + at + 100);
    auto started = state.PutStart({"w", batch, std::vector<uint64_t>(batch.size(), 64), {}, false});
    ASSERT_TRUE(state.PutEnd({"w", batch, std::vector<uint64_t>(batch.size(), 1), Gens(started)})[0].ok());
    present.insert(batch.begin(), batch.end());
  }
  std::vector<std::string> removed;
  for (size_t i = 0; i < keys.size(); i += 3) removed.push_back(keys[i]);
  for (size_t at = 0; at < removed.size(); at += 100) {
    std::vector<std::string> batch(removed.begin() + at,
                                   removed.begin() + std::min(removed.size(), at + 100));
    state.Remove({batch, true});
    for (const auto& k : batch) present.erase(k);
  }
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::string> batch;
    for (int k = 0; k < 128; ++k) {
      const uint64_t pick = rng() % 10;
      if (pick < 6) {
        batch.push_back(keys[rng() % keys.size()]);
      } else if (pick < 9) {
        batch.push_back("absent/" + std::to_string(rng() % 100000));
      } else if (!batch.empty()) {
        batch.push_back(batch[rng() % batch.size()]);  // a repeat within the batch
      }
    }
    const std::vector<int32_t> exist = state.BatchExist(batch);
    const auto got = state.GetReplicaList({"r", batch});
    ASSERT_EQ(exist.size(), batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      const bool want = present.count(batch[i]) > 0;
      ASSERT_EQ(exist[i], want ? 1 : 0) << batch[i] << " in round " << round;
      ASSERT_EQ(got[i].status.ok(), want) << batch[i] << ": " << got[i].status.ToString();
      if (!want) {
        ASSERT_EQ(got[i].status.code(), ErrorCode::OBJECT_NOT_FOUND);
      }
    }
    for (const Status& s : state.FinishRead({"r", batch})) {
      ASSERT_TRUE(s.ok() || s.code() == ErrorCode::OBJECT_NOT_FOUND) << s.ToString();
    }
  }
}

TEST_F(MasterStateBatchTest, ManyKeysPerShardAnswerAtTheirPositions) {
  auto owned = Crowded(4);
  MasterState& state = *owned;
  constexpr int kKeys = 500;
  std::vector<std::string> keys;
  std::vector<uint64_t> sizes;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back("key/" + std::to_string(i));
    sizes.push_back(4096 + i);
  }
  keys.push_back("key/7");  // again, last
  sizes.push_back(1);
  auto started = state.PutStart({"w", keys, sizes, {}, false});
  ASSERT_EQ(started.size(), keys.size());
  for (int i = 0; i < kKeys; ++i) ASSERT_TRUE(started[i].status.ok()) << keys[i];
  EXPECT_EQ(started[kKeys].status.code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  keys.pop_back();
  sizes.pop_back();
  started.pop_back();
  std::vector<uint64_t> checksums(sizes.begin(), sizes.end());
  for (const auto& s : state.PutEnd({"w", keys, checksums, Gens(started)})) ASSERT_TRUE(s.ok());

  // Read back in reverse with a missing key in the middle.
  std::vector<std::string> reads(keys.rbegin(), keys.rend());
  reads.insert(reads.begin() + kKeys / 2, "key/missing");
  auto got = state.GetReplicaList({"r", reads});
  ASSERT_EQ(got.size(), reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    if (reads[i] == "key/missing") {
      EXPECT_EQ(got[i].status.code(), ErrorCode::OBJECT_NOT_FOUND);
      continue;
    }
    ASSERT_TRUE(got[i].status.ok()) << reads[i];
    const uint64_t want = 4096 + std::stoul(reads[i].substr(4));
    EXPECT_EQ(got[i].size, want) << reads[i];
    EXPECT_EQ(got[i].checksum, want) << reads[i];
  }
  std::vector<int32_t> on_strings = state.BatchExist(reads);
  std::vector<std::string_view> views(reads.begin(), reads.end());
  EXPECT_EQ(state.BatchExist(std::span<const std::string_view>(views)), on_strings);
  for (size_t i = 0; i < reads.size(); ++i) {
    EXPECT_EQ(on_strings[i], reads[i] == "key/missing" ? 0 : 1) << reads[i];
  }
}

TEST_F(MasterStateTest, OnlyTheWriterMayEndOrRevoke) {
  MountSeg("node", "seg", 64 * kMiB);
  ASSERT_TRUE(Start("w", "k", kMiB).status.ok());
  EXPECT_EQ(End("other", "k").code(), ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(state_.PutRevoke({"other", {"k"}, {Gen("k")}})[0].code(), ErrorCode::ILLEGAL_CLIENT);
  EXPECT_TRUE(End("w", "k").ok());
  EXPECT_EQ(End("w", "k").code(), ErrorCode::INVALID_WRITE) << "a second end has nothing to end";
}

TEST_F(MasterStateTest, RevokeFreesTheSpace) {
  MountSeg("node", "seg", 4 * kMiB);
  ASSERT_TRUE(Start("w", "a", 4 * kMiB).status.ok());
  EXPECT_EQ(state_.segments().used_bytes(), 4 * kMiB);
  ASSERT_TRUE(state_.PutRevoke({"w", {"a"}, {Gen("a")}})[0].ok());
  EXPECT_EQ(state_.segments().used_bytes(), 0u);
  EXPECT_EQ(Get("r", "a").status.code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_TRUE(Start("w", "b", 4 * kMiB).status.ok());
}

TEST_F(MasterStateTest, ReplicasGoToDistinctSegmentsBestEffort) {
  MountSeg("n1", "s1", 64 * kMiB);
  MountSeg("n2", "s2", 64 * kMiB);
  MountSeg("n3", "s3", 64 * kMiB);
  PlacementConfig two;
  two.replica_num = 2;
  for (int i = 0; i < 20; ++i) {
    auto r = Start("w", "k" + std::to_string(i), kMiB, two);
    ASSERT_TRUE(r.status.ok());
    ASSERT_EQ(r.replicas.size(), 2u);
    EXPECT_NE(r.replicas[0].segment_id, r.replicas[1].segment_id);
  }
  PlacementConfig five;
  five.replica_num = 5;
  EXPECT_EQ(Start("w", "many", kMiB, five).replicas.size(), 3u) << "at most one per segment";
}

TEST_F(MasterStateTest, ReplicaNumTwoWithOneSegmentStoresOne) {
  MountSeg("n1", "s1", 64 * kMiB);
  PlacementConfig two;
  two.replica_num = 2;
  auto r = Start("w", "k", kMiB, two);
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(r.replicas.size(), 1u);
}

TEST_F(MasterStateTest, PreferredSegmentsComeFirst) {
  MountSeg("n1", "s1", 64 * kMiB);
  uint64_t s2 = MountSeg("n2", "s2", 64 * kMiB);
  MountSeg("n3", "s3", 64 * kMiB);
  PlacementConfig config;
  config.preferred_segments = {"s2"};
  for (int i = 0; i < 10; ++i) {
    auto r = Start("w", "k" + std::to_string(i), kMiB, config);
    ASSERT_EQ(r.replicas.size(), 1u);
    EXPECT_EQ(r.replicas[0].segment_id, s2);
  }
  config.preferred_segments = {"unknown", "s2"};
  EXPECT_EQ(Start("w", "x", kMiB, config).replicas[0].segment_id, s2);
}

TEST_F(MasterStateTest, PlacementSpreadsOverSegments) {
  for (int i = 0; i < 4; ++i) MountSeg("n", "s" + std::to_string(i), 64 * kMiB);
  std::set<uint64_t> used;
  for (int i = 0; i < 16; ++i) used.insert(Start("w", "k" + std::to_string(i), kMiB).replicas[0].segment_id);
  EXPECT_EQ(used.size(), 4u);
}

TEST_F(MasterStateTest, NoSpaceIsPerKey) {
  MountSeg("n", "s", 4 * kMiB);
  auto results = state_.PutStart({"w", {"small", "huge", "small2"}, {kMiB, 8 * kMiB, kMiB}, {}, false});
  EXPECT_TRUE(results[0].status.ok());
  EXPECT_EQ(results[1].status.code(), ErrorCode::NO_AVAILABLE_HANDLE);
  EXPECT_TRUE(results[2].status.ok());
  EXPECT_EQ(Get("r", "huge").status.code(), ErrorCode::OBJECT_NOT_FOUND) << "no residue";
}

TEST_F(MasterStateTest, InvalidKeysAndSizes) {
  MountSeg("n", "s", 4 * kMiB);
  EXPECT_EQ(Start("w", "", kMiB).status.code(), ErrorCode::INVALID_KEY);
  EXPECT_EQ(Start("w", std::string(kMaxKeyBytes + 1, 'x'), kMiB).status.code(),
            ErrorCode::INVALID_KEY);
  EXPECT_TRUE(Start("w", std::string(kMaxKeyBytes, 'x'), 64).status.ok());
  EXPECT_EQ(Start("w", "zero", 0).status.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(Start("w", "big", uint64_t{1} << 63).status.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(Start("", "k", 64).status.code(), ErrorCode::INVALID_PARAMS);
  auto mismatched = state_.PutStart({"w", {"a", "b"}, {64}, {}, false});
  EXPECT_EQ(mismatched[0].status.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(state_.BatchExist({""})[0], static_cast<int32_t>(ErrorCode::INVALID_KEY));
  PlacementConfig too_many;
  too_many.replica_num = kMaxReplicas + 1;
  EXPECT_EQ(Start("w", "r", 64, too_many).status.code(), ErrorCode::INVALID_PARAMS);
}

TEST_F(MasterStateTest, ReadLockBlocksRemoveUntilFinishOrTtl) {
  MountSeg("n", "s", 64 * kMiB);
  Put("w", "k", kMiB);
  ASSERT_TRUE(Get("reader", "k").status.ok());
  EXPECT_EQ(state_.Remove({{"k"}, false})[0].code(), ErrorCode::OBJECT_HAS_LEASE);
  ASSERT_TRUE(state_.FinishRead({"reader", {"k"}})[0].ok());
  EXPECT_TRUE(state_.Remove({{"k"}, false})[0].ok());
  EXPECT_EQ(Exists("k"), 0);

  Put("w", "k2", kMiB);
  ASSERT_TRUE(Get("dead-reader", "k2").status.ok());
  clock_.Advance(Millis(9'999));
  EXPECT_EQ(state_.Remove({{"k2"}, false})[0].code(), ErrorCode::OBJECT_HAS_LEASE);
  clock_.Advance(Millis(2));
  EXPECT_TRUE(state_.Remove({{"k2"}, false})[0].ok()) << "the lock expired with its TTL";
}

TEST_F(MasterStateTest, ReadLocksAreCountedPerClient) {
  MountSeg("n", "s", 64 * kMiB);
  Put("w", "k", kMiB);
  ASSERT_TRUE(Get("r", "k").status.ok());
  ASSERT_TRUE(Get("r", "k").status.ok());
  ASSERT_TRUE(state_.FinishRead({"r", {"k"}})[0].ok());
  EXPECT_EQ(state_.Remove({{"k"}, false})[0].code(), ErrorCode::OBJECT_HAS_LEASE);
  ASSERT_TRUE(state_.FinishRead({"r", {"k"}})[0].ok());
  EXPECT_EQ(state_.FinishRead({"r", {"k"}})[0].code(), ErrorCode::LEASE_EXPIRED);
  EXPECT_TRUE(state_.Remove({{"k"}, false})[0].ok());
}

TEST_F(MasterStateTest, ForceRemoveOfLockedObjectDefersTheFree) {
  MountSeg("n", "s", 4 * kMiB);
  Put("w", "k", 4 * kMiB);
  ASSERT_TRUE(Get("r", "k").status.ok());
  ASSERT_TRUE(state_.Remove({{"k"}, true})[0].ok());
  EXPECT_EQ(Exists("k"), 0);
  // The reader may still be copying: the space is not handed out until its lock runs out.
  EXPECT_EQ(Start("w", "k2", 4 * kMiB).status.code(), ErrorCode::NO_AVAILABLE_HANDLE);
  clock_.Advance(Millis(10'001));
  state_.Sweep();
  EXPECT_TRUE(Start("w", "k2", 4 * kMiB).status.ok());
}

TEST_F(MasterStateTest, UpsertKeepsOldVersionReadableUntilEnd) {
  MountSeg("n", "s", 64 * kMiB);
  ASSERT_TRUE(Start("w", "k", kMiB).status.ok());
  ASSERT_TRUE(End("w", "k", 111).ok());
  auto up = Start("w", "k", 2 * kMiB, {}, /*upsert=*/true);
  ASSERT_TRUE(up.status.ok());
  EXPECT_EQ(Get("r", "k").checksum, 111u) << "old version still served during the upsert";
  ASSERT_TRUE(state_.FinishRead({"r", {"k"}})[0].ok());
  ASSERT_TRUE(End("w", "k", 222).ok());
  auto got = Get("r", "k");
  EXPECT_EQ(got.checksum, 222u);
  EXPECT_EQ(got.size, 2 * kMiB);
  EXPECT_EQ(state_.segments().used_bytes(), 2 * kMiB) << "the old extent was freed";
  EXPECT_EQ(state_.object_count(), 1u);
}

TEST_F(MasterStateTest, UpsertOfMissingKeyIsAPut) {
  MountSeg("n", "s", 64 * kMiB);
  ASSERT_TRUE(Start("w", "k", kMiB, {}, true).status.ok());
  ASSERT_TRUE(End("w", "k").ok());
  EXPECT_EQ(Exists("k"), 1);
}

TEST_F(MasterStateTest, ZombiePutCanBeRestartedAfterDiscardAndIsFreedAfterRelease) {
  MountSeg("n", "s", 8 * kMiB);
  ASSERT_TRUE(Start("dead", "k", 4 * kMiB).status.ok());
  clock_.Advance(Millis(29'000));
  EXPECT_EQ(Start("w", "k", 4 * kMiB).status.code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  clock_.Advance(Millis(1'001));
  auto again = Start("w", "k", 4 * kMiB);
  ASSERT_TRUE(again.status.ok()) << again.status.ToString();
  EXPECT_EQ(state_.segments().used_bytes(), 8 * kMiB) << "the zombie's extent is still held";
  EXPECT_EQ(End("dead", "k").code(), ErrorCode::ILLEGAL_CLIENT) << "the zombie lost the key";
  ASSERT_TRUE(End("w", "k").ok());
  clock_.Advance(Millis(600'000));
  state_.Sweep();
  EXPECT_EQ(state_.segments().used_bytes(), 4 * kMiB) << "released after the release timeout";
  EXPECT_EQ(Exists("k"), 1);
}

TEST_F(MasterStateTest, AbandonedPutIsDroppedAtReleaseTimeout) {
  MountSeg("n", "s", 8 * kMiB);
  ASSERT_TRUE(Start("dead", "k", 4 * kMiB).status.ok());
  clock_.Advance(Millis(599'999));
  EXPECT_EQ(state_.Sweep().discarded_puts, 0u);
  clock_.Advance(Millis(1));
  EXPECT_EQ(state_.Sweep().discarded_puts, 1u);
  EXPECT_EQ(state_.segments().used_bytes(), 0u);
  EXPECT_EQ(Get("r", "k").status.code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(state_.pending_count(), 0u);
}

TEST_F(MasterStateTest, UnmountDropsReplicasButKeepsOtherCopies) {
  MountSeg("n1", "s1", 64 * kMiB);
  MountSeg("n2", "s2", 64 * kMiB);
  PlacementConfig one;
  one.preferred_segments = {"s1"};
  Put("w", "only-on-s1", kMiB, one);
  PlacementConfig two;
  two.replica_num = 2;
  Put("w", "on-both", kMiB, two);
  UnmountResult r = state_.Unmount({"n1", "s1"});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.dropped_replicas, 2u);
  EXPECT_EQ(Get("r", "only-on-s1").status.code(), ErrorCode::OBJECT_NOT_FOUND);
  auto both = Get("r", "on-both");
  ASSERT_TRUE(both.status.ok());
  ASSERT_EQ(both.replicas.size(), 1u);
  EXPECT_EQ(state_.object_count(), 1u);
  Put("w", "only-on-s1", kMiB);  // can be put again
}

TEST_F(MasterStateTest, SegmentOwnership) {
  MountSeg("n1", "s1", 64 * kMiB);
  EXPECT_EQ(state_.Mount({"n2", {"s1", 64 * kMiB, ""}}).status.code(),
            ErrorCode::SEGMENT_ALREADY_EXISTS);
  EXPECT_TRUE(state_.Mount({"n1", {"s1", 64 * kMiB, ""}}).status.ok()) << "idempotent remount";
  EXPECT_EQ(state_.Unmount({"n2", "s1"}).status.code(), ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(state_.Unmount({"n1", "nope"}).status.code(), ErrorCode::SEGMENT_NOT_FOUND);
  EXPECT_EQ(state_.Mount({"n1", {"tiny", 0, ""}}).status.code(), ErrorCode::INVALID_PARAMS);
  uint64_t before = state_.segments().view_version();
  EXPECT_TRUE(state_.Unmount({"n1", "s1"}).status.ok());
  EXPECT_GT(state_.segments().view_version(), before);
}

TEST_F(MasterStateTest, SilentClientIsExpiredWithItsSegments) {
  MountSeg("node", "seg", 64 * kMiB);
  Put("w", "k", kMiB);
  EXPECT_FALSE(state_.Ping("node").need_remount);
  clock_.Advance(Millis(9'000));
  EXPECT_TRUE(state_.SilentClients(clock_.NowMs()).empty());
  clock_.Advance(Millis(1'000));
  auto silent = state_.SilentClients(clock_.NowMs());
  ASSERT_EQ(silent, std::vector<std::string>{"node"});
  auto expired = state_.ExpireClient("node");
  EXPECT_EQ(expired.unmounted, std::vector<std::string>{"seg"});
  EXPECT_EQ(Get("r", "k").status.code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(state_.segments().segment_count(), 0u);
  EXPECT_TRUE(state_.Ping("node").need_remount) << "an expired node is told to remount";
}

TEST_F(MasterStateTest, PingRacingExpiryWins) {
  MountSeg("node", "seg", 64 * kMiB);
  clock_.Advance(Millis(10'000));
  ASSERT_FALSE(state_.SilentClients(clock_.NowMs()).empty());
  state_.Ping("node");  // arrives between the decision and the expiry
  EXPECT_TRUE(state_.ExpireClient("node").unmounted.empty());
  EXPECT_EQ(state_.segments().segment_count(), 1u);
}

TEST_F(MasterStateTest, PrefixMatchCountsLeadingCompleteKeys) {
  MountSeg("n", "s", 64 * kMiB);
  for (const char* k : {"a", "b", "c", "e"}) Put("w", k, 64);
  ASSERT_TRUE(Start("w", "p", 64).status.ok());  // in flight counts as missing
  EXPECT_EQ(*state_.PrefixMatch({"a", "b", "c", "d", "e"}), 3u);
  EXPECT_EQ(*state_.PrefixMatch({"a", "p", "b"}), 1u);
  EXPECT_EQ(*state_.PrefixMatch({"x"}), 0u);
  EXPECT_EQ(*state_.PrefixMatch({}), 0u);
  EXPECT_EQ(state_.BatchExist({"a", "d", "p"}), (std::vector<int32_t>{1, 0, 0}));
}

TEST_F(MasterStateTest, ExistTakesNoLock) {
  MountSeg("n", "s", 64 * kMiB);
  Put("w", "k", 64);
  EXPECT_EQ(Exists("k"), 1);
  EXPECT_TRUE(state_.Remove({{"k"}, false})[0].ok()) << "exist must not block removal";
}

TEST_F(MasterStateTest, RegexRemovalAndQuery) {
  MountSeg("n", "s", 64 * kMiB);
  for (int i = 0; i < 10; ++i) Put("w", "model-a/" + std::to_string(i), 64);
  for (int i = 0; i < 5; ++i) Put("w", "model-b/" + std::to_string(i), 64);
  ASSERT_TRUE(Get("r", "model-a/3").status.ok());  // locked: skipped without force

  auto q = state_.QueryByRegex("^model-b/", 100);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->objects.size(), 5u);
  auto limited = state_.QueryByRegex("model", 4);
  EXPECT_EQ(limited->objects.size(), 4u);
  EXPECT_TRUE(limited->truncated);

  auto removed = state_.RemoveByRegex({"^model-a/", false});
  ASSERT_TRUE(removed.status.ok());
  EXPECT_EQ(removed.removed, 9u);
  EXPECT_EQ(removed.skipped, 1u);
  EXPECT_EQ(Exists("model-a/3"), 1);
  EXPECT_EQ(state_.RemoveByRegex({"^model-a/", true}).removed, 1u);

  EXPECT_EQ(state_.RemoveByRegex({"(unclosed", false}).status.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(state_.QueryByRegex(std::string(kMaxPatternBytes + 1, 'a'), 10).code(),
            ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(state_.RemoveAll({false}).removed, 5u);
  EXPECT_EQ(state_.object_count(), 0u);
  EXPECT_EQ(state_.segments().used_bytes(), 64u) << "the force-removed locked one waits";
  clock_.Advance(Millis(10'001));
  state_.Sweep();
  EXPECT_EQ(state_.segments().used_bytes(), 0u);
}

TEST_F(MasterStateTest, ObserverSeesEveryOperationInOrder) {
  std::vector<size_t> seen;
  state_.AddObserver([&](const Operation& op, const OpResult&) { seen.push_back(op.body.index()); });
  MountSeg("n", "s", 64 * kMiB);
  Put("w", "k", 64);
  EXPECT_EQ(Exists("k"), 1);  // a query: not an operation
  state_.Remove({{"k"}, false});
  Operation mount;
  mount.body = MountSegmentOp{};
  Operation start;
  start.body = PutStartOp{};
  Operation end;
  end.body = PutEndOp{};
  Operation remove;
  remove.body = RemoveOp{};
  EXPECT_EQ(seen, (std::vector<size_t>{mount.body.index(), start.body.index(), end.body.index(),
                                       remove.body.index()}));
}

TEST_F(MasterStateTest, ReplayingTheOperationStreamReproducesTheState) {
  std::vector<Operation> log;
  state_.AddObserver([&](const Operation& op, const OpResult&) { log.push_back(op); });
  MountSeg("n1", "s1", 64 * kMiB);
  MountSeg("n2", "s2", 64 * kMiB);
  PlacementConfig two;
  two.replica_num = 2;
  for (int i = 0; i < 50; ++i) Put("w", "k" + std::to_string(i), (i + 1) * 4096, two);
  for (int i = 0; i < 50; i += 3) state_.Remove({{"k" + std::to_string(i)}, false});
  clock_.Advance(Millis(5));
  Get("r", "k1");

  MasterState standby(Policy(), &clock_, state_.segment_id_base());
  for (const auto& op : log) standby.Apply(op);
  EXPECT_EQ(standby.object_count(), state_.object_count());
  EXPECT_EQ(standby.segments().used_bytes(), state_.segments().used_bytes());
  for (int i = 0; i < 50; ++i) {
    std::string key = "k" + std::to_string(i);
    auto a = state_.Stat(key);
    auto b = standby.Stat(key);
    ASSERT_EQ(a.ok(), b.ok()) << key;
    if (!a.ok()) continue;
    ASSERT_EQ(a->replicas.size(), b->replicas.size());
    for (size_t r = 0; r < a->replicas.size(); ++r) {
      EXPECT_EQ(a->replicas[r].segment_id, b->replicas[r].segment_id);
      EXPECT_EQ(a->replicas[r].offset, b->replicas[r].offset);
    }
  }
}

}  // namespace
}  // namespace granary::master

namespace granary::master {
namespace {

TEST(MasterStateTakeover, RestartedNodeOnSameHostTakesOverItsSegmentName) {
  ManualClock clock;
  MasterState state(MasterPolicy{}, &clock);
  SegmentSpec old_node{"seg", 64 << 20, "127.0.0.1:1", "granary-seg", "host-a/boot", 111, true};
  ASSERT_TRUE(state.Mount({"old-process", old_node}).status.ok());
  auto started = state.PutStart({"w", {"k"}, {4096}, {}, false});
  ASSERT_TRUE(started[0].status.ok());
  ASSERT_TRUE(state.PutEnd({"w", {"k"}, {1}, Gens(started)})[0].ok());

  SegmentSpec other_host = old_node;
  other_host.host_id = "host-b/boot";
  other_host.token = 222;
  EXPECT_EQ(state.Mount({"intruder", other_host}).status.code(),
            ErrorCode::SEGMENT_ALREADY_EXISTS) << "another host may not take the name";
  EXPECT_EQ(state.BatchExist({"k"})[0], 1);

  SegmentSpec restarted = old_node;
  restarted.token = 333;  // a new process: new shared memory, new token
  MountResult r = state.Mount({"new-process", restarted});
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(state.BatchExist({"k"})[0], 0) << "the old process's bytes died with it";
  EXPECT_EQ(state.segments().segment_count(), 1u);
  EXPECT_EQ(state.segments().FindByName("seg")->client_id, "new-process");
}

// A mount's capability key is kept as the node sent it (32 bytes) or absent (an older node); any
// other length is refused, so a node cannot be handed capabilities under a guessable key.
TEST(MasterStateMount, CapabilityKeysAreKeptWhole) {
  ManualClock clock;
  MasterState state(MasterPolicy{}, &clock);
  SegmentSpec spec{"seg", 64 << 20, "127.0.0.1:1", "granary-seg", "host-a/boot", 111, true};
  for (size_t bad : {1, 16, 31, 33, 64}) {
    spec.capability_key.assign(bad, 'k');
    EXPECT_EQ(state.Mount({"node", spec}).status.code(), ErrorCode::INVALID_PARAMS) << bad;
  }
  EXPECT_EQ(state.segments().segment_count(), 0u);
  // A node that requires capabilities but sent no key could never be read or written.
  spec.capability_key.clear();
  spec.capabilities_required = true;
  EXPECT_EQ(state.Mount({"node", spec}).status.code(), ErrorCode::INVALID_PARAMS);
  spec.capability_key.assign(32, 'k');
  ASSERT_TRUE(state.Mount({"node", spec}).status.ok());
  EXPECT_EQ(state.segments().FindByName("seg")->capability_key, spec.capability_key);
  EXPECT_TRUE(state.segments().FindByName("seg")->capabilities_required);
  SegmentSpec older{"old", 64 << 20, "127.0.0.1:2", "granary-old", "host-a/boot", 113, true};
  ASSERT_TRUE(state.Mount({"old-node", older}).status.ok());
  EXPECT_TRUE(state.segments().FindByName("old")->capability_key.empty());
  // A snapshot carries the keys.
  MasterState copy(MasterPolicy{}, &clock);
  ASSERT_TRUE(copy.LoadSnapshot(state.EncodeSnapshot()).ok());
  EXPECT_EQ(copy.segments().FindByName("seg")->capability_key, spec.capability_key);
  EXPECT_TRUE(copy.segments().FindByName("seg")->capabilities_required);
  EXPECT_FALSE(copy.segments().FindByName("old")->capabilities_required);
}

}  // namespace
}  // namespace granary::master

namespace granary::master {
namespace {

// PutStart makes its keys' map nodes before the apply lock; Apply of the same op (a standby's
// replay) makes them under it. Both must give the same results and the same state, whatever
// the keys: new, repeated in one batch, committed, pending, too large to place, upserted.
TEST(MasterStatePreparedNodesTest, PutStartWithPreparedNodesEqualsApplyOfTheSameOp) {
  ManualClock clock;
  MasterPolicy policy;
  policy.put_discard_timeout_ms = 30'000;
  MasterState prepared(policy, &clock, 1), plain(policy, &clock, 1);
  for (MasterState* s : {&prepared, &plain}) {
    ASSERT_TRUE(s->Mount({"node", {"seg", 1 << 20, "127.0.0.1:1", "", "", 0, true}}).status.ok());
  }
  auto both = [&](const PutStartOp& op) {
    auto a = prepared.PutStart(op);
    auto b = std::get<std::vector<PutStartKeyResult>>(
        plain.Apply(Operation{clock.NowMs(), 0, op}));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      SCOPED_TRACE(op.keys[i]);
      EXPECT_EQ(a[i].status.code(), b[i].status.code()) << a[i].status.ToString();
      EXPECT_EQ(a[i].put_gen, b[i].put_gen);
      ASSERT_EQ(a[i].replicas.size(), b[i].replicas.size());
      for (size_t r = 0; r < a[i].replicas.size(); ++r) {
        EXPECT_EQ(a[i].replicas[r].offset, b[i].replicas[r].offset);
      }
    }
    EXPECT_EQ(prepared.Digest(), plain.Digest());
  };
  const uint64_t k64 = 64 << 10;
  both({"w", {"k1", "k2", "k1", "k3"}, {k64, k64, k64, k64}, {}, false});
  for (MasterState* s : {&prepared, &plain}) {
    auto st1 = s->Stat("k1"), st3 = s->Stat("k3");
    ASSERT_TRUE(st1.ok() && st3.ok());
    auto ended = s->PutEnd({"w", {"k1", "k3"}, {1, 3}, {st1->put_gen, st3->put_gen}});
    ASSERT_TRUE(ended[0].ok() && ended[1].ok());
  }
  EXPECT_EQ(prepared.Digest(), plain.Digest());
  // committed (refused), pending by another writer (refused), too large, new
  both({"v", {"k1", "k2", "big", "k5"}, {k64, k64, 2 << 20, k64}, {}, false});
  // its own pending write taken over, upserts of a committed and a new key
  both({"w", {"k2", "k1", "k6"}, {k64, k64, k64}, {}, true});
  clock.Advance(Millis(policy.put_discard_timeout_ms + 1));
  both({"v", {"k2", "k7", "k7"}, {k64, k64, k64}, {}, false});  // a discarded put restarted
}

}  // namespace
}  // namespace granary::master
