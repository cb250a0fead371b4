// The store under failures, end to end with real processes: nodes and masters killed (-9) and
// restarted, eviction under pressure, one client on many threads, writers and readers killed
// mid-protocol. Never wrong bytes (store_objects.h checks each read byte for byte).
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
// Failures.

// SIGKILL one node of three while two clients read everything in a loop.
TEST_F(StoreTest, NodeKilledSingleReplicasGoReplicatedStayNeverWrongBytes) {
  ASSERT_TRUE(cluster_.Start(3, 128 * MiB));
  // Puts placed one by one (no space reserved ahead: a client's reservations sit on one or two
  // segments), so that the single replicas spread over the three nodes and the victim holds some.
  ClientOptions writer_options;
  writer_options.reserve_bytes = 0;
  auto writer = cluster_.MakeClient(false, writer_options);
  ASSERT_NE(writer, nullptr);

  std::vector<uint64_t> sizes;
  for (int i = 0; i < 120; ++i) sizes.push_back(4 * KiB + (i * 7919) % (256 * KiB));
  sizes[7] = 6 * MiB;  // striped over several connections
  sizes[77] = 5 * MiB + 3;
  const std::vector<Obj> single = MakeObjects("kill/r1-", sizes);
  const std::vector<Obj> doubled = MakeObjects("kill/r2-", sizes);
  PutAll(*writer, single, 1);
  PutAll(*writer, doubled, 2);
  ASSERT_FALSE(HasFailure());

  const std::string victim = cluster_.node(1).name();
  std::set<std::string> on_victim_only;  // r1 objects whose only replica dies
  for (const auto* set : {&single, &doubled}) {
    for (const auto& o : *set) {
      auto st = writer->Stat(o.key);
      ASSERT_TRUE(st.ok()) << o.key;
      bool elsewhere = false, there = false;
      for (const auto& r : st->replicas) (r.segment_name == victim ? there : elsewhere) = true;
      if (set == &doubled) {
        ASSERT_TRUE(elsewhere) << o.key << " has no replica off " << victim;
      } else if (there) {
        on_victim_only.insert(o.key);
      }
    }
  }
  ASSERT_GT(on_victim_only.size(), 10u) << "placement did not use the victim";

  std::map<std::string, const Obj*> by_key;
  for (const auto* set : {&single, &doubled}) {
    for (const auto& o : *set) by_key[o.key] = &o;
  }

  // Readers: every successful Get must be exact; replicated objects must never fail.
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, replicated_failures{0}, reads{0};
  std::mutex report_mu;
  std::vector<std::string> reports;
  auto reader = [&](bool shm) {
    ClientOptions options;
    options.io_timeout_ms = 5000;
    auto client = cluster_.MakeClient(shm, options);
    if (!client) return;
    while (!stop.load()) {
      for (const auto& [key, obj] : by_key) {
        if (stop.load()) break;
        auto got = client->Get(key);
        reads++;
        if (got.ok()) {
          if (testdata::FirstDifference(*got, obj->value) >= 0) {
            wrong++;
            std::lock_guard lock(report_mu);
            reports.push_back("wrong bytes for " + key + (shm ? " (shm)" : " (tcp)"));
          }
        } else if (key.rfind("kill/r2-", 0) == 0) {
          replicated_failures++;
          std::lock_guard lock(report_mu);
          if (reports.size() < 10) {
            reports.push_back("replicated " + key + (shm ? " (shm): " : " (tcp): ") +
                              got.status().ToString());
          }
        }
      }
    }
  };
  std::thread tcp_reader(reader, false);
  std::thread shm_reader(reader, true);
  std::this_thread::sleep_for(Millis(300));

  const auto killed_at = SteadyClock::now();
  cluster_.KillNode(1);

  // Within the client TTL (2 s) plus slack, the victim's single replicas are gone: a miss.
  auto checker = cluster_.MakeClient(false);
  ASSERT_NE(checker, nullptr);
  std::map<std::string, std::string> last_codes;
  bool all_gone = WaitUntil(
      [&] {
        for (const auto& key : on_victim_only) {
          auto got = checker->Get(key);
          if (got.code() != ErrorCode::OBJECT_NOT_FOUND) {
            last_codes[key] = got.ok() ? "OK" : got.status().ToString();
            return false;
          }
        }
        return true;
      },
      Millis(6000), Millis(100));
  const auto gone_after = std::chrono::duration_cast<Millis>(SteadyClock::now() - killed_at);
  std::this_thread::sleep_for(Millis(500));  // readers keep going after the expiry too
  stop = true;
  tcp_reader.join();
  shm_reader.join();

  EXPECT_TRUE(all_gone) << "single-replica objects of the killed node still not OBJECT_NOT_FOUND "
                        << gone_after.count() << " ms after the kill; e.g. "
                        << (last_codes.empty() ? "" : last_codes.begin()->first + ": " +
                                                          last_codes.begin()->second);
  EXPECT_LE(gone_after.count(), 5000);
  EXPECT_EQ(wrong.load(), 0) << "a Get returned wrong bytes";
  EXPECT_EQ(replicated_failures.load(), 0)
      << "objects with a surviving replica failed to read while a node died";
  for (const auto& r : reports) ADD_FAILURE() << r;
  EXPECT_GT(reads.load(), 100) << "the readers barely ran";  // 192 in ~8 s once under TSan

  auto names = cluster_.ListSegmentNames();
  ASSERT_TRUE(names.has_value());
  EXPECT_EQ(std::count(names->begin(), names->end(), victim), 0) << "dead node still listed";

  // After the expiry: every replicated object and every survivor single readable, exactly.
  ByteChecker check;
  for (const auto& [key, obj] : by_key) {
    auto got = checker->Get(key);
    if (on_victim_only.count(key)) {
      EXPECT_EQ(got.code(), ErrorCode::OBJECT_NOT_FOUND) << key;
      EXPECT_FALSE(IsTrue(checker->Exist(key))) << key;
      continue;
    }
    ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
    check.Check("after the kill " + key, *got, obj->value);
  }
  EXPECT_EQ(check.mismatches(), 0);
}

