// Cache leases (docs/control-path.md, "Gets without the master's round trip"): what the master
// promises a client that reads a key again from its location cache, and the client's cache.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "client/location_cache.h"
#include "master/state/cache_lease_ledger.h"
#include "master/state/master_state.h"
#include "master/state/state_codec.h"

namespace granary::master {
namespace {

constexpr uint64_t kMiB = 1 << 20;

class CacheLeaseTest : public ::testing::Test {
 protected:
  CacheLeaseTest() : state_(Policy(), &clock_) {}

  static MasterPolicy Policy() {
    MasterPolicy p;
    p.lease_ttl_ms = 10'000;
    p.cache_lease_ms = 2'000;
    return p;
  }
  void Mount(const std::string& name) {
    ASSERT_TRUE(state_.Mount({"node-" + name, {name, 64 * kMiB, "127.0.0.1:1", "", "", 0, true}})
                    .status.ok());
  }
  void Put(const std::string& client, const std::string& key, bool upsert = false) {
    auto started = state_.PutStart({client, {key}, {kMiB}, {}, upsert})[0];
    ASSERT_TRUE(started.status.ok()) << started.status.ToString();
    auto stat = state_.Stat(key);
    ASSERT_TRUE(stat.ok());
    ASSERT_TRUE(state_.PutEnd({client, {key}, {7}, {stat->put_gen}})[0].ok());
  }
  // A get that asks a cache lease, and the reader's release of its counted lock (as the client
  // does once its copy is over): what is left is the cache lease alone.
  void CachedGet(const std::string& client, const std::string& key, int64_t cache_ms = 2'000) {
    ASSERT_TRUE(state_.GetReplicaList({client, {key}, cache_ms})[0].status.ok());
    ASSERT_TRUE(state_.FinishRead({client, {key}})[0].ok());
  }
  int64_t Settle(const std::string& caller, const std::string& key) {
    return state_.SettleMs(caller, {key});
  }

