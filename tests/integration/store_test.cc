// The store end to end: a real granary-master and granary-node processes, driven through the
// client library (include/granary/client.h) over TCP and over the same-host shared-memory path.
// Every object's bytes are derived from its key (tests/tools/test_pattern.h), so every read is
// checked byte for byte, and the failure paths (a node killed, the master restarted, a writer or
// a reader dying mid-protocol) are checked never to return wrong bytes.
// This file: the data path and the client API; the failures are in store_failure_test.cc, the
// deployments (embedded, standalone, SIGTERM) in store_deploy_test.cc.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <csignal>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "../tools/test_pattern.h"
#include "store_fixture.h"
#include "store_objects.h"

namespace granary::it {
namespace {

// ---------------------------------------------------------------------------------------------
// The data path: 1000 objects of mixed sizes, replica_num 1 and 2, over TCP or shared memory.

class StoreDataPathTest : public StoreTest, public ::testing::WithParamInterface<bool> {};

TEST_P(StoreDataPathTest, ThousandMixedObjectsRoundTripByteForByte) {
  const bool shm = GetParam();
  ASSERT_TRUE(cluster_.Start(3, 256 * MiB));
  auto client = cluster_.MakeClient(shm);
  ASSERT_NE(client, nullptr);
  const std::string tag = shm ? "shm" : "tcp";

  const std::vector<uint64_t> sizes = MixedSizes(1000, 42);
  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  ASSERT_LT(total * 3, 3 * 256 * MiB * 8 / 10) << "the data set must fit (once + twice)";

  ByteChecker check;
  for (uint32_t replicas : {1u, 2u}) {
    SCOPED_TRACE("replica_num " + std::to_string(replicas) + " over " + tag);
    const std::string prefix = tag + "-r" + std::to_string(replicas) + "/";
    const std::vector<Obj> objects = MakeObjects(prefix, sizes);
    const auto t0 = SteadyClock::now();
    PutAll(*client, objects, replicas);
    if (HasFatalFailure()) return;
    const auto t1 = SteadyClock::now();
    ExpectPlacement(*client, objects, replicas);
    ReadAllEveryWay(*client, objects, check);
    const auto t2 = SteadyClock::now();
    std::fprintf(stderr, "[store] %s r%u: put %.1f MiB in %lld ms; four full reads in %lld ms\n",
                 tag.c_str(), replicas, static_cast<double>(total) / MiB,
                 static_cast<long long>(std::chrono::duration_cast<Millis>(t1 - t0).count()),
                 static_cast<long long>(std::chrono::duration_cast<Millis>(t2 - t1).count()));

    // Cross-check through the other transport: bytes written over shm are in the node's real
    // segment as its data server sees it, and bytes written over TCP are visible in the mapping.
    {
      auto other = cluster_.MakeClient(!shm);
      ASSERT_NE(other, nullptr);
      int errors = 0;
      for (size_t begin = 0; begin < objects.size(); begin += 100) {
        std::vector<std::string> keys;
        for (size_t i = begin; i < std::min(objects.size(), begin + 100); ++i) {
          keys.push_back(objects[i].key);
        }
        auto got = other->BatchGet(keys);
        ASSERT_EQ(got.size(), keys.size());
        for (size_t k = 0; k < keys.size(); ++k) {
          if (!got[k].ok()) {
            if (++errors <= 5) ADD_FAILURE() << "cross-transport BatchGet " << keys[k] << ": "
                                             << got[k].status().ToString();
            continue;
          }
          check.Check("cross-transport BatchGet " + keys[k], *got[k], objects[begin + k].value);
        }
      }
      EXPECT_EQ(errors, 0);
    }

    // The listing sees exactly this set under its prefix.
    auto listed = client->QueryByRegex("^" + prefix);
    ASSERT_TRUE(listed.ok()) << listed.status().ToString();
    EXPECT_EQ(listed->size(), objects.size());
    for (const auto& info : *listed) {
      EXPECT_EQ(info.replica_count, replicas) << info.key;
    }
  }
  EXPECT_EQ(check.mismatches(), 0);

  // The same-host path really is a mapping of the nodes' segments, and TCP really is not.
  const std::string maps = ReadFile("/proc/self/maps");
  for (size_t i = 0; i < cluster_.node_count(); ++i) {
    const bool mapped = maps.find(cluster_.node(i).ShmPath()) != std::string::npos;
    EXPECT_EQ(mapped, shm) << cluster_.node(i).ShmPath()
                           << (shm ? " is not mapped by a use_shared_memory client"
                                   : " is mapped by a use_shared_memory=false client");
  }
}

INSTANTIATE_TEST_SUITE_P(Transport, StoreDataPathTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "SharedMemory" : "Tcp"; });

// ---------------------------------------------------------------------------------------------
// The rest of the client API, on a smaller store.

class StoreApiTest : public StoreTest, public ::testing::WithParamInterface<bool> {};

TEST_P(StoreApiTest, BufferOverflowWritesNothing) {
  ASSERT_TRUE(cluster_.Start(2, 128 * MiB));
  auto client = cluster_.MakeClient(GetParam());
  ASSERT_NE(client, nullptr);
  for (uint64_t size : {uint64_t{4 * KiB + 1}, uint64_t{6 * MiB}}) {
    const std::string key = "overflow-" + std::to_string(size);
    const Bytes value = testdata::Pattern(key, size);
    ASSERT_TRUE(client->Put(key, Span(value)).ok());

    Bytes small(size - 1, std::byte{0xab});
    auto got = client->GetInto(key, small);
    ASSERT_FALSE(got.ok()) << "GetInto a buffer one byte too small succeeded";
    EXPECT_EQ(got.code(), ErrorCode::BUFFER_OVERFLOW) << got.status().ToString();
    EXPECT_TRUE(std::all_of(small.begin(), small.end(), [](std::byte b) { return b == std::byte{0xab}; }))
        << "GetInto wrote into a buffer it reported too small";

    std::vector<Bytes> bufs = {Bytes(size / 2, std::byte{0xab}), Bytes(size / 2 - 1, std::byte{0xab})};
    auto parts = client->BatchGetIntoParts({key}, {{MutableByteSpan(bufs[0]), MutableByteSpan(bufs[1])}});
    ASSERT_EQ(parts.size(), 1u);
    ASSERT_FALSE(parts[0].ok());
    EXPECT_EQ(parts[0].code(), ErrorCode::BUFFER_OVERFLOW) << parts[0].status().ToString();
    for (const auto& b : bufs) {
      EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](std::byte x) { return x == std::byte{0xab}; }))
          << "BatchGetIntoParts wrote into buffers it reported too small";
    }
    // The failed reads left no lock behind: a plain Remove succeeds at once.
    EXPECT_TRUE(client->Remove(key).ok());
  }
}