// SIGKILL the master and start it again on the same port: nodes remount, clients carry on.
TEST_F(StoreTest, MasterRestartNodesRemountAndServiceResumes) {
  ASSERT_TRUE(cluster_.Start(3, 64 * MiB));
  auto tcp = cluster_.MakeClient(false);
  ClientOptions short_io;
  short_io.io_timeout_ms = 1500;  // a read that falls back to a frozen node's TCP fails fast
  auto shm = cluster_.MakeClient(true, short_io);
  ASSERT_TRUE(tcp && shm);
  const std::vector<Obj> before = MakeObjects("restart/before-", std::vector<uint64_t>(20, 64 * KiB));
  PutAll(*tcp, before, 2);

  ASSERT_TRUE(cluster_.RestartMaster());
  const auto restarted = SteadyClock::now();
  EXPECT_TRUE(cluster_.WaitForAllNodesMounted(Millis(5000)))
      << "nodes did not remount within 5 s of the master's restart";
  std::fprintf(stderr, "[store] all segments listed %lld ms after the master restart\n",
               static_cast<long long>(
                   std::chrono::duration_cast<Millis>(SteadyClock::now() - restarted).count()));

  // The restarted master knows nothing of the old objects: a clean miss, never stale bytes.
  ByteChecker check;
  for (Client* c : {tcp.get(), shm.get()}) {
    // The first call after the restart may find the old connection broken; bounded retry.
    bool answered = WaitUntil([&] { return c->Health().ok(); }, Millis(5000), Millis(100));
    ASSERT_TRUE(answered) << "the client did not reconnect to the restarted master";
    for (const auto& o : before) {
      auto got = c->Get(o.key);
      if (got.ok()) {
        check.Check("old object after restart " + o.key, *got, o.value);
      } else {
        EXPECT_EQ(got.code(), ErrorCode::OBJECT_NOT_FOUND) << o.key << ": " << got.status().ToString();
      }
    }
  }
  // The remounted segments take new objects (at once: nodes remount fresh memory, no quarantine).
  EXPECT_TRUE(WaitUntil(
      [&] {
        const std::vector<std::byte> probe(4096, std::byte{7});
        return tcp->Put("restart/probe", probe).ok();
      },
      Millis(5000), Millis(100)))
      << "puts did not resume within 5 s of the remount";
  // Puts and gets work again, through both transports, with replicas on every node.
  for (Client* c : {tcp.get(), shm.get()}) {
    const std::string prefix = c == tcp.get() ? "restart/after-tcp-" : "restart/after-shm-";
    std::vector<uint64_t> sizes(30, 100 * KiB + 3);
    sizes[3] = 5 * MiB;
    const std::vector<Obj> after = MakeObjects(prefix, sizes);
    PutAll(*c, after, 2);
    for (const auto& o : after) {
      auto got = c->Get(o.key);
      ASSERT_TRUE(got.ok()) << o.key << ": " << got.status().ToString();
      check.Check("after restart " + o.key, *got, o.value);
    }
  }
  auto segments = tcp->ListSegments();
  ASSERT_TRUE(segments.ok());
  EXPECT_EQ(segments->size(), 3u);

  // The client made before the restart still takes the same-host path to the remounted
  // segments: with every node frozen (SIGSTOP, so no TCP answer), its reads still succeed.
  {
    struct Thaw {
      StoreCluster& c;
      ~Thaw() {
        for (size_t i = 0; i < c.node_count(); ++i) c.node(i).Kill(SIGCONT);
      }
    } thaw{cluster_};
    for (size_t i = 0; i < cluster_.node_count(); ++i) ASSERT_TRUE(cluster_.node(i).Kill(SIGSTOP));
    for (size_t i = 0; i < cluster_.node_count(); ++i) {
      ASSERT_TRUE(cluster_.node(i).process().WaitStopped(Millis(2000)));
    }
    const auto frozen_at = SteadyClock::now();
    for (int i = 0; i < 5; ++i) {
      const std::string key = "restart/after-shm-" + std::to_string(i);
      auto got = shm->Get(key);
      ASSERT_TRUE(got.ok()) << key << " with the nodes frozen: " << got.status().ToString()
                            << " (the same-host path was not used after the restart)";
      check.Check("frozen-node read " + key, *got, testdata::Pattern(key, i == 3 ? 5 * MiB : 100 * KiB + 3));
    }
    EXPECT_LT(SteadyClock::now() - frozen_at, Millis(1500)) << "frozen too long for the client TTL";
  }
  EXPECT_EQ(check.mismatches(), 0);
  EXPECT_TRUE(cluster_.WaitForAllNodesMounted(Millis(3000)));
}

