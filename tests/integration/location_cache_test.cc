// Gets that skip the master (client/location_cache.h, docs/control-path.md) with real processes:
// a repeat get reads the node without a master call, and no completed write of another client
// is ever hidden by a cached location: its put or remove returns only once the reader's cache
// lease is over, and the reader's next get sees it. Over TCP and over shared memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <functional>
#include <thread>

#include "../tools/test_pattern.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

using Bytes = std::vector<std::byte>;
using SteadyClock = std::chrono::steady_clock;

class LocationCacheTest : public StoreTest, public ::testing::WithParamInterface<bool> {
 protected:
  // A cache lease of 1 s (the clients ask 2 s; the master caps it).
  ::testing::AssertionResult StartStore(size_t nodes = 1) {
    return cluster_.Start(nodes, 64 * MiB, {{"--cache-lease", "1s"}});
  }
  std::unique_ptr<Client> Reader() { return cluster_.MakeClient(GetParam()); }
  // A reader and a writer client, the writer's `value` put under `key` and read (so cached) by
  // the reader; the time the reader's lease started.
  SteadyClock::time_point ReaderCached(std::unique_ptr<Client>& reader,
                                       std::unique_ptr<Client>& writer, const std::string& key,
                                       const Bytes& value) {
    reader = Reader();
    writer = cluster_.MakeClient(GetParam());
    EXPECT_NE(reader, nullptr);
    EXPECT_NE(writer, nullptr);
    if (!reader || !writer) return SteadyClock::now();
    EXPECT_TRUE(writer->Put(key, ByteSpan(value)).ok());
    const auto leased = SteadyClock::now();
    auto first = reader->Get(key);
    EXPECT_TRUE(first.ok() && *first == value) << key;
    return leased;
  }
  static Millis Since(SteadyClock::time_point start) {
    return std::chrono::duration_cast<Millis>(SteadyClock::now() - start);
  }
};

TEST_P(LocationCacheTest, ARepeatGetIsServedWithoutTheMasterAndReadsTheSameBytes) {
  ASSERT_TRUE(StartStore());
  auto client = Reader();
  ASSERT_NE(client, nullptr);
  const Bytes value = testdata::Pattern("cached/a", 64 * KiB);
  ASSERT_TRUE(client->Put("cached/a", ByteSpan(value)).ok());
  for (int i = 0; i < 3; ++i) {
    auto got = client->Get("cached/a");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, value);
  }
  EXPECT_EQ(client->Stats().cached_gets, 2u) << "the first get asks the master, the next two not";
  // Past the lease the master is asked again (and a fresh lease taken).
  std::this_thread::sleep_for(Millis(1'100));
  auto got = client->Get("cached/a");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, value);
  EXPECT_EQ(client->Stats().cached_gets, 2u) << "an expired entry is never used";

  ClientOptions off;
  off.location_cache_ms = 0;
  auto plain = cluster_.MakeClient(GetParam(), off);
  ASSERT_NE(plain, nullptr);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(plain->Get("cached/a").ok());
  EXPECT_EQ(plain->Stats().cached_gets, 0u);
}

TEST_P(LocationCacheTest, AnotherClientsUpsertReturnsAfterTheLeaseAndIsSeenByTheNextGet) {
  ASSERT_TRUE(StartStore());
  std::unique_ptr<Client> reader, writer;
  const Bytes v1 = testdata::Pattern("cached/up-1", 64 * KiB);
  const Bytes v2 = testdata::Pattern("cached/up-2", 64 * KiB);
  const auto leased = ReaderCached(reader, writer, "cached/up", v1);
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(writer->Upsert("cached/up", ByteSpan(v2)).ok());
  const Millis waited = Since(leased);
  EXPECT_GE(waited.count(), 800) << "the writer returned while the reader could read v1 yet";
  EXPECT_LT(waited.count(), 5'000);
  auto after = reader->Get("cached/up");
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(*after, v2) << "a get after the upsert returned read the old version";
}

TEST_P(LocationCacheTest, AnotherClientsRemoveIsSeenByTheNextGet) {
  ASSERT_TRUE(StartStore());
  std::unique_ptr<Client> reader, writer;
  const auto leased =
      ReaderCached(reader, writer, "cached/rm", testdata::Pattern("cached/rm", 64 * KiB));
  ASSERT_FALSE(HasFailure());
  // The reader's counted lock goes in the background (read_releaser.h); its cache lease stays.
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto st = writer->Stat("cached/rm");
        return st.ok() && st->read_locks == 0;
      },
      Millis(2'000), Millis(2)));
  Status removed = writer->Remove("cached/rm");
  ASSERT_TRUE(removed.ok()) << "a cache lease does not refuse a remove: " << removed.ToString();
  EXPECT_GE(Since(leased).count(), 800);
  auto after = reader->Get("cached/rm");
  EXPECT_EQ(after.status().code(), ErrorCode::OBJECT_NOT_FOUND)
      << "a get after the remove returned still found the object";
}

TEST_P(LocationCacheTest, AClientsOwnWritesDoNotWaitForItsOwnLease) {
  ASSERT_TRUE(StartStore());
  auto client = Reader();
  ASSERT_NE(client, nullptr);
  const Bytes v1 = testdata::Pattern("cached/own-1", 64 * KiB);
  const Bytes v2 = testdata::Pattern("cached/own-2", 32 * KiB);
  ASSERT_TRUE(client->Put("cached/own", ByteSpan(v1)).ok());
  ASSERT_TRUE(client->Get("cached/own").ok());
  const auto start = SteadyClock::now();
  ASSERT_TRUE(client->Upsert("cached/own", ByteSpan(v2)).ok());
  EXPECT_LT(Since(start).count(), 500) << "waited for its own lease";
  auto got = client->Get("cached/own");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, v2) << "its own cached location of v1 outlived its upsert";
  ASSERT_TRUE(client->Remove("cached/own").ok());
  EXPECT_EQ(client->Get("cached/own").status().code(), ErrorCode::OBJECT_NOT_FOUND);
}