TEST_P(StoreApiTest, WriteOnceUpsertQueriesAndRemoval) {
  ASSERT_TRUE(cluster_.Start(2, 128 * MiB));
  auto client = cluster_.MakeClient(GetParam());
  ASSERT_NE(client, nullptr);
  const std::vector<Obj> objects = MakeObjects("api/obj-", std::vector<uint64_t>(30, 3 * KiB + 5));
  PutAll(*client, objects, 2);
  ByteChecker check;

  // Put of an existing key: OK, the old value stays (single and batch).
  const Bytes other = testdata::Pattern("something else", 3 * KiB + 5, 7);
  EXPECT_TRUE(client->Put(objects[0].key, Span(other)).ok());
  auto again = client->BatchPut({objects[1].key, objects[2].key}, {Span(other), Span(other)});
  ASSERT_EQ(again.size(), 2u);
  EXPECT_TRUE(again[0].ok()) << again[0].ToString();
  EXPECT_TRUE(again[1].ok()) << again[1].ToString();
  for (int i = 0; i < 3; ++i) {
    auto got = client->Get(objects[i].key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    check.Check("Get after a second put of " + objects[i].key, *got, objects[i].value);
  }

  // Upsert replaces, also with another size.
  const Bytes replaced = testdata::Pattern("replacement", 10 * KiB + 1, 9);
  EXPECT_TRUE(client->Upsert(objects[3].key, Span(replaced)).ok());
  {
    auto got = client->Get(objects[3].key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    check.Check("Get after Upsert", *got, replaced);
    auto size = client->GetSize(objects[3].key);
    ASSERT_TRUE(size.ok());
    EXPECT_EQ(*size, replaced.size());
  }
  // Upsert of a new key creates it.
  EXPECT_TRUE(client->Upsert("api/fresh", Span(replaced)).ok());
  EXPECT_TRUE(IsTrue(client->Exist("api/fresh")));

  // Exist / GetSize / PrefixMatch.
  auto exists = client->Exist(objects[5].key);
  ASSERT_TRUE(exists.ok());
  EXPECT_TRUE(*exists);
  auto missing = client->Exist("api/never-stored");
  ASSERT_TRUE(missing.ok()) << "a miss is not an error: " << missing.status().ToString();
  EXPECT_FALSE(*missing);
  auto batch_exist = client->BatchExist({objects[6].key, "api/never-stored", objects[7].key});
  ASSERT_EQ(batch_exist.size(), 3u);
  EXPECT_TRUE(batch_exist[0].ok() && *batch_exist[0]);
  EXPECT_TRUE(batch_exist[1].ok() && !*batch_exist[1]);
  EXPECT_TRUE(batch_exist[2].ok() && *batch_exist[2]);
  auto size = client->GetSize(objects[5].key);
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_EQ(*size, objects[5].value.size());
  auto no_size = client->GetSize("api/never-stored");
  EXPECT_FALSE(no_size.ok());
  EXPECT_EQ(no_size.code(), ErrorCode::OBJECT_NOT_FOUND) << no_size.status().ToString();
  auto prefix = client->PrefixMatch({objects[10].key, objects[11].key, objects[12].key,
                                     "api/never-stored", objects[13].key});
  ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
  EXPECT_EQ(*prefix, 3u);
  auto none = client->PrefixMatch({"api/never-stored", objects[10].key});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0u);

  // A miss is OBJECT_NOT_FOUND everywhere.
  auto miss = client->Get("api/never-stored");
  ASSERT_FALSE(miss.ok());
  EXPECT_EQ(miss.code(), ErrorCode::OBJECT_NOT_FOUND) << miss.status().ToString();
  Bytes buf(64);
  auto miss_into = client->GetInto("api/never-stored", buf);
  EXPECT_EQ(miss_into.code(), ErrorCode::OBJECT_NOT_FOUND) << miss_into.status().ToString();
  EXPECT_EQ(client->Remove("api/never-stored").code(), ErrorCode::OBJECT_NOT_FOUND);

  // QueryByRegex: searched anywhere in the key, anchors honoured, limit honoured.
  auto all = client->QueryByRegex("^api/obj-");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->size(), objects.size());
  auto ones = client->QueryByRegex("obj-1[0-9]$");
  ASSERT_TRUE(ones.ok());
  EXPECT_EQ(ones->size(), 10u);
  for (const auto& info : *ones) {
    EXPECT_EQ(info.size, 3 * KiB + 5) << info.key;
    EXPECT_EQ(info.replica_count, 2u) << info.key;
  }
  auto limited = client->QueryByRegex("^api/obj-", 4);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->size(), 4u);
  auto bad = client->QueryByRegex("(unclosed");
  EXPECT_FALSE(bad.ok()) << "an invalid RE2 pattern must be refused";

  // Remove one; RemoveByRegex the twenties; the rest is untouched.
  EXPECT_TRUE(client->Remove(objects[4].key).ok());
  EXPECT_EQ(client->Get(objects[4].key).code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_FALSE(IsTrue(client->Exist(objects[4].key)));
  auto removed = client->RemoveByRegex("^api/obj-2[0-9]$");
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, 10u);
  for (int i = 20; i < 30; ++i) {
    EXPECT_EQ(client->Get(objects[i].key).code(), ErrorCode::OBJECT_NOT_FOUND) << objects[i].key;
  }
  for (int i = 5; i < 20; ++i) {
    auto got = client->Get(objects[i].key);
    ASSERT_TRUE(got.ok()) << objects[i].key << ": " << got.status().ToString();
    check.Check("Get after removals " + objects[i].key, *got, objects[i].value);
  }
  // A removed key can be put again, with new contents.
  EXPECT_TRUE(client->Put(objects[4].key, Span(other)).ok());
  auto reput = client->Get(objects[4].key);
  ASSERT_TRUE(reput.ok());
  check.Check("Get after re-put", *reput, other);

  // One key twice in a batch: the object is one of the two values, whole.
  const Bytes first_value = testdata::Pattern("dup-1", 20 * KiB);
  const Bytes second_value = testdata::Pattern("dup-2", 20 * KiB);
  auto dup = client->BatchPut({"api/dup", "api/dup"}, {Span(first_value), Span(second_value)});
  ASSERT_EQ(dup.size(), 2u);
  EXPECT_TRUE(dup[0].ok()) << dup[0].ToString();
  EXPECT_TRUE(dup[1].ok()) << dup[1].ToString();
  auto dup_got = client->Get("api/dup");
  ASSERT_TRUE(dup_got.ok()) << dup_got.status().ToString();
  EXPECT_TRUE(testdata::FirstDifference(*dup_got, first_value) < 0 ||
              testdata::FirstDifference(*dup_got, second_value) < 0)
      << "a key put twice in one batch holds neither value";
  // ...and read three times in one batch: three exact copies, and no read lock left behind.
  auto triple = client->BatchGet({"api/dup", objects[5].key, "api/dup", "api/dup"});
  ASSERT_EQ(triple.size(), 4u);
  for (size_t i : {0u, 2u, 3u}) {
    ASSERT_TRUE(triple[i].ok()) << triple[i].status().ToString();
    check.Check("duplicate key in BatchGet", *triple[i], *dup_got);
  }
  // Locks are released in the background (client/read_releaser.h), within ~1 ms; well before
  // the 1 s lease TTL could hide a leak.
  uint32_t locks = 0;
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto st = client->Stat("api/dup");
        locks = st.ok() ? st->read_locks : 99;
        return locks == 0;
      },
      Millis(300), Millis(10)))
      << "BatchGet of a repeated key left " << locks << " read locks";
  EXPECT_TRUE(client->Remove("api/dup").ok()) << "a lock leaked by BatchGet blocks Remove";
  EXPECT_EQ(check.mismatches(), 0);
}