// A node started while the master is down serves as soon as the master appears.
TEST_F(StoreTest, NodeStartedBeforeMasterMountsWhenMasterComesUp) {
  ASSERT_TRUE(cluster_.Start(0, 0));
  ASSERT_TRUE(cluster_.master().Stop(SIGKILL, Millis(5000)).has_value());
  TempDir dir("granary-it-early");
  NodeProcess node(UniqueName("early"), 32 * MiB, dir.path());
  ASSERT_TRUE(node.Start(cluster_.master_address()))
      << "a node must start (and keep trying) while the master is unreachable";
  std::this_thread::sleep_for(Millis(500));
  ASSERT_TRUE(node.Running()) << node.Log();

  ASSERT_TRUE(cluster_.master().Restart());
  const auto up = SteadyClock::now();
  ASSERT_TRUE(cluster_.WaitForSegments(
      [&](const auto& names) { return std::count(names.begin(), names.end(), node.name()) == 1; },
      Millis(5000)))
      << "the node did not mount within 5 s of the master coming up\n" << node.Log();
  std::fprintf(stderr, "[store] node mounted %lld ms after the master came up\n",
               static_cast<long long>(
                   std::chrono::duration_cast<Millis>(SteadyClock::now() - up).count()));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const Bytes value = testdata::Pattern("early", 300 * KiB);
  ASSERT_TRUE(client->Put("early", Span(value)).ok());
  auto got = client->Get("early");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_LT(testdata::FirstDifference(*got, value), 0);
}

