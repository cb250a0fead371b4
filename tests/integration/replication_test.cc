// Replica counts, re-replication and drains end to end (docs/operations.md): a real master and
// real nodes, readers checking every byte while replicas are added, dropped, lost to a kill -9,
// and moved off draining segments.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "../tools/test_pattern.h"
#include "store_fixture.h"
#include "transfer/shm_mapping.h"

namespace granary::it {
namespace {

using Bytes = std::vector<std::byte>;

struct Obj {
  std::string key;
  Bytes value;
};

std::vector<Obj> PutObjects(Client& client, const std::string& prefix, size_t count,
                            uint32_t replicas) {
  std::vector<Obj> out;
  ReplicateConfig config;
  config.replica_num = replicas;
  for (size_t i = 0; i < count; ++i) {
    Obj o{prefix + std::to_string(i), {}};
    o.value = testdata::Pattern(o.key, 16 * KiB + (i * 7919) % (200 * KiB));
    Status s = client.Put(o.key, ByteSpan(o.value.data(), o.value.size()), config);
    EXPECT_TRUE(s.ok()) << o.key << ": " << s.ToString();
    out.push_back(std::move(o));
  }
  return out;
}

// Readers that Get every object in a loop until stopped: every successful read must be exact;
// `must_read` objects must never fail.
class ReadLoad {
 public:
  ReadLoad(StoreCluster& cluster, const std::vector<Obj>& objects, bool must_read)
      : objects_(objects), must_read_(must_read) {
    for (bool shm : {false, true}) {
      threads_.emplace_back([this, &cluster, shm] {
        ClientOptions options;
        options.io_timeout_ms = 5000;
        auto client = cluster.MakeClient(shm, options);
        if (!client) return;
        while (!stop_.load()) {
          for (const auto& o : objects_) {
            if (stop_.load()) break;
            auto got = client->Get(o.key);
            reads_++;
            if (got.ok()) {
              if (testdata::FirstDifference(*got, o.value) >= 0) Report(&wrong_, "wrong bytes " + o.key);
            } else if (must_read_) {
              Report(&failed_, o.key + ": " + got.status().ToString());
            }
          }
        }
      });
    }
  }
  ~ReadLoad() { Stop(); }
  void Stop() {
    stop_ = true;
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  int wrong() const { return wrong_.load(); }
  int failed() const { return failed_.load(); }
  int reads() const { return reads_.load(); }
  std::vector<std::string> reports() {
    std::lock_guard lock(mu_);
    return reports_;
  }

 private:
  void Report(std::atomic<int>* counter, const std::string& what) {
    (*counter)++;
    std::lock_guard lock(mu_);
    if (reports_.size() < 10) reports_.push_back(what);
  }
  const std::vector<Obj>& objects_;
  const bool must_read_;
  std::atomic<bool> stop_{false};
  std::atomic<int> wrong_{0}, failed_{0}, reads_{0};
  std::mutex mu_;
  std::vector<std::string> reports_;
  std::vector<std::thread> threads_;
};

// Polls every object's replica count until `ok(count)` holds for all (bounded).
bool WaitForReplicas(Client& client, const std::vector<Obj>& objects,
                     const std::function<bool(size_t)>& ok, Millis timeout,
                     std::string* last = nullptr) {
  return WaitUntil(
      [&] {
        for (const auto& o : objects) {
          auto st = client.Stat(o.key);
          if (!st.ok() || !ok(st->replicas.size())) {
            if (last) {
              *last = o.key + ": " +
                      (st.ok() ? std::to_string(st->replicas.size()) + " replicas"
                               : st.status().ToString());
            }
            return false;
          }
        }
        return true;
      },
      timeout, Millis(100));
}

// Polls (10 s at most) until the segments hold exactly `named` extents, the replicas the
// objects name: no copy's allocation is left behind.
bool WaitForExtentsHeld(Client& client, uint64_t named, Millis poll, std::string* last) {
  return WaitUntil(
      [&] {
        auto segments = client.ListSegments();
        if (!segments.ok()) return false;
        uint64_t held = 0;
        for (const auto& s : *segments) held += s.replicas;
        *last = std::to_string(held) + " extents held, " + std::to_string(named) + " named";
        return held == named;
      },
      Millis(10'000), poll);
}

void ExpectAllExact(Client& client, const std::vector<Obj>& objects, const std::string& when) {
  for (const auto& o : objects) {
    auto got = client.Get(o.key);
    ASSERT_TRUE(got.ok()) << when << ": " << o.key << ": " << got.status().ToString();
    EXPECT_LT(testdata::FirstDifference(*got, o.value), 0) << when << ": wrong bytes " << o.key;
  }
}

// On distinct nodes: no two replicas of an object on one segment.
void ExpectDistinctSegments(Client& client, const std::vector<Obj>& objects) {
  for (const auto& o : objects) {
    auto st = client.Stat(o.key);
    ASSERT_TRUE(st.ok()) << o.key;
    std::set<std::string> segments;
    for (const auto& r : st->replicas) segments.insert(r.segment_name);
    EXPECT_EQ(segments.size(), st->replicas.size()) << o.key << " has two replicas on a segment";
  }
}

class ReplicationTest : public StoreTest {};

TEST_F(ReplicationTest, ReplicateUpAndDownUnderReadLoadNeverWrongBytes) {
  ASSERT_TRUE(cluster_.Start(3, 64 * MiB));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const std::vector<Obj> objects = PutObjects(*client, "rep/", 40, 1);
  ASSERT_FALSE(HasFailure());
  ReadLoad load(cluster_, objects, /*must_read=*/true);

  std::vector<std::string> keys;
  for (const auto& o : objects) keys.push_back(o.key);
  for (const Status& s : client->BatchReplicate(keys, 3)) ASSERT_TRUE(s.ok()) << s.ToString();
  auto st = client->Stat(objects[0].key);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->want_replicas, 3u);
  std::string last;
  EXPECT_TRUE(WaitForReplicas(*client, objects, [](size_t n) { return n == 3; }, Millis(30'000),
                              &last))
      << "not every object reached 3 replicas; e.g. " << last;
  ExpectDistinctSegments(*client, objects);

  // Down to 1 at once: the surplus goes in the same call.
  for (const Status& s : client->BatchReplicate(keys, 1)) ASSERT_TRUE(s.ok()) << s.ToString();
  for (const auto& o : objects) {
    auto after = client->Stat(o.key);
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(after->replicas.size(), 1u) << o.key;
  }
  std::this_thread::sleep_for(Millis(1500));  // readers go on over the dropped replicas' leases
  load.Stop();
  EXPECT_EQ(load.wrong(), 0);
  EXPECT_EQ(load.failed(), 0);
  for (const auto& r : load.reports()) ADD_FAILURE() << r;
  EXPECT_GT(load.reads(), 100);
  ExpectAllExact(*client, objects, "after replicate 3 then 1");

  // Hostile input: a count of 0 or past the maximum is refused, an unknown key is not found.
  EXPECT_EQ(client->BatchReplicate({objects[0].key}, 0)[0].code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(client->BatchReplicate({objects[0].key}, 65)[0].code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(client->BatchReplicate({"rep/none"}, 2)[0].code(), ErrorCode::OBJECT_NOT_FOUND);
}

TEST_F(ReplicationTest, KillNodeEveryObjectGetsItsSecondReplicaBack) {
  ASSERT_TRUE(cluster_.Start(3, 64 * MiB));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const std::vector<Obj> objects = PutObjects(*client, "kill2/", 60, 2);
  ASSERT_FALSE(HasFailure());
  const std::string victim = cluster_.node(0).name();
  size_t on_victim = 0;
  for (const auto& o : objects) {
    auto st = client->Stat(o.key);
    ASSERT_TRUE(st.ok());
    ASSERT_EQ(st->replicas.size(), 2u) << o.key;
    for (const auto& r : st->replicas) on_victim += r.segment_name == victim;
  }
  ASSERT_GT(on_victim, 10u) << "placement did not use the victim";
  ReadLoad load(cluster_, objects, /*must_read=*/true);
  std::this_thread::sleep_for(Millis(200));
  cluster_.KillNode(0);
  ASSERT_TRUE(cluster_.WaitForSegments(
      [&](const std::vector<std::string>& names) {
        return std::find(names.begin(), names.end(), victim) == names.end();
      },
      Millis(10'000)))
      << "the killed node was never expired";
  std::string last;
  // Client TTL (2 s), then copies at 200 MB/s: seconds.
  EXPECT_TRUE(WaitForReplicas(
      *client, objects,
      [](size_t n) { return n == 2; }, Millis(30'000), &last))
      << "objects did not get their second replica back; e.g. " << last;
  load.Stop();
  EXPECT_EQ(load.wrong(), 0);
  EXPECT_EQ(load.failed(), 0) << "an object with a surviving replica failed to read";
  for (const auto& r : load.reports()) ADD_FAILURE() << r;
  for (const auto& o : objects) {
    auto st = client->Stat(o.key);
    ASSERT_TRUE(st.ok());
    for (const auto& r : st->replicas) EXPECT_NE(r.segment_name, victim) << o.key;
  }
  ExpectDistinctSegments(*client, objects);
  ExpectAllExact(*client, objects, "after the kill");
}

TEST_F(ReplicationTest, DrainUnderLoadMovesEverythingThenUnmountsAndUndrainReadmits) {
  ASSERT_TRUE(cluster_.Start(3, 64 * MiB));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const std::vector<Obj> singles = PutObjects(*client, "drain/r1-", 60, 1);
  const std::vector<Obj> doubles = PutObjects(*client, "drain/r2-", 30, 2);
  ASSERT_FALSE(HasFailure());
  const std::string victim = cluster_.node(1).name();
  size_t only_on_victim = 0;
  for (const auto& o : singles) {
    auto st = client->Stat(o.key);
    ASSERT_TRUE(st.ok());
    only_on_victim += st->replicas.size() == 1 && st->replicas[0].segment_name == victim;
  }
  ASSERT_GT(only_on_victim, 5u) << "placement did not use the victim";

  std::vector<Obj> all = singles;
  all.insert(all.end(), doubles.begin(), doubles.end());
  ReadLoad load(cluster_, all, /*must_read=*/true);
  // Puts go on during the drain: none lands on the draining segment.
  std::atomic<bool> stop_puts{false};
  std::vector<Obj> later;
  std::mutex later_mu;
  std::thread putter([&] {
    auto writer = cluster_.MakeClient(false);
    if (!writer) return;
    for (int i = 0; i < 2000 && !stop_puts.load(); ++i) {
      Obj o{"drain/later-" + std::to_string(i), {}};
      o.value = testdata::Pattern(o.key, 8 * KiB + i);
      if (writer->Put(o.key, ByteSpan(o.value.data(), o.value.size())).ok()) {
        std::lock_guard lock(later_mu);
        later.push_back(std::move(o));
      }
      std::this_thread::sleep_for(Millis(20));
    }
  });

  ASSERT_TRUE(client->Drain(victim).ok());
  EXPECT_EQ(client->Drain(victim).code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  const bool unmounted = cluster_.WaitForSegments(
      [&](const std::vector<std::string>& names) {
        return std::find(names.begin(), names.end(), victim) == names.end();
      },
      Millis(30'000));
  stop_puts = true;
  putter.join();
  load.Stop();
  ASSERT_TRUE(unmounted) << "the drained segment was never unmounted";
  EXPECT_EQ(load.wrong(), 0);
  EXPECT_EQ(load.failed(), 0) << "an object failed to read during the drain";
  for (const auto& r : load.reports()) ADD_FAILURE() << r;
  ExpectAllExact(*client, all, "after the drain");
  {
    std::lock_guard lock(later_mu);
    EXPECT_GT(later.size(), 5u);
    ExpectAllExact(*client, later, "puts made during the drain");
  }
  for (const auto& o : doubles) {
    auto st = client->Stat(o.key);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->replicas.size(), 2u) << o.key;
  }

  // The drained node, still running, is refused its remount and asks again only every 10 s
  // (each attempt renews its memory), saying so once.
  std::this_thread::sleep_for(Millis(1500));
  const std::string log = cluster_.node(1).Log();
  size_t said = 0;
  for (size_t at = log.find("is drained;"); at != std::string::npos;
       at = log.find("is drained;", at + 1)) {
    said++;
  }
  EXPECT_EQ(said, 1u) << "the drained node's refusals are not throttled:\n" << log;

  // The drained node is killed: nothing is lost (it held nothing needed).
  cluster_.KillNode(1);
  std::this_thread::sleep_for(Millis(500));
  ExpectAllExact(*client, all, "after killing the drained node");

  // Its name is refused until undrained; then it mounts again.
  ASSERT_FALSE(cluster_.RestartNode(1)) << "a drained segment's name mounted again";
  ASSERT_TRUE(client->Undrain(victim).ok());
  EXPECT_EQ(client->Undrain(victim).code(), ErrorCode::SEGMENT_NOT_FOUND);
  ASSERT_TRUE(cluster_.RestartNode(1));
  EXPECT_TRUE(cluster_.WaitForAllNodesMounted(Millis(10'000)));
}

TEST_F(ReplicationTest, DrainDropUnmountsAtOnceAndUnknownSegmentIsRefused) {
  ASSERT_TRUE(cluster_.Start(2, 32 * MiB));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->Drain("no-such-segment").code(), ErrorCode::SEGMENT_NOT_FOUND);
  EXPECT_EQ(client->Undrain("no-such-segment").code(), ErrorCode::SEGMENT_NOT_FOUND);
  const std::string victim = cluster_.node(0).name();
  ASSERT_TRUE(client->Drain(victim, /*drop=*/true).ok());
  auto names = cluster_.ListSegmentNames();
  ASSERT_TRUE(names.has_value());
  EXPECT_EQ(std::count(names->begin(), names->end(), victim), 0);
}

// Copies under way when one of their sources is killed: each is made from the other source (or
// handed out again), and no allocation is left behind: every segment's replica count adds up to
// the replicas the objects name.
TEST_F(ReplicationTest, SourceKilledMidCopyCopyRetriedElsewhereAndNoSpaceLeaks) {
  // 5 MB/s: the ~10 MiB of copies below take about two seconds, so the kill lands among them.
  ASSERT_TRUE(cluster_.Start(4, 64 * MiB, {{"--rereplicate-mbps", "5"}}));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  ReplicateConfig two;
  two.replica_num = 2;
  std::vector<Obj> objects;
  for (int i = 0; i < 40; ++i) {
    Obj o{"midcopy/" + std::to_string(i), {}};
    o.value = testdata::Pattern(o.key, 256 * KiB + i);
    ASSERT_TRUE(client->Put(o.key, ByteSpan(o.value.data(), o.value.size()), two).ok());
    objects.push_back(std::move(o));
  }
  std::vector<std::string> keys;
  for (const auto& o : objects) keys.push_back(o.key);
  ReadLoad load(cluster_, objects, /*must_read=*/true);
  for (const Status& s : client->BatchReplicate(keys, 3)) ASSERT_TRUE(s.ok()) << s.ToString();
  std::this_thread::sleep_for(Millis(500));
  const std::string victim = cluster_.node(0).name();
  cluster_.KillNode(0);
  ASSERT_TRUE(cluster_.WaitForSegments(
      [&](const std::vector<std::string>& names) {
        return std::find(names.begin(), names.end(), victim) == names.end();
      },
      Millis(10'000)));
  std::string last;
  EXPECT_TRUE(WaitForReplicas(*client, objects, [](size_t n) { return n == 3; }, Millis(60'000),
                              &last))
      << "not every object got its 3 replicas on the 3 live nodes; e.g. " << last;
  load.Stop();
  EXPECT_EQ(load.wrong(), 0);
  EXPECT_EQ(load.failed(), 0);
  for (const auto& r : load.reports()) ADD_FAILURE() << r;
  ExpectDistinctSegments(*client, objects);
  ExpectAllExact(*client, objects, "after the copies");
  // No copy's allocation is left: the segments hold exactly the objects' replicas.
  uint64_t named = 0;
  for (const auto& o : objects) named += client->Stat(o.key)->replicas.size();
  EXPECT_TRUE(WaitForExtentsHeld(*client, named, Millis(200), &last)) << last;
}

// A copy source whose memory holds wrong bytes (flipped in its shared memory behind the store's
// back): the copying node checks the bytes against the object's checksum, takes the next source
// when there is one, and reports the copy not made when none is right. No replica is ever made
// of wrong bytes, and no read returns them.
TEST_F(ReplicationTest, WrongBytesAtACopySourceAreNeverCopied) {
  ASSERT_TRUE(cluster_.Start(3, 16 * MiB));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  std::vector<Obj> two = PutObjects(*client, "wrongsrc/two/", 6, 2);
  std::vector<Obj> one = PutObjects(*client, "wrongsrc/one/", 4, 1);
  auto shm_of = [&](const std::string& segment) -> std::string {
    for (size_t i = 0; i < cluster_.node_count(); ++i) {
      if (cluster_.node(i).name() == segment) return cluster_.node(i).ShmPath();
    }
    return "";
  };
  // Reads `length` bytes of a replica straight from its node's shared memory.
  auto read_replica = [&](const ReplicaInfo& r) {
    Bytes bytes(r.length);
    std::FILE* f = std::fopen(shm_of(r.segment_name).c_str(), "rb");
    if (f == nullptr) return Bytes{};
    std::fseek(f, static_cast<long>(transfer::kShmHeaderBytes + r.offset), SEEK_SET);
    const size_t got = std::fread(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    bytes.resize(got);
    return bytes;
  };
  // Flips the first 64 bytes of each object's first replica.
  std::map<std::string, std::pair<std::string, uint64_t>> corrupted;  // key -> segment, offset
  for (const auto* set : {&two, &one}) {
    for (const auto& o : *set) {
      auto st = client->Stat(o.key);
      ASSERT_TRUE(st.ok() && !st->replicas.empty()) << o.key;
      const ReplicaInfo& r = st->replicas[0];
      std::FILE* f = std::fopen(shm_of(r.segment_name).c_str(), "r+b");
      ASSERT_NE(f, nullptr) << r.segment_name;
      Bytes head = read_replica(r);
      head.resize(64);
      for (auto& b : head) b ^= std::byte{0xFF};
      std::fseek(f, static_cast<long>(transfer::kShmHeaderBytes + r.offset), SEEK_SET);
      ASSERT_EQ(std::fwrite(head.data(), 1, head.size(), f), head.size());
      std::fclose(f);
      ASSERT_GE(testdata::FirstDifference(read_replica(r), o.value), 0) << "not corrupted";
      corrupted[o.key] = {r.segment_name, r.offset};
    }
  }
  std::vector<std::string> two_keys, one_keys;
  for (const auto& o : two) two_keys.push_back(o.key);
  for (const auto& o : one) one_keys.push_back(o.key);
  for (const Status& s : client->BatchReplicate(two_keys, 3)) ASSERT_TRUE(s.ok()) << s.ToString();
  for (const Status& s : client->BatchReplicate(one_keys, 2)) ASSERT_TRUE(s.ok()) << s.ToString();
  std::string last;
  EXPECT_TRUE(WaitForReplicas(*client, two, [](size_t n) { return n == 3; }, Millis(30'000),
                              &last))
      << "objects with one right source did not get their third replica; e.g. " << last;
  // Every replica but the corrupted one holds the object's exact bytes: the copy came from the
  // right source.
  for (const auto& o : two) {
    auto st = client->Stat(o.key);
    ASSERT_TRUE(st.ok()) << o.key;
    for (const auto& r : st->replicas) {
      if (std::make_pair(r.segment_name, r.offset) == corrupted[o.key]) continue;
      EXPECT_LT(testdata::FirstDifference(read_replica(r), o.value), 0)
          << o.key << ": the replica on " << r.segment_name << " holds wrong bytes";
    }
  }
  // Objects whose only source is wrong get no second replica however often it is tried (the
  // master hands them out again every two seconds), and the copying nodes say why.
  std::this_thread::sleep_for(Millis(5000));
  for (const auto& o : one) {
    auto st = client->Stat(o.key);
    ASSERT_TRUE(st.ok()) << o.key;
    EXPECT_EQ(st->replicas.size(), 1u) << o.key << " was copied from wrong bytes";
    EXPECT_EQ(st->want_replicas, 2u);
  }
  std::string logs;
  for (size_t i = 0; i < cluster_.node_count(); ++i) logs += cluster_.node(i).Log();
  EXPECT_NE(logs.find("for re-replication: CHECKSUM_MISMATCH"), std::string::npos)
      << "no node reported the wrong source";
  // No read returns the wrong bytes: an object whose only replica is wrong fails.
  for (const auto* set : {&two, &one}) {
    for (const auto& o : *set) {
      auto got = client->Get(o.key);
      if (got.ok()) {
        EXPECT_LT(testdata::FirstDifference(*got, o.value), 0) << "wrong bytes read: " << o.key;
      }
    }
  }
  for (const auto& o : one) EXPECT_FALSE(client->Get(o.key).ok()) << o.key;
  // The failed copies' space went back: the segments hold what the objects name, between rounds.
  uint64_t named = 0;
  for (const auto* set : {&two, &one}) {
    for (const auto& o : *set) {
      if (auto st = client->Stat(o.key); st.ok()) named += st->replicas.size();
    }
  }
  EXPECT_TRUE(WaitForExtentsHeld(*client, named, Millis(50), &last)) << last;
}

// A rolling restart of every node, one at a time with a drain: no object that had two
// replicas is lost, and every read is exact.
TEST_F(ReplicationTest, RollingRestartWithDrainLosesNothingReplicated) {
  ASSERT_TRUE(cluster_.Start(3, 64 * MiB));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const std::vector<Obj> objects = PutObjects(*client, "roll/", 40, 2);
  ASSERT_FALSE(HasFailure());
  ReadLoad load(cluster_, objects, /*must_read=*/true);
  for (size_t i = 0; i < cluster_.node_count(); ++i) {
    const std::string name = cluster_.node(i).name();
    ASSERT_TRUE(client->Drain(name).ok()) << name;
    ASSERT_TRUE(cluster_.WaitForSegments(
        [&](const std::vector<std::string>& names) {
          return std::find(names.begin(), names.end(), name) == names.end();
        },
        Millis(30'000)))
        << name << " never finished draining";
    cluster_.KillNode(i);
    ASSERT_TRUE(client->Undrain(name).ok());
    ASSERT_TRUE(cluster_.RestartNode(i)) << name;
    ASSERT_TRUE(cluster_.WaitForAllNodesMounted(Millis(10'000)));
    ExpectAllExact(*client, objects, "after restarting " + name);
  }
  load.Stop();
  EXPECT_EQ(load.wrong(), 0);
  EXPECT_EQ(load.failed(), 0);
  for (const auto& r : load.reports()) ADD_FAILURE() << r;
}

}  // namespace
}  // namespace granary::it