INSTANTIATE_TEST_SUITE_P(Transport, StoreApiTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "SharedMemory" : "Tcp"; });

// A miss is OBJECT_NOT_FOUND; a dead master is an RPC error, never a miss.
TEST_F(StoreTest, MissIsDistinguishableFromMasterDown) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  ClientOptions options;
  options.rpc_timeout_ms = 2000;
  auto client = cluster_.MakeClient(false, options);
  ASSERT_NE(client, nullptr);
  const Bytes value = testdata::Pattern("present", 8 * KiB);
  ASSERT_TRUE(client->Put("present", Span(value)).ok());
  EXPECT_EQ(client->Get("absent").code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_TRUE(client->Health().ok());

  ASSERT_TRUE(cluster_.master().Stop(SIGKILL, Millis(5000)).has_value());
  auto is_rpc_error = [](ErrorCode c) {
    return c == ErrorCode::RPC_FAIL || c == ErrorCode::RPC_TIMEOUT;
  };
  const auto t0 = SteadyClock::now();
  for (const char* key : {"present", "absent"}) {
    auto got = client->Get(key);
    ASSERT_FALSE(got.ok()) << "Get " << key << " succeeded with the master down";
    EXPECT_TRUE(is_rpc_error(got.code())) << "Get " << key << ": " << got.status().ToString();
    auto exist = client->Exist(key);
    ASSERT_FALSE(exist.ok()) << "Exist " << key << " answered " << *exist
                             << " with the master down";
    EXPECT_TRUE(is_rpc_error(exist.code())) << exist.status().ToString();
  }
  Status put = client->Put("new", Span(value));
  EXPECT_TRUE(is_rpc_error(put.code())) << put.ToString();
  EXPECT_TRUE(is_rpc_error(client->Health().code()));
  EXPECT_TRUE(is_rpc_error(client->PrefixMatch({"present"}).code()));
  EXPECT_LT(SteadyClock::now() - t0, std::chrono::seconds(30)) << "calls must honour the timeout";
}