// A crashed node restarted at once (as systemd or Kubernetes would) must come back on its own:
// DESIGN.md "a node that comes back remounts". Today the restarted process exits 1 with
// SEGMENT_ALREADY_EXISTS while the master still holds the dead process's registration (until
// the client TTL expires it), so a supervisor's restart loop backs off instead. Disabled until
// the lead decides (see the report): the master could let a node of the same name on the same
// host take over (the shm flock already proves the old owner dead), or the node could retry the
// mount until the stale registration expires instead of exiting.
TEST_F(StoreTest, NodeRestartedRightAfterCrashComesBack) {
  ASSERT_TRUE(cluster_.Start(1, 32 * MiB));
  cluster_.KillNode(0);
  // Started again at once: the master still holds the dead process's registration (TTL 2 s).
  ASSERT_TRUE(cluster_.RestartNode(0)) << "a node restarted right after a crash gave up";
  EXPECT_TRUE(cluster_.WaitForAllNodesMounted(Millis(5000)));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const Bytes value = testdata::Pattern("comeback", 64 * KiB);
  Status put;
  EXPECT_TRUE(WaitUntil([&] { return (put = client->Put("comeback", Span(value))).ok(); },
                        Millis(5000), Millis(100)))
      << put.ToString();
  auto got = client->Get("comeback");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_LT(testdata::FirstDifference(*got, value), 0);
}

// A node SIGKILLed and started again under the same name gets a new segment in /dev/shm: a
// client that had mapped the old one must neither write into nor read from that dead copy.
TEST_F(StoreTest, NodeRestartedUnderSameNameNeverUsesStaleMapping) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  auto shm = cluster_.MakeClient(true);
  auto tcp = cluster_.MakeClient(false);
  ASSERT_TRUE(shm && tcp);
  const Bytes old_value = testdata::Pattern("old", 1 * MiB);
  ASSERT_TRUE(shm->Put("restart-node/old", Span(old_value)).ok());
  auto first = shm->Get("restart-node/old");
  ASSERT_TRUE(first.ok());  // the client has now mapped the segment
  const std::string name = cluster_.node(0).name();

  cluster_.KillNode(0);
  ASSERT_TRUE(cluster_.WaitForSegments(
      [&](const auto& names) { return std::count(names.begin(), names.end(), name) == 0; },
      Millis(6000)))
      << "the killed node was not expired";
  ASSERT_TRUE(cluster_.RestartNode(0));
  ASSERT_TRUE(cluster_.WaitForAllNodesMounted(Millis(5000)));

  EXPECT_EQ(shm->Get("restart-node/old").code(), ErrorCode::OBJECT_NOT_FOUND);
  ByteChecker check;
  std::vector<uint64_t> sizes(8, 256 * KiB);
  sizes[2] = 5 * MiB;
  // Written through the shm client (likely at the very offsets the old object used)...
  const std::vector<Obj> objects = MakeObjects("restart-node/new-", sizes);
  PutAll(*shm, objects, 1);
  for (const auto& o : objects) {
    // ...read through the node's data server, and through the shm client.
    for (Client* c : {tcp.get(), shm.get()}) {
      auto got = c->Get(o.key);
      ASSERT_TRUE(got.ok()) << o.key << (c == shm.get() ? " (shm): " : " (tcp): ")
                            << got.status().ToString();
      check.Check(o.key, *got, o.value);
    }
  }
  EXPECT_EQ(check.mismatches(), 0);
}