TEST_P(LocationCacheTest, AKeyLostWithItsNodeIsPutAgainOnlyAfterTheLeasesOnItsOldCopy) {
  // A lease longer than the node TTL (2 s): the master drops the node's objects while the
  // reader may still read their locations, so the next writer of each key must wait.
  ASSERT_TRUE(cluster_.Start(2, 64 * MiB, {{"--cache-lease", "6s"}}));
  ClientOptions long_lease;
  long_lease.location_cache_ms = 6'000;
  auto reader = cluster_.MakeClient(GetParam(), long_lease);
  auto writer = cluster_.MakeClient(GetParam());
  ASSERT_NE(reader, nullptr);
  ASSERT_NE(writer, nullptr);
  // Keys on node 0's segment, cached by the reader.
  const std::string seg0 = cluster_.node(0).name();
  std::vector<std::string> keys;
  ReplicateConfig on0;
  on0.preferred_segments = {seg0};
  for (int i = 0; i < 8; ++i) {
    const std::string key = "cached/kill/" + std::to_string(i);
    const Bytes v = testdata::Pattern(key + "-old", 16 * KiB);
    ASSERT_TRUE(writer->Put(key, ByteSpan(v), on0).ok());
    ASSERT_TRUE(reader->Get(key).ok());
    keys.push_back(key);
  }
  cluster_.KillNode(0);
  for (const auto& key : keys) {  // the cached read fails: the master is asked, as it knows
    auto got = reader->Get(key);
    EXPECT_TRUE(!got.ok() || *got == testdata::Pattern(key + "-old", 16 * KiB)) << key;
  }
  ASSERT_TRUE(cluster_.WaitForSegments(
      [&](const std::vector<std::string>& names) {
        return std::find(names.begin(), names.end(), seg0) == names.end();
      },
      Millis(10'000)))
      << "the master never dropped the killed node's segment";
  // New versions land on node 1; every get from here on must read them or nothing.
  const auto putting = SteadyClock::now();
  for (const auto& key : keys) {
    const Bytes v = testdata::Pattern(key + "-new", 16 * KiB);
    ASSERT_TRUE(writer->Put(key, ByteSpan(v)).ok());
  }
  EXPECT_GE(Since(putting).count(), 500) << "the new versions did not wait for the old leases";
  ASSERT_TRUE(cluster_.RestartNode(0));
  for (const auto& key : keys) {
    auto got = reader->Get(key);
    ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
    EXPECT_EQ(*got, testdata::Pattern(key + "-new", 16 * KiB)) << key;
  }
}

TEST_P(LocationCacheTest, ANodeStoppedGracefullyIsNotReadFromTheCacheAfterItsUnmount) {
  ASSERT_TRUE(StartStore());
  auto reader = Reader();
  ASSERT_NE(reader, nullptr);
  const Bytes value = testdata::Pattern("cached/stopped", 64 * KiB);
  ASSERT_TRUE(reader->Put("cached/stopped", ByteSpan(value)).ok());
  ASSERT_TRUE(reader->Get("cached/stopped").ok());
  ASSERT_TRUE(cluster_.node(0).Kill(SIGTERM));
  ASSERT_TRUE(cluster_.node(0).Wait(Millis(10'000)).has_value());
  // Unmounted: the object is gone, and the memory a same-host reader still maps is retired.
  auto got = reader->Get("cached/stopped");
  EXPECT_FALSE(got.ok()) << "read an unmounted node's object from the location cache";
  EXPECT_EQ(reader->Stats().cached_gets, 0u);
}

// A master that starts empty knows none of the cache leases its predecessor granted. A node that
// has not yet noticed the restart (here: paused, so it keeps its old mount) could serve a
// same-host reader's cached location of a key that a writer meanwhile put again elsewhere or
// removed: so writes to the new master wait out --cache-lease from its start (--restart-settle).
class MasterRestartCacheTest : public StoreTest {
 protected:
  // Long enough that the reader's lease outlives the restart and remount even under
  // ThreadSanitizer (a 6 s lease ran out there once before the write: the run tested nothing).
  static constexpr int64_t kLeaseMs = 10'000;
  ::testing::AssertionResult StartStore() {
    return cluster_.Start(2, 64 * MiB, {{"--cache-lease", "10s"}, {"--restart-settle", "true"}});
  }
  // The reader caches the key's copy on node 0, node 0 pauses with its old mount, the master
  // restarts empty and node 1 mounts again; the reader's get is still served from its cache.
  // Then `write` (retried until the writer finds the restarted master) changes the key, and the
  // reader gets it at once (*read_after). Returns how long the write that succeeded took.
  Millis WriteAfterRestart(const std::string& key, const std::function<Status(Client&)>& write,
                           Result<Bytes>* read_after) {
    ClientOptions cached;
    cached.location_cache_ms = kLeaseMs;
    auto reader = cluster_.MakeClient(true, cached);
    auto writer = cluster_.MakeClient(true);
    EXPECT_TRUE(reader && writer);
    if (!reader || !writer) return Millis(0);
    ReplicateConfig on0;
    on0.preferred_segments = {cluster_.node(0).name()};
    const Bytes old_value = testdata::Pattern(key + "-old", 64 * KiB);
    EXPECT_TRUE(writer->Put(key, ByteSpan(old_value), on0).ok());
    auto first = reader->Get(key);
    EXPECT_TRUE(first.ok() && *first == old_value);
    EXPECT_TRUE(cluster_.node(0).Kill(SIGSTOP));
    EXPECT_TRUE(cluster_.node(0).WaitStopped(Millis(5'000)));
    EXPECT_TRUE(cluster_.RestartMaster());
    const std::string seg1 = cluster_.node(1).name();
    EXPECT_TRUE(cluster_.WaitForSegments(
        [&](const std::vector<std::string>& names) {
          return std::find(names.begin(), names.end(), seg1) != names.end();
        },
        Millis(10'000)))
        << "node 1 never mounted on the restarted master";
    // The hazard is live: the old copy is still served from the cache.
    const uint64_t cached_before = reader->Stats().cached_gets;
    auto still = reader->Get(key);
    EXPECT_TRUE(still.ok() && *still == old_value);
    EXPECT_EQ(reader->Stats().cached_gets, cached_before + 1)
        << "the reader's entry ran out before the write: this run tests nothing";
    Status done = Status(ErrorCode::INTERNAL_ERROR, "not written");
    Millis took(0);
    for (int i = 0; i < 50 && !done.ok(); ++i) {
      const auto t0 = SteadyClock::now();
      done = write(*writer);
      took = std::chrono::duration_cast<Millis>(SteadyClock::now() - t0);
      if (!done.ok()) std::this_thread::sleep_for(Millis(100));
    }
    EXPECT_TRUE(done.ok()) << done.ToString();
    *read_after = reader->Get(key);
    EXPECT_TRUE(cluster_.node(0).Kill(SIGCONT));
    return took;
  }
};

TEST_F(MasterRestartCacheTest, ANewVersionPutOnARestartedMasterIsNeverHiddenByAnOldCachedCopy) {
  ASSERT_TRUE(StartStore());
  const std::string key = "restart/put";
  const Bytes new_value = testdata::Pattern(key + "-new", 64 * KiB);
  Result<Bytes> got(Status(ErrorCode::INTERNAL_ERROR, ""));
  const Millis took = WriteAfterRestart(
      key, [&](Client& c) { return c.Put(key, ByteSpan(new_value)); }, &got);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, new_value)
      << "a get after the new version's put did not read it (the old copy from the cache?)";
  EXPECT_GE(took.count(), 300) << "the put did not wait out its predecessor's leases";
}

TEST_F(MasterRestartCacheTest, ARemoveOnARestartedMasterIsNeverHiddenByAnOldCachedCopy) {
  ASSERT_TRUE(StartStore());
  const std::string key = "restart/remove";
  Result<Bytes> got(Status(ErrorCode::INTERNAL_ERROR, ""));
  // The new master never heard of the key: not found, yet the remove waits as one that removed.
  const Millis took = WriteAfterRestart(
      key,
      [&](Client& c) {
        Status s = c.Remove(key);
        return s.code() == ErrorCode::OBJECT_NOT_FOUND ? Status::Ok() : s;
      },
      &got);
  EXPECT_FALSE(got.ok()) << "a get after the remove read the old copy from the cache";
  EXPECT_GE(took.count(), 300) << "the remove did not wait out its predecessor's leases";
}

INSTANTIATE_TEST_SUITE_P(Paths, LocationCacheTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "SharedMemory" : "Tcp";
                         });

}  // namespace
}  // namespace granary::it