// A client that saw the master down answers again promptly once it is back.
TEST_F(StoreTest, ClientRecoversPromptlyAfterMasterOutage) {
  ASSERT_TRUE(cluster_.Start(1, 32 * MiB));
  ClientOptions options;
  options.rpc_timeout_ms = 2000;
  auto client = cluster_.MakeClient(false, options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Health().ok());
  ASSERT_TRUE(cluster_.master().Stop(SIGKILL, Millis(5000)).has_value());
  // The engine keeps asking during the outage (as a serving engine would).
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(client->Health().ok());
    std::this_thread::sleep_for(Millis(100));
  }
  ASSERT_TRUE(cluster_.RestartMaster());
  const auto up = SteadyClock::now();
  Status last_error;
  bool answered = WaitUntil(
      [&] {
        Status s = client->Health();
        if (!s.ok()) last_error = s;
        return s.ok();
      },
      Millis(10'000), Millis(100));
  const auto after = std::chrono::duration_cast<Millis>(SteadyClock::now() - up);
  ASSERT_TRUE(answered) << "no answer 10 s after the master was back: " << last_error.ToString();
  EXPECT_LE(after.count(), 3000) << "the client kept failing for " << after.count()
                                 << " ms after the master was back, with: "
                                 << last_error.ToString();
}

}  // namespace
}  // namespace granary::it