// Overfilling the store evicts old objects to make room; a concurrent reader sees each object
// exact or missing, never anything else.
TEST_F(StoreTest, EvictionUnderPressureNeverReturnsWrongBytes) {
  ASSERT_TRUE(cluster_.Start(1, 32 * MiB));
  // Short cache leases (300 ms still serves repeat gets from the cache): a leased object cannot
  // be evicted, and the check of the newest object below waits for the readers' leases to end.
  ClientOptions options;
  options.location_cache_ms = 300;
  auto writer = cluster_.MakeClient(false, options);
  ASSERT_NE(writer, nullptr);
  constexpr int kObjects = 96;  // 3x the capacity
  std::vector<std::string> keys;
  for (int i = 0; i < kObjects; ++i) keys.push_back("evict/" + std::to_string(i));
  std::atomic<int> written{0};
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, bad_errors{0}, hits{0};
  std::string first_bad;
  std::mutex bad_mu;
  std::thread reader([&] {
    auto client = cluster_.MakeClient(true, options);
    if (!client) return;
    while (!stop.load()) {
      int n = written.load();
      for (int i = std::max(0, n - 40); i < n && !stop.load(); ++i) {
        auto got = client->Get(keys[i]);
        if (got.ok()) {
          hits++;
          if (testdata::FirstDifference(*got, testdata::Pattern(keys[i], 1 * MiB)) >= 0) wrong++;
        } else if (got.code() != ErrorCode::OBJECT_NOT_FOUND) {
          bad_errors++;
          std::lock_guard lock(bad_mu);
          if (first_bad.empty()) first_bad = keys[i] + ": " + got.status().ToString();
        }
      }
    }
  });
  int put_failures = 0;
  std::string first_put_failure;
  for (int i = 0; i < kObjects; ++i) {
    Status s = writer->Put(keys[i], Span(testdata::Pattern(keys[i], 1 * MiB)));
    if (!s.ok() && put_failures++ == 0) first_put_failure = keys[i] + ": " + s.ToString();
    written = i + 1;
  }
  std::this_thread::sleep_for(Millis(200));
  stop = true;
  reader.join();
  EXPECT_EQ(put_failures, 0) << "puts into a full store failed instead of evicting, e.g. "
                             << first_put_failure;
  EXPECT_EQ(wrong.load(), 0) << "a Get returned wrong bytes under eviction";
  EXPECT_EQ(bad_errors.load(), 0) << "reads failed with an error, not a miss: " << first_bad;
  EXPECT_GT(hits.load(), 0);
  // Every object is exact or gone.
  int present = 0;
  for (int i = 0; i < kObjects; ++i) {
    auto got = writer->Get(keys[i]);
    if (got.ok()) {
      present++;
      EXPECT_LT(testdata::FirstDifference(*got, testdata::Pattern(keys[i], 1 * MiB)), 0) << keys[i];
    } else {
      EXPECT_EQ(got.code(), ErrorCode::OBJECT_NOT_FOUND) << keys[i] << ": " << got.status().ToString();
    }
  }
  EXPECT_GT(present, 10);
  EXPECT_LE(present, 32);
  // A put into the full store is not its own eviction's victim while older objects are
  // evictable: once the reader's leases are over (a leased object is not evicted, so while they
  // last the one object nobody read may be the only candidate), a fresh put survives the
  // watermark passes that make room after it (every 100 ms).
  std::this_thread::sleep_for(Millis(400));
  const std::string last = "evict/last";
  ASSERT_TRUE(writer->Put(last, Span(testdata::Pattern(last, 1 * MiB))).ok());
  std::this_thread::sleep_for(Millis(300));
  auto newest = writer->Get(last);
  ASSERT_TRUE(newest.ok()) << "the newest object was evicted: " << newest.status().ToString();
  EXPECT_LT(testdata::FirstDifference(*newest, testdata::Pattern(last, 1 * MiB)), 0);
}