  ManualClock clock_;
  MasterState state_;
};

TEST_F(CacheLeaseTest, ALeaseDoesNotRefuseARemoveButItsWriterWaitsItOut) {
  Mount("seg");
  Put("w", "k");
  CachedGet("reader", "k");
  const size_t deferred = state_.deferred_free_count();
  ASSERT_TRUE(state_.Remove({{"k"}, false})[0].ok()) << "a cache lease is not a read under way";
  EXPECT_EQ(state_.deferred_free_count(), deferred + 1) << "the space waits for the lease";
  EXPECT_EQ(Settle("w", "k"), 2'000) << "another client may read the old bytes until then";
  EXPECT_EQ(Settle("reader", "k"), 0) << "a client's own lease never makes it wait";
  clock_.Advance(std::chrono::milliseconds(2'000));
  EXPECT_EQ(Settle("w", "k"), 0);
  EXPECT_EQ(state_.Sweep().freed_extents, 1u) << "freed once the lease is over";
}

TEST_F(CacheLeaseTest, ACountedReadStillRefusesARemove) {
  Mount("seg");
  Put("w", "k");
  ASSERT_TRUE(state_.GetReplicaList({"reader", {"k"}, 2'000})[0].status.ok());
  EXPECT_EQ(state_.Remove({{"k"}, false})[0].code(), ErrorCode::OBJECT_HAS_LEASE);
  ASSERT_TRUE(state_.FinishRead({"reader", {"k"}})[0].ok());
  EXPECT_TRUE(state_.Remove({{"k"}, false})[0].ok());
}

TEST_F(CacheLeaseTest, AnUpsertAnswersHowLongOtherClientsMayReadTheOldVersion) {
  Mount("seg");
  Put("w", "k");
  CachedGet("reader", "k");
  clock_.Advance(std::chrono::milliseconds(500));
  Put("w", "k", /*upsert=*/true);
  EXPECT_EQ(Settle("w", "k"), 1'500);
  EXPECT_EQ(Settle("reader", "k"), 0);
  EXPECT_EQ(Settle("w", "other-key"), 0) << "keys nobody cached wait for nothing";
}

TEST_F(CacheLeaseTest, EvictionNeverTakesALeasedObject) {
  Mount("seg");
  Put("w", "k");
  CachedGet("reader", "k");
  EXPECT_EQ(state_.Evict({{"k"}, false, {}, /*whole_run=*/true}).objects, 0u) << "its replicas may be read from a cache";
  clock_.Advance(std::chrono::milliseconds(2'001));
  EXPECT_EQ(state_.Evict({{"k"}, false, {}, /*whole_run=*/true}).objects, 1u);
}

TEST_F(CacheLeaseTest, TheStateGrantsWhatTheOpCarriesAndAGetThatAsksNoneLeavesNone) {
  // The service caps the client's ask by --cache-lease before the op is made: a replica
  // replays the grant itself, whatever its own flag.
  Mount("seg");
  Put("w", "k");
  CachedGet("reader", "k", /*cache_ms=*/5'000);
  EXPECT_EQ(state_.LatestCacheLease(), clock_.NowMs() + 5'000);
  Put("w2", "k2");
  ASSERT_TRUE(state_.GetReplicaList({"reader", {"k2"}})[0].status.ok());  // asks none
  ASSERT_TRUE(state_.FinishRead({"reader", {"k2"}})[0].ok());
  EXPECT_TRUE(state_.Remove({{"k2"}, false})[0].ok());
  EXPECT_EQ(Settle("w", "k2"), 0) << "a get that asks no lease leaves none";
}

TEST_F(CacheLeaseTest, AReplicaLoadedMidLeaseSweepsToTheSameState) {
  // A lease ends, another client's counted lock is taken and never released: the sweep drops
  // the ended lease alone, so the leader (which listed the key) and a replica loaded from a
  // snapshot (which did not) agree.
  Mount("seg");
  Put("w", "k");
  CachedGet("a", "k");
  clock_.Advance(std::chrono::milliseconds(2'500));
  ASSERT_TRUE(state_.GetReplicaList({"b", {"k"}})[0].status.ok());  // counted, kept
  MasterState replica(Policy(), &clock_);
  ASSERT_TRUE(replica.LoadSnapshot(state_.EncodeSnapshot()).ok());
  clock_.Advance(std::chrono::milliseconds(20'000));  // b's lock expired too
  state_.Sweep();
  replica.Sweep();
  EXPECT_EQ(replica.Digest(), state_.Digest());
}

TEST_F(CacheLeaseTest, AnObjectLostWithItsSegmentStillMakesItsNextWriterWait) {
  Mount("a");
  Put("w", "k");
  CachedGet("reader", "k");
  // The node is gone as far as the master knows; it may still answer the reader's cached read.
  ASSERT_TRUE(state_.Unmount({"node-a", "a"}).status.ok());
  EXPECT_EQ(state_.BatchExist({"k"})[0], 0);
  Mount("b");
  Put("w", "k");
  EXPECT_EQ(Settle("w", "k"), 2'000) << "the key's new version must not race a cached read";
  EXPECT_EQ(Settle("reader", "k"), 0);
}

TEST_F(CacheLeaseTest, ALoadedStateKeepsTheLeasesAndWaitsForTheOnesItCannotSee) {
  Mount("seg");
  Put("w", "k");
  Put("w", "gone");
  CachedGet("reader", "k");
  CachedGet("reader", "gone");
  ASSERT_TRUE(state_.Remove({{"gone"}, false})[0].ok());
  MasterState loaded(Policy(), &clock_);
  ASSERT_TRUE(loaded.LoadSnapshot(state_.EncodeSnapshot()).ok());
  EXPECT_EQ(loaded.Digest(), state_.Digest());
  EXPECT_EQ(loaded.Evict({{"k"}, false, {}, /*whole_run=*/true}).objects, 0u) << "the lease on k came with the snapshot";
  EXPECT_EQ(loaded.SettleMs("reader", {"gone"}), 2'000)
      << "a lease on an object erased before the snapshot is not in it: assumed live";
  clock_.Advance(std::chrono::milliseconds(2'000));
  EXPECT_EQ(loaded.SettleMs("w", {"gone"}), 0);
}

TEST_F(CacheLeaseTest, TheSweepDropsEndedLeasesAsAReplayWould) {
  Mount("seg");
  Put("w", "k");
  CachedGet("reader", "k");
  MasterState replica(Policy(), &clock_);
  ASSERT_TRUE(replica.LoadSnapshot(state_.EncodeSnapshot()).ok());
  const size_t leased_bytes = state_.EncodeSnapshot().size();
  clock_.Advance(std::chrono::milliseconds(3'000));
  state_.Sweep();
  replica.Sweep();
  EXPECT_LT(state_.EncodeSnapshot().size(), leased_bytes) << "the ended lease's entry is gone";
  EXPECT_EQ(replica.Digest(), state_.Digest()) << "a loaded state drops the same entries";
  EXPECT_TRUE(state_.Remove({{"k"}, false})[0].ok());
  EXPECT_EQ(Settle("w", "k"), 0) << "an ended lease is forgotten";
}

TEST(CacheLeaseOpTest, TheRecordCarriesTheAskOnlyWhenSet) {
  Operation plain{5, 9, GetReplicaListOp{"c", {"a", "b"}}};
  Operation asking{5, 9, GetReplicaListOp{"c", {"a", "b"}, 1'500}};
  const std::string plain_bytes = EncodeOperation(plain);
  const std::string asking_bytes = EncodeOperation(asking);
  EXPECT_GT(asking_bytes.size(), plain_bytes.size());
  auto back = DecodeOperation(plain_bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::get<GetReplicaListOp>(back->body).cache_ms, 0);
  back = DecodeOperation(asking_bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::get<GetReplicaListOp>(back->body).cache_ms, 1'500);
  EXPECT_EQ(std::get<GetReplicaListOp>(back->body).keys.size(), 2u);
}

TEST(CacheLeaseLedgerTest, OneHolderNeverWaitsForItselfTwoHoldersBothWait) {
  CacheLeaseLedger ledger;
  ledger.Note("k", "a", 1'100, 1'000);
  EXPECT_EQ(ledger.SettleUntil("k", "a"), 0);
  EXPECT_EQ(ledger.SettleUntil("k", "b"), 1'100);
  ledger.Note("k", "b", 1'050, 1'000);
  EXPECT_EQ(ledger.SettleUntil("k", "a"), 1'100) << "b's lease: a waits now";
  EXPECT_EQ(ledger.SettleUntil("k", "b"), 1'100) << "and b waits for a's";
  ledger.Note("k", "b", 1'300, 1'200);  // the old ones are over: b holds the bucket alone
  EXPECT_EQ(ledger.SettleUntil("k", "b"), 0);
  EXPECT_EQ(ledger.SettleUntil("k", "a"), 1'300);
  ledger.Note("k", "c", 900, 1'250);  // over already: nothing can read under it
  EXPECT_EQ(ledger.SettleUntil("k", "b"), 0);
  ledger.AssumeAllUntil(5'000);
  EXPECT_EQ(ledger.SettleUntil("k", "b"), 5'000) << "after a load, nobody is the only holder";
  EXPECT_EQ(ledger.SettleUntil("never-noted", "b"), 5'000);
  CacheLeaseLedger fresh;
  fresh.Note("x", "a", 2'000, 1'000);
  fresh.Note("y", "b", 3'000, 1'000);
  EXPECT_EQ(fresh.SettleUntil(std::vector<std::string>{"x", "y", "z"}, "a"), 3'000);
  EXPECT_EQ(fresh.SettleUntil(std::vector<std::string>{"x", "z"}, "a"), 0) << "a's own only";
}

}  // namespace
}  // namespace granary::master

namespace granary::client {
namespace {

using Clock = LocationCache::Clock;

proto::GetReplicaResult Answer(uint64_t size) {
  proto::GetReplicaResult r;
  r.set_size(size);
  r.add_replicas()->set_segment_name("seg");
  return r;
}

TEST(LocationCacheTest, AnAnswerGivenBeforeThisClientsWriteIsNotKept) {
  LocationCache cache(16);
  const auto later = Clock::now() + std::chrono::seconds(10);
  const uint64_t stamp = cache.Stamp("k");
  cache.Invalidate("k");  // a put of k began after the get sent its request
  cache.Insert("k", stamp, Answer(1), later);
  EXPECT_EQ(cache.Lookup("k", Clock::now()), nullptr);
  cache.Insert("k", cache.Stamp("k"), Answer(2), later);
  auto hit = cache.Lookup("k", Clock::now());
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->where.size(), 2u);
  cache.InvalidateAll(std::vector<std::string>{"k"});
  EXPECT_EQ(cache.Lookup("k", Clock::now()), nullptr);
}

TEST(LocationCacheTest, AnEntryPastItsDeadlineIsNeverReturned) {
  LocationCache cache(16);
  const auto now = Clock::now();
  cache.Insert("k", cache.Stamp("k"), Answer(1), now + std::chrono::milliseconds(5));
  EXPECT_NE(cache.Lookup("k", now), nullptr);
  EXPECT_EQ(cache.Lookup("k", now + std::chrono::milliseconds(5)), nullptr);
  EXPECT_EQ(cache.size(), 0u) << "dropped when found expired";
}

TEST(LocationCacheTest, TheOldestGoPastCapacityAndDiskOnlyAnswersAreNotKept) {
  LocationCache cache(3);
  const auto later = Clock::now() + std::chrono::seconds(10);
  for (int i = 0; i < 5; ++i) {
    const std::string key = "k" + std::to_string(i);
    cache.Insert(key, cache.Stamp(key), Answer(1), later);
  }
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.Lookup("k0", Clock::now()), nullptr);
  EXPECT_NE(cache.Lookup("k4", Clock::now()), nullptr);
  proto::GetReplicaResult disk_only;
  disk_only.set_size(1);
  cache.Insert("d", cache.Stamp("d"), disk_only, later);
  EXPECT_EQ(cache.Lookup("d", Clock::now()), nullptr) << "nothing in memory to read directly";
  LocationCache off(0);
  off.Insert("k", off.Stamp("k"), Answer(1), later);
  EXPECT_EQ(off.Lookup("k", Clock::now()), nullptr);
}

}  // namespace
}  // namespace granary::client