// One Client used from many threads at once (its header promises every method is thread-safe).
TEST_F(StoreTest, OneClientManyThreads) {
  ASSERT_TRUE(cluster_.Start(2, 128 * MiB));
  for (bool shm : {false, true}) {
    auto client = cluster_.MakeClient(shm);
    ASSERT_NE(client, nullptr);
    constexpr int kThreads = 8;
    std::atomic<int> failures{0};
    std::mutex mu;
    std::string first;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        auto fail = [&](const std::string& what) {
          failures++;
          std::lock_guard lock(mu);
          if (first.empty()) first = what;
        };
        std::vector<uint64_t> sizes(24, 16 * KiB + static_cast<uint64_t>(t));
        sizes[5] = 5 * MiB;  // striped, while other threads use the pool
        const std::vector<Obj> objects =
            MakeObjects(std::string(shm ? "mt-shm/" : "mt-tcp/") + std::to_string(t) + "/", sizes);
        std::vector<std::string> keys;
        std::vector<ByteSpan> values;
        for (const auto& o : objects) {
          keys.push_back(o.key);
          values.push_back(Span(o.value));
        }
        ReplicateConfig config;
        config.replica_num = 2;
        for (const auto& s : client->BatchPut(keys, values, config)) {
          if (!s.ok()) fail("BatchPut: " + s.ToString());
        }
        for (int round = 0; round < 3; ++round) {
          auto got = client->BatchGet(keys);
          for (size_t i = 0; i < keys.size(); ++i) {
            if (!got[i].ok()) {
              fail("BatchGet " + keys[i] + ": " + got[i].status().ToString());
            } else if (testdata::FirstDifference(*got[i], objects[i].value) >= 0) {
              fail("wrong bytes for " + keys[i]);
            }
          }
          auto exist = client->BatchExist(keys);
          for (const auto& e : exist) {
            if (!IsTrue(e)) fail("BatchExist said missing");
          }
        }
        for (const auto& s : client->BatchRemove(keys)) {
          if (!s.ok()) fail("BatchRemove: " + s.ToString());
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0) << (shm ? "shm" : "tcp") << ": " << first;
  }
}

// A writer killed between put-start and put-end: never readable; the key is free again after
// the discard timeout, and the space comes back after the release timeout.
TEST_F(StoreTest, WriterKilledMidPutNeverReadableAndKeyReusable) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  ClientOptions options;
  options.reserve_bytes = 0;  // the test counts used bytes: no space reserved in the background
  auto client = cluster_.MakeClient(true, options);
  ASSERT_NE(client, nullptr);
  auto used = [&]() -> uint64_t {
    auto segments = client->ListSegments();
    if (!segments.ok() || segments->size() != 1) return UINT64_MAX;
    return (*segments)[0].used_bytes;
  };
  const uint64_t used_empty = used();
  const std::string key = "zombie/put";

  ChildProcess worker;
  std::string error;
  TempDir dir("granary-it-zombie");
  ASSERT_TRUE(worker.Start(BinaryPath("granary-test-worker"),
                           {"put-start-and-hang", "--master", cluster_.master_address(), "--key",
                            key, "--size", std::to_string(1 * MiB)},
                           dir.File("worker.log"), &error))
      << error;
  ASSERT_TRUE(WaitForLog(worker, "started", Millis(10'000))) << worker.LogContents();
  const auto started_at = SteadyClock::now();
  worker.KillAndReap();
  const uint64_t used_pending = used();
  EXPECT_GE(used_pending, used_empty + 1 * MiB) << "put-start allocated nothing";

  // Until the discard timeout, the object is never readable and never listed as existing.
  auto stat = client->Stat(key);
  ASSERT_TRUE(stat.ok()) << stat.status().ToString();
  EXPECT_EQ(stat->state, "PROCESSING");
  while (SteadyClock::now() - started_at < Millis(1300)) {
    auto got = client->Get(key);
    ASSERT_FALSE(got.ok()) << "an unfinished put became readable (" << got->size() << " bytes)";
    EXPECT_TRUE(got.code() == ErrorCode::REPLICA_IS_NOT_READY ||
                got.code() == ErrorCode::OBJECT_NOT_FOUND)
        << got.status().ToString();
    EXPECT_FALSE(IsTrue(client->Exist(key)));
    std::this_thread::sleep_for(Millis(50));
  }

  // Past the discard timeout (1 s) the key can be put again, and holds the new bytes.
  const Bytes value = testdata::Pattern(key, 1 * MiB);
  Status put = client->Put(key, Span(value));
  ASSERT_TRUE(put.ok()) << put.ToString();
  auto got = client->Get(key);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_LT(testdata::FirstDifference(*got, value), 0) << "wrong bytes after the re-put";
  const uint64_t used_both = used();

  // Past the release timeout (3 s after the put-start) the zombie's space is freed.
  bool released = WaitUntil([&] { return used() <= used_both - (used_pending - used_empty); },
                            Millis(6000), Millis(100));
  EXPECT_TRUE(released) << "used bytes " << used() << ", expected "
                        << used_both - (used_pending - used_empty);
  auto still = client->Get(key);
  ASSERT_TRUE(still.ok()) << still.status().ToString();
  EXPECT_LT(testdata::FirstDifference(*still, value), 0);
}

// A reader killed holding read locks: a lock blocks a plain Remove until its TTL, then not; a
// forced Remove takes the object at once but its space stays reserved until the lock expires.
TEST_F(StoreTest, ReaderKilledHoldingLockBlocksRemoveUntilLeaseTtl) {
  // A lease of 3 s (not 1 s) so the "before the TTL" checks cannot be late on a loaded machine.
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB, {{"--lease-ttl", "3s"}}));
  ClientOptions options;
  options.reserve_bytes = 0;  // the test counts used bytes: no space reserved in the background
  auto client = cluster_.MakeClient(false, options);
  ASSERT_NE(client, nullptr);
  auto used = [&]() -> uint64_t {
    auto segments = client->ListSegments();
    if (!segments.ok() || segments->size() != 1) return UINT64_MAX;
    return (*segments)[0].used_bytes;
  };
  const std::string key = "leased/object", forced = "leased/forced";
  const Bytes value = testdata::Pattern(key, 256 * KiB);
  const Bytes forced_value = testdata::Pattern(forced, 4 * MiB);
  ASSERT_TRUE(client->Put(key, Span(value)).ok());
  ASSERT_TRUE(client->Put(forced, Span(forced_value)).ok());
  const uint64_t used_both = used();

  ChildProcess worker;
  std::string error;
  TempDir dir("granary-it-lease");
  ASSERT_TRUE(worker.Start(BinaryPath("granary-test-worker"),
                           {"get-and-hang", "--master", cluster_.master_address(), "--key", key,
                            "--key", forced},
                           dir.File("worker.log"), &error))
      << error;
  ASSERT_TRUE(WaitForLog(worker, "locked", Millis(10'000))) << worker.LogContents();
  const auto locked_at = SteadyClock::now();
  worker.KillAndReap();
  auto before_ttl = [&] { return SteadyClock::now() - locked_at < Millis(2500); };

  Status early = client->Remove(key);
  if (before_ttl()) {
    EXPECT_EQ(early.code(), ErrorCode::OBJECT_HAS_LEASE) << early.ToString();
  }
  auto stat = client->Stat(key);
  ASSERT_TRUE(stat.ok());
  if (before_ttl()) {
    EXPECT_EQ(stat->read_locks, 1u);
  }
  auto removed_by_regex = client->RemoveByRegex("^leased/object$");
  ASSERT_TRUE(removed_by_regex.ok());
  if (before_ttl()) {
    EXPECT_EQ(*removed_by_regex, 0u) << "RemoveByRegex took a read-locked object";
  }
  // Readers share: another client still reads it meanwhile.
  auto got = client->Get(key);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_LT(testdata::FirstDifference(*got, value), 0);

  // force: gone for readers at once, but the dead reader's bytes are not handed out again yet.
  Status force = client->Remove(forced, true);
  EXPECT_TRUE(force.ok()) << force.ToString();
  EXPECT_EQ(client->Get(forced).code(), ErrorCode::OBJECT_NOT_FOUND);
  if (before_ttl()) {
    EXPECT_EQ(used(), used_both) << "a force-removed object's space was freed under a read lock";
  }

  // After the TTL, a plain Remove takes it, and all the space comes back.
  Status last;
  bool removed = WaitUntil(
      [&] {
        last = client->Remove(key);
        return last.ok();
      },
      Millis(7000), Millis(100));
  const auto removed_after = std::chrono::duration_cast<Millis>(SteadyClock::now() - locked_at);
  EXPECT_TRUE(removed) << "Remove still refused " << removed_after.count()
                       << " ms after the lock was taken: " << last.ToString();
  EXPECT_GE(removed_after.count(), 2500) << "the lease ended long before its TTL";
  EXPECT_EQ(client->Get(key).code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_TRUE(WaitUntil([&] { return used() == 0; }, Millis(3000), Millis(100)))
      << "space still used after the locks expired: " << used() << " bytes";
}

}  // namespace
}  // namespace granary::it
