// The SSD tier end to end with real processes: a granary-node with --disk-dir offloads what the
// master's persistence policy picks from its segment to disk; the disk copies survive a master
// restart (the node registers them again) and a node restart on the same directory; memory
// eviction keeps objects that have a disk copy; a Get of a disk-only object loads it from the
// node's disk (DISK_READ), and a corrupted copy is a miss that the master forgets, never wrong
// bytes; a removed or replaced object's old copy is deleted and never comes back after a node
// restart. A disk-only object read --promote-after times comes back to memory. A put's own
// persistence (ReplicateConfig.persistence) overrides the master's, and a client's embedded node
// runs the same tier (ClientOptions.disk_dir).
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "../tools/test_pattern.h"
#include "store_fixture.h"
#include "transfer/shm_mapping.h"

namespace granary::it {
namespace {

using Bytes = std::vector<std::byte>;

// The value of the unlabelled or fully labelled sample `series` on a /metrics page; -1 if absent.
double SampleValue(const std::string& page, const std::string& series) {
  std::istringstream lines(page);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

class DiskTierTest : public StoreTest {
 protected:
  // A node with a disk tier in disk_dir_, offloading every 100 ms.
  ::testing::AssertionResult StartDiskNode(const std::string& name, uint64_t segment_size) {
    disk_node_ = std::make_unique<NodeProcess>(name, segment_size, logs_.path());
    return disk_node_->Start(cluster_.master_address(),
                             {"--disk-dir", disk_dir_.path(), "--disk-size", "256MiB",
                              "--offload-interval", "100ms"});
  }
  ::testing::AssertionResult RestartDiskNode() {
    disk_node_->Kill(SIGKILL);
    disk_node_->Wait(Millis(5000));
    return disk_node_->Start(cluster_.master_address(),
                             {"--disk-dir", disk_dir_.path(), "--disk-size", "256MiB",
                              "--offload-interval", "100ms"});
  }
  // The node's disk, as its pings report it, holds `objects` (bounded wait).
  bool WaitDiskObjects(Client& client, uint64_t objects, Millis timeout) {
    return WaitUntil(
        [&] {
          auto listed = client.ListSegments();
          return listed.ok() && listed->size() == 1 && (*listed)[0].disk_capacity > 0 &&
                 (*listed)[0].disk_objects == objects;
        },
        timeout, Millis(100));
  }
  // The restarted node registered its disk: `key`'s copy is attached to the new process.
  bool WaitRegistered(Client& client, const std::string& key, Millis timeout) {
    return WaitUntil(
        [&] {
          auto st = client.Stat(key);
          auto segments = client.ListSegments();
          return st.ok() && !st->disk_replicas.empty() && segments.ok() &&
                 segments->size() == 1 && st->disk_replicas[0].node_id == (*segments)[0].node_id;
        },
        timeout, Millis(100));
  }
  // Every key has a disk replica (bounded wait).
  bool WaitOnDisk(Client& client, const std::vector<std::string>& keys, Millis timeout) {
    return WaitUntil(
        [&] {
          for (const auto& k : keys) {
            auto st = client.Stat(k);
            if (!st.ok() || st->disk_replicas.empty()) return false;
          }
          return true;
        },
        timeout, Millis(100));
  }
  void TearDown() override {
    if (HasFailure() && disk_node_) ADD_FAILURE() << "disk node log:\n" << disk_node_->AllLogs();
    disk_node_.reset();
    StoreTest::TearDown();
  }

  TempDir disk_dir_{"granary-disk-it"};
  TempDir logs_{"granary-disk-logs"};
  std::unique_ptr<NodeProcess> disk_node_;
};

TEST_F(DiskTierTest, EagerOffloadSurvivesAMasterRestartAndANodeRestart) {
  // The restarted node must register before the killed process expires: the copies of objects
  // held only on disk go with that expiry, and the disk, known by then, may not bring back keys
  // the master no longer holds.
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "eager"}, {"--client-ttl", "10s"}}));
  const std::string name = UniqueName("disk");
  ASSERT_TRUE(StartDiskNode(name, 64 * MiB));
  ASSERT_TRUE(cluster_.WaitForSegments([&](const auto& n) { return n.size() == 1; }, Millis(5000)));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  std::vector<std::string> keys;
  for (int i = 0; i < 20; ++i) {
    keys.push_back("disk/" + std::to_string(i));
    const Bytes value = testdata::Pattern(keys.back(), (i + 1) * 37 * KiB);
    ASSERT_TRUE(client->Put(keys.back(), ByteSpan(value)).ok());
  }
  ASSERT_TRUE(WaitOnDisk(*client, keys, Millis(15'000))) << "not every object reached the disk";
  auto stat = client->Stat(keys[3]);
  ASSERT_TRUE(stat.ok());
  EXPECT_EQ(stat->replicas.size(), 1u) << "eager keeps the memory copy";
  EXPECT_EQ(stat->disk_replicas[0].length >= stat->size, true);
  auto got = client->Get(keys[3]);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, testdata::Pattern(keys[3], 4 * 37 * KiB));
  // The node's pings carry its disk tier's size and use (at the next heartbeat).
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto listed = client->ListSegments();
        return listed.ok() && listed->size() == 1 && (*listed)[0].disk_capacity == 256 * MiB &&
               (*listed)[0].disk_used > 0 && (*listed)[0].disk_objects == keys.size();
      },
      Millis(5000), Millis(100)));

  // The master restarts: memory contents are lost, the disk tier comes back by itself.
  ASSERT_TRUE(cluster_.RestartMaster());
  EXPECT_TRUE(WaitOnDisk(*client, keys, Millis(15'000)))
      << "the node did not register its disk copies with the restarted master";
  // Memory is empty now: every Get loads from the node's disk, one key and then a batch.
  const uint64_t loaded_before = client->Stats().disk_bytes_read;
  auto one = client->Get(keys[5]);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(*one, testdata::Pattern(keys[5], 6 * 37 * KiB));
  auto batch = client->BatchGet(keys);
  uint64_t total = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(batch[i].ok()) << keys[i] << ": " << batch[i].status().ToString();
    EXPECT_EQ(*batch[i], testdata::Pattern(keys[i], (i + 1) * 37 * KiB)) << keys[i];
    total += (i + 1) * 37 * KiB;
  }
  EXPECT_EQ(client->Stats().disk_bytes_read - loaded_before, total + 6 * 37 * KiB)
      << "the bytes did not come from the disk tier";

  // The node is killed and starts again on the same directory: its copies are recovered and
  // registered, which moves the disk's replicas to the new process.
  ASSERT_TRUE(disk_node_->Kill(SIGKILL));
  disk_node_->Wait(Millis(5000));
  ASSERT_TRUE(disk_node_->Start(cluster_.master_address(),
                                {"--disk-dir", disk_dir_.path(), "--disk-size", "256MiB",
                                 "--offload-interval", "100ms"}));
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto st = client->Stat(keys[0]);
        if (!st.ok() || st->disk_replicas.empty()) return false;
        auto segments = client->ListSegments();
        return segments.ok() && segments->size() == 1 &&
               st->disk_replicas[0].node_id == (*segments)[0].node_id;
      },
      Millis(15'000), Millis(200)))
      << "the restarted node's recovered copies are not registered";
  auto recovered = client->BatchExist(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(recovered[i].ok());
    EXPECT_TRUE(*recovered[i]) << keys[i] << " lost from disk";
  }
}

// Promotion (--promote-after 2): objects held only on the node's disk (the master restarted, so
// memory is empty and the node registered its disk) are loaded from disk; the one read twice
// gets a memory replica again, copied by the node from its disk, and later Gets read memory. The
// one read once stays on disk.
TEST_F(DiskTierTest, ADiskOnlyObjectReadPromoteAfterTimesComesBackToMemory) {
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "eager"}, {"--client-ttl", "10s"},
                                    {"--promote-after", "2"}}));
  ASSERT_TRUE(StartDiskNode(UniqueName("promote"), 64 * MiB));
  ASSERT_TRUE(cluster_.WaitForSegments([&](const auto& n) { return n.size() == 1; }, Millis(5000)));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const std::string hot = "promote/hot", cold = "promote/cold";
  const Bytes hot_value = testdata::Pattern(hot, 300 * KiB + 17);
  const Bytes cold_value = testdata::Pattern(cold, 200 * KiB);
  ASSERT_TRUE(client->Put(hot, ByteSpan(hot_value)).ok());
  ASSERT_TRUE(client->Put(cold, ByteSpan(cold_value)).ok());
  ASSERT_TRUE(WaitOnDisk(*client, {hot, cold}, Millis(15'000)));

  ASSERT_TRUE(cluster_.RestartMaster());
  ASSERT_TRUE(WaitOnDisk(*client, {hot, cold}, Millis(15'000)))
      << "the node did not register its disk copies with the restarted master";
  for (const auto& k : {hot, cold}) {
    auto st = client->Stat(k);
    ASSERT_TRUE(st.ok());
    ASSERT_TRUE(st->replicas.empty()) << k << " is in memory after a master restart";
  }
  // A promotion due while the segment takes no allocation would be refused and wait for two more
  // reads; a remount is fresh (no quarantine), so this pause is only slack.
  std::this_thread::sleep_for(Millis(1500));

  const uint64_t before = client->Stats().disk_bytes_read;
  for (int i = 0; i < 2; ++i) {
    auto got = client->Get(hot);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, hot_value);
  }
  auto got_cold = client->Get(cold);
  ASSERT_TRUE(got_cold.ok()) << got_cold.status().ToString();
  EXPECT_EQ(*got_cold, cold_value);
  EXPECT_EQ(client->Stats().disk_bytes_read - before, 2 * hot_value.size() + cold_value.size())
      << "the reads did not come from the disk tier";

  EXPECT_TRUE(WaitUntil(
      [&] {
        auto st = client->Stat(hot);
        return st.ok() && st->replicas.size() == 1;
      },
      Millis(10'000), Millis(100)))
      << "the object read twice from disk never got a memory replica";
  auto st = client->Stat(hot);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->disk_replicas.size(), 1u) << "the disk copy should stay";
  const uint64_t loaded = client->Stats().disk_bytes_read;
  for (int i = 0; i < 3; ++i) {
    auto got = client->Get(hot);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, hot_value) << "the promoted replica holds other bytes";
  }
  EXPECT_EQ(client->Stats().disk_bytes_read, loaded) << "Gets still load the promoted object from disk";
  auto cold_stat = client->Stat(cold);
  ASSERT_TRUE(cold_stat.ok());
  EXPECT_TRUE(cold_stat->replicas.empty()) << "an object read once was promoted";
}

TEST_F(DiskTierTest, LazyOffloadLetsEvictionKeepObjectsOnDisk) {
  // Memory of 8 MiB, offload above 30% of it, eviction above 60%: objects put past that are
  // copied to disk before eviction reaches them, and eviction then only frees their memory.
  ASSERT_TRUE(cluster_.Start(0, 0,
                             {{"--offload-watermark", "0.3"},
                              {"--eviction-high-watermark", "0.6"},
                              {"--eviction-ratio", "0.2"}}));
  ASSERT_TRUE(StartDiskNode(UniqueName("lazy"), 8 * MiB));
  ASSERT_TRUE(cluster_.WaitForSegments([&](const auto& n) { return n.size() == 1; }, Millis(5000)));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  std::vector<std::string> keys;
  for (int i = 0; i < 24; ++i) {
    keys.push_back("lazy/" + std::to_string(i));
    const Bytes value = testdata::Pattern(keys.back(), 512 * KiB);
    auto put = client->Put(keys.back(), ByteSpan(value));
    ASSERT_TRUE(put.ok()) << keys.back() << ": " << put.ToString();
    std::this_thread::sleep_for(Millis(100));  // lets the offload keep up, as a real node would
  }
  // 12 MiB went into 8 MiB of memory: eviction ran. Objects it reached kept their disk copy.
  size_t on_disk_only = 0, in_memory = 0, gone = 0;
  for (const auto& k : keys) {
    auto st = client->Stat(k);
    if (!st.ok()) {
      gone++;
      continue;
    }
    if (st->replicas.empty()) {
      EXPECT_FALSE(st->disk_replicas.empty()) << k << " has no replica at all";
      on_disk_only++;
      auto got = client->Get(k);  // loaded from disk
      ASSERT_TRUE(got.ok()) << k << ": " << got.status().ToString();
      EXPECT_EQ(*got, testdata::Pattern(k, 512 * KiB)) << k;
    } else {
      in_memory++;
      auto got = client->Get(k);
      ASSERT_TRUE(got.ok()) << k;
      EXPECT_EQ(*got, testdata::Pattern(k, 512 * KiB)) << k;
    }
  }
  EXPECT_GT(on_disk_only, 0u) << "eviction demoted nothing (in memory " << in_memory << ", gone "
                              << gone << ")";
  EXPECT_LT(gone, keys.size() / 2) << "eviction dropped most objects instead of demoting them";
}

// disk_tier.h: disk eviction tells the master before the files go. A 2 MiB disk budget and
// twelve 512 KiB objects offloaded eagerly: the node must evict from disk, and the master must
// stop naming the evicted copies (else it would list about twelve disk replicas).
TEST_F(DiskTierTest, DiskEvictionTellsTheMasterWhichCopiesAreGone) {
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "eager"}}));
  disk_node_ = std::make_unique<NodeProcess>(UniqueName("small"), 16 * MiB, logs_.path());
  const uint16_t http_port = PickFreePort();
  ASSERT_TRUE(disk_node_->Start(cluster_.master_address(),
                                {"--disk-dir", disk_dir_.path(), "--disk-size", "2MiB",
                                 "--disk-eviction", "fifo", "--offload-interval", "100ms",
                                 "--http-port", std::to_string(http_port)}));
  ASSERT_TRUE(cluster_.WaitForSegments([&](const auto& n) { return n.size() == 1; }, Millis(5000)));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  std::vector<std::string> keys;
  for (int i = 0; i < 12; ++i) {
    keys.push_back("small/" + std::to_string(i));
    const Bytes value = testdata::Pattern(keys.back(), 512 * KiB);
    ASSERT_TRUE(client->Put(keys.back(), ByteSpan(value)).ok());
    // One offload round at a time, so each round has to make room for the next.
    ASSERT_TRUE(WaitOnDisk(*client, {keys.back()}, Millis(10'000))) << keys.back();
  }
  size_t on_disk = 0;
  for (const auto& k : keys) {
    auto st = client->Stat(k);
    ASSERT_TRUE(st.ok()) << k << " lost: it still has its memory copy";
    on_disk += !st->disk_replicas.empty();
  }
  EXPECT_TRUE(client->Stat(keys.back())->disk_replicas.size() == 1) << "the newest copy was evicted";
  EXPECT_LE(on_disk, 4u) << "the master still names copies the node's disk evicted";
  EXPECT_GE(on_disk, 1u);

  // Both ends count it (issue 22): the node's offloads and evictions, the master's demotions.
  const HttpResult node_page = HttpGet(http_port, "/metrics");
  ASSERT_EQ(node_page.status, 200) << node_page.error;
  EXPECT_GE(SampleValue(node_page.body, "granary_node_offloaded_objects_total"), 12)
      << node_page.body;
  EXPECT_GE(SampleValue(node_page.body, "granary_node_offloaded_bytes_total"), 12 * 512 * KiB);
  EXPECT_GE(SampleValue(node_page.body, "granary_node_disk_evicted_objects_total"),
            static_cast<double>(keys.size() - on_disk));
  const HttpResult master_page = HttpGet(cluster_.master().http_port(), "/metrics");
  EXPECT_GE(SampleValue(master_page.body, "granary_master_demotions_total{outcome=\"completed\"}"),
            12)
      << master_page.body;
}

// Flips one byte of the value in the file-per-key records under `dir` whose key `pick` selects;
// returns the keys whose copies it corrupted (read from each record's
// header: key_len u32 at 0, key at 64).
std::set<std::string> CorruptRecords(const std::string& dir,
                                     const std::function<bool(const std::string&)>& pick) {
  std::set<std::string> corrupted;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".obj") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    uint32_t key_len = 0;
    f.read(reinterpret_cast<char*>(&key_len), sizeof(key_len));
    std::string key(std::min<uint32_t>(key_len, 4096), '\0');
    f.seekg(64);
    f.read(key.data(), static_cast<std::streamsize>(key.size()));
    if (!f.good() || !pick(key)) continue;
    f.seekg(4096 + 100);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(4096 + 100);
    f.write(&c, 1);
    if (f.good()) corrupted.insert(key);
  }
  return corrupted;
}

// A disk copy whose bytes changed under the node (bit rot, a stray write) is a miss, never wrong
// bytes; the node tells the master, which stops naming it; intact copies still load.
TEST_F(DiskTierTest, ACorruptedDiskCopyIsAMissAndTheMasterForgetsIt) {
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "eager"}, {"--client-ttl", "2s"}}));
  disk_node_ = std::make_unique<NodeProcess>(UniqueName("rot"), 16 * MiB, logs_.path());
  ASSERT_TRUE(disk_node_->Start(cluster_.master_address(),
                                {"--disk-dir", disk_dir_.path(), "--disk-size", "64MiB",
                                 "--disk-backend", "file-per-key", "--offload-interval", "100ms"}));
  ASSERT_TRUE(cluster_.WaitForSegments([&](const auto& n) { return n.size() == 1; }, Millis(5000)));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  std::vector<std::string> keys;
  for (int i = 0; i < 8; ++i) {
    keys.push_back("rot/" + std::to_string(i));
    const Bytes value = testdata::Pattern(keys.back(), 64 * KiB + i);
    ASSERT_TRUE(client->Put(keys.back(), ByteSpan(value)).ok());
  }
  ASSERT_TRUE(WaitOnDisk(*client, keys, Millis(15'000)));
  // A master restart leaves the disk copies as the only ones.
  ASSERT_TRUE(cluster_.RestartMaster());
  ASSERT_TRUE(WaitOnDisk(*client, keys, Millis(15'000)));
  const std::set<std::string> corrupted = CorruptRecords(
      disk_dir_.path(), [](const std::string& key) { return (key.back() - '0') % 2 == 0; });
  ASSERT_EQ(corrupted.size(), keys.size() / 2);

  auto got = client->BatchGet(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (corrupted.count(keys[i])) {
      EXPECT_FALSE(got[i].ok()) << keys[i] << ": a corrupted copy was returned";
    } else {
      ASSERT_TRUE(got[i].ok()) << keys[i] << ": " << got[i].status().ToString();
      EXPECT_EQ(*got[i], testdata::Pattern(keys[i], 64 * KiB + i)) << keys[i];
    }
  }
  for (const auto& k : corrupted) {
    EXPECT_TRUE(WaitUntil(
        [&] {
          auto st = client->Stat(k);
          return !st.ok() || st->disk_replicas.empty();
        },
        Millis(10'000), Millis(100)))
        << "the master still names the corrupted copy of " << k;
    auto again = client->Get(k);
    EXPECT_FALSE(again.ok());
  }
  EXPECT_TRUE(disk_node_->Running());
}

// An object with disk copies on two nodes: where the first copy the client tries is corrupted,
// the Get loads the other one; every key comes back right although each has one bad copy.
TEST_F(DiskTierTest, ACorruptedDiskCopyFallsBackToTheObjectsOtherDiskReplica) {
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "eager"}, {"--client-ttl", "10s"}}));
  TempDir second_dir{"granary-disk-it2"};
  const std::vector<std::string> flags_a = {"--disk-dir", disk_dir_.path(), "--disk-size", "64MiB",
                                            "--disk-backend", "file-per-key",
                                            "--offload-interval", "100ms"};
  std::vector<std::string> flags_b = flags_a;
  flags_b[1] = second_dir.path();
  disk_node_ = std::make_unique<NodeProcess>(UniqueName("twoa"), 16 * MiB, logs_.path());
  auto node_b = std::make_unique<NodeProcess>(UniqueName("twob"), 16 * MiB, logs_.path());
  ASSERT_TRUE(disk_node_->Start(cluster_.master_address(), flags_a));
  ASSERT_TRUE(node_b->Start(cluster_.master_address(), flags_b));
  ASSERT_TRUE(cluster_.WaitForSegments([&](const auto& n) { return n.size() == 2; }, Millis(5000)));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  ReplicateConfig two;
  two.replica_num = 2;
  std::vector<std::string> keys;
  for (int i = 0; i < 8; ++i) {
    keys.push_back("two/" + std::to_string(i));
    const Bytes value = testdata::Pattern(keys.back(), 64 * KiB + i);
    ASSERT_TRUE(client->Put(keys.back(), ByteSpan(value), two).ok());
  }
  auto on_both = [&] {
    for (const auto& k : keys) {
      auto st = client->Stat(k);
      if (!st.ok() || st->disk_replicas.size() != 2) return false;
    }
    return true;
  };
  ASSERT_TRUE(WaitUntil(on_both, Millis(15'000), Millis(100))) << "not on both disks";
  // A master restart leaves the disk copies as the only ones, both registered again.
  ASSERT_TRUE(cluster_.RestartMaster());
  ASSERT_TRUE(WaitUntil(on_both, Millis(15'000), Millis(100))) << "not registered again";
  // Node a's copies of the even keys and node b's of the odd ones go bad: each key keeps one
  // intact copy, and whichever node the client asks first, half its answers are misses.
  auto parity = [](int want) {
    return [want](const std::string& key) { return (key.back() - '0') % 2 == want; };
  };
  ASSERT_EQ(CorruptRecords(disk_dir_.path(), parity(0)).size(), keys.size() / 2);
  ASSERT_EQ(CorruptRecords(second_dir.path(), parity(1)).size(), keys.size() / 2);
  const uint64_t loaded = client->Stats().disk_bytes_read;
  auto got = client->BatchGet(keys);
  uint64_t total = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << keys[i] << ": " << got[i].status().ToString();
    EXPECT_EQ(*got[i], testdata::Pattern(keys[i], 64 * KiB + i)) << keys[i];
    total += 64 * KiB + i;
  }
  EXPECT_EQ(client->Stats().disk_bytes_read - loaded, total);
  // The bad copies the client met were reported: some key is down to its one intact copy.
  EXPECT_TRUE(WaitUntil(
      [&] {
        for (const auto& k : keys) {
          auto st = client->Stat(k);
          if (st.ok() && st->disk_replicas.size() == 1) return true;
        }
        return false;
      },
      Millis(10'000), Millis(100)))
      << "no corrupted copy was met, or none was reported";
  EXPECT_TRUE(disk_node_->Running());
  EXPECT_TRUE(node_b->Running());
  if (HasFailure()) ADD_FAILURE() << "second node log:\n" << node_b->AllLogs();
}

// Stale copies (docs/disk.md): a removed object's disk copy is deleted by its node within about
// an offload interval, and a node restarted on the same directory does not bring it back (even
// where the bucket backend's recovery finds the removed record again: the master refuses a key
// it does not hold from a disk it knows, and the node deletes it).
TEST_F(DiskTierTest, ARemovedObjectStaysRemovedAfterTheNodeRestarts) {
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "eager"}}));
  ASSERT_TRUE(StartDiskNode(UniqueName("removed"), 16 * MiB));
  ASSERT_TRUE(cluster_.WaitForSegments([&](const auto& n) { return n.size() == 1; }, Millis(5000)));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> keys = {"rm/gone", "rm/kept-1", "rm/kept-2"};
  for (const auto& k : keys) {
    const Bytes value = testdata::Pattern(k, 300 * KiB);
    ASSERT_TRUE(client->Put(k, ByteSpan(value)).ok());
  }
  ASSERT_TRUE(WaitOnDisk(*client, keys, Millis(15'000)));
  ASSERT_TRUE(WaitDiskObjects(*client, 3, Millis(5000)));

  ASSERT_TRUE(client->Remove(keys[0]).ok());
  EXPECT_TRUE(WaitDiskObjects(*client, 2, Millis(5000)))
      << "the node did not delete the removed object's copy";

  ASSERT_TRUE(RestartDiskNode());
  ASSERT_TRUE(WaitRegistered(*client, keys[1], Millis(15'000)));
  EXPECT_TRUE(WaitDiskObjects(*client, 2, Millis(5000)));
  auto got = client->Get(keys[0]);
  ASSERT_FALSE(got.ok()) << "a removed object is readable again";
  EXPECT_EQ(got.status().code(), ErrorCode::OBJECT_NOT_FOUND) << got.status().ToString();
  auto stat = client->Stat(keys[0]);
  EXPECT_EQ(stat.status().code(), ErrorCode::OBJECT_NOT_FOUND)
      << "a removed object is back" << (stat.ok() && !stat->disk_replicas.empty() ? " on disk" : "");
  auto kept = client->Stat(keys[2]);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->disk_replicas.size(), 1u);
}

// The same when the node cannot delete in time: it is stopped when the object is removed and
// killed before it runs again. Its restart registers the copy, the master refuses it (it is
// garbage of this disk) and the node deletes it then.
TEST_F(DiskTierTest, ACopyRemovedWhileTheNodeWasStoppedIsDeletedWhenItComesBack) {
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "eager"}}));
  ASSERT_TRUE(StartDiskNode(UniqueName("stopped"), 16 * MiB));
  ASSERT_TRUE(cluster_.WaitForSegments([&](const auto& n) { return n.size() == 1; }, Millis(5000)));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> keys = {"stop/gone", "stop/kept"};
  for (const auto& k : keys) {
    const Bytes value = testdata::Pattern(k, 200 * KiB);
    ASSERT_TRUE(client->Put(k, ByteSpan(value)).ok());
  }
  ASSERT_TRUE(WaitOnDisk(*client, keys, Millis(15'000)));
  ASSERT_TRUE(WaitDiskObjects(*client, 2, Millis(5000)));

  ASSERT_TRUE(disk_node_->Kill(SIGSTOP));
  ASSERT_TRUE(client->Remove(keys[0]).ok());
  ASSERT_TRUE(RestartDiskNode());  // SIGKILL ends the stopped process
  ASSERT_TRUE(WaitRegistered(*client, keys[1], Millis(15'000)));
  EXPECT_TRUE(WaitDiskObjects(*client, 1, Millis(5000)))
      << "the restarted node kept the removed object's copy";
  EXPECT_EQ(client->Stat(keys[0]).status().code(), ErrorCode::OBJECT_NOT_FOUND)
      << "a removed object came back from the disk of a restarted node";
  auto exist = client->BatchExist({keys[0]});
  ASSERT_TRUE(exist[0].ok());
  EXPECT_FALSE(*exist[0]);
}

// An upsert's new bytes held only in memory (lazy persistence, below the watermark): the old
// version's copy is deleted, so when the node dies with the new bytes its restart does not fall
// back to the old version on disk. The key is simply gone.
TEST_F(DiskTierTest, AnUpsertHeldOnlyInMemoryDoesNotFallBackToTheOldCopyAfterANodeRestart) {
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--offload-watermark", "0.3"}}));
  ASSERT_TRUE(StartDiskNode(UniqueName("upsert"), 8 * MiB));
  ASSERT_TRUE(cluster_.WaitForSegments([&](const auto& n) { return n.size() == 1; }, Millis(5000)));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const std::string key = "upsert/k";
  // v1: half the memory, above the watermark: offloaded.
  const Bytes v1 = testdata::Pattern("v1", 4 * MiB);
  ASSERT_TRUE(client->Put(key, ByteSpan(v1)).ok());
  ASSERT_TRUE(WaitOnDisk(*client, {key}, Millis(15'000)));
  ASSERT_TRUE(WaitDiskObjects(*client, 1, Millis(5000)));

  // v2: small, memory drops below the watermark: it stays in memory only.
  const Bytes v2 = testdata::Pattern("v2", 512 * KiB);
  ASSERT_TRUE(client->Upsert(key, ByteSpan(v2)).ok());
  EXPECT_TRUE(WaitDiskObjects(*client, 0, Millis(5000)))
      << "the replaced version's copy was not deleted";
  auto stat = client->Stat(key);
  ASSERT_TRUE(stat.ok());
  EXPECT_EQ(stat->size, v2.size());
  EXPECT_TRUE(stat->disk_replicas.empty()) << "v2 was offloaded: the test would prove nothing";
  auto got = client->Get(key);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, v2);

  // The node dies with v2; its successor takes the segment over (v2 is gone) and registers its
  // disk, which must not hold v1 any more (nor may the master accept it).
  ASSERT_TRUE(RestartDiskNode());
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto segments = client->ListSegments();
        return segments.ok() && segments->size() == 1 && (*segments)[0].disk_capacity > 0;
      },
      Millis(10'000), Millis(100)));
  EXPECT_TRUE(WaitDiskObjects(*client, 0, Millis(5000)));
  auto after = client->Stat(key);
  EXPECT_EQ(after.status().code(), ErrorCode::OBJECT_NOT_FOUND)
      << "the key fell back to its old version"
      << (after.ok() ? " of " + std::to_string(after->size) + " bytes" : "");
  EXPECT_EQ(client->Get(key).status().code(), ErrorCode::OBJECT_NOT_FOUND);
}

// The disk's id names its copies to the master across restarts: a damaged id file is an error at
// start, never a silently new disk (whose garbage would go to nobody).
TEST_F(DiskTierTest, ADamagedDiskIdFileStopsTheNode) {
  ASSERT_TRUE(cluster_.Start(0, 0));
  {
    std::ofstream id(disk_dir_.path() + "/DISK_ID");
    id << "granary-disk-id not-hex\n";
  }
  NodeProcess node(UniqueName("badid"), 4 * MiB, logs_.path());
  EXPECT_FALSE(node.Start(cluster_.master_address(), {"--disk-dir", disk_dir_.path()}))
      << "a node started with a damaged disk id";
  EXPECT_NE(node.AllLogs().find("DISK_ID"), std::string::npos) << node.AllLogs();
}

TEST_F(DiskTierTest, AnUnusableDiskDirStopsTheNodeWithAClearMessage) {
  ASSERT_TRUE(cluster_.Start(0, 0));
  NodeProcess node(UniqueName("baddisk"), 4 * MiB, logs_.path());
  auto started = node.Start(cluster_.master_address(), {"--disk-dir", "/nonexistent/granary"});
  EXPECT_FALSE(started) << "a node started on a missing disk directory";
  EXPECT_NE(node.AllLogs().find("/nonexistent/granary"), std::string::npos) << node.AllLogs();
}

// ReplicateConfig.persistence: under a master default of none, a put asking for eager reaches the
// disk, while one left at default (and one asking for none) never does.
TEST_F(DiskTierTest, APutAskingForEagerReachesTheDiskUnderAMasterDefaultOfNone) {
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "none"}}));
  ASSERT_TRUE(StartDiskNode(UniqueName("perput"), 16 * MiB));
  ASSERT_TRUE(cluster_.WaitForSegments([&](const auto& n) { return n.size() == 1; }, Millis(5000)));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const Bytes eager_value = testdata::Pattern("perput/eager", 200 * KiB);
  const Bytes plain_value = testdata::Pattern("perput/default", 200 * KiB);
  ReplicateConfig eager;
  eager.persistence = Persistence::kEager;
  ReplicateConfig none;
  none.persistence = Persistence::kNone;
  ASSERT_TRUE(client->Put("perput/default", ByteSpan(plain_value)).ok());
  ASSERT_TRUE(client->Put("perput/none", ByteSpan(plain_value), none).ok());
  ASSERT_TRUE(client->Put("perput/eager", ByteSpan(eager_value), eager).ok());
  ASSERT_TRUE(WaitOnDisk(*client, {"perput/eager"}, Millis(10'000)))
      << "the eager put never reached the disk under --persistence none";
  // Ten more offload rounds (100 ms each) pass: the others are still in memory only.
  std::this_thread::sleep_for(Millis(1000));
  for (const std::string key : {"perput/default", "perput/none"}) {
    auto st = client->Stat(key);
    ASSERT_TRUE(st.ok()) << key << ": " << st.status().ToString();
    EXPECT_TRUE(st->disk_replicas.empty()) << key << " was offloaded";
    EXPECT_EQ(st->replicas.size(), 1u);
  }
  EXPECT_TRUE(WaitDiskObjects(*client, 1, Millis(5000))) << "the disk holds other objects";
  // The eager object keeps its memory copy and reads back as it was written.
  auto got = client->Get("perput/eager");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, eager_value);
  // An upsert with its own config replaces the persistence too: default is none here, and the
  // old version's copy goes (it is garbage once replaced), so the disk ends up empty.
  const Bytes newer = testdata::Pattern("perput/eager-2", 100 * KiB);
  ASSERT_TRUE(client->Upsert("perput/eager", ByteSpan(newer)).ok());
  EXPECT_TRUE(WaitDiskObjects(*client, 0, Millis(10'000)))
      << "the replaced version's copy stayed, or the upsert inherited eager";
  std::this_thread::sleep_for(Millis(500));
  auto st = client->Stat("perput/eager");
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->disk_replicas.empty()) << "the upsert (default: none) was offloaded";
}

// A memory replica whose bytes went bad (here: overwritten in the node's shared memory) fails its
// checksum on both read paths; the Get then loads the object's disk copy instead of failing, and
// never returns the bad bytes.
TEST_F(DiskTierTest, AMemoryReplicaFailingItsChecksumIsServedFromTheDiskCopy) {
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "eager"}}));
  ASSERT_TRUE(StartDiskNode(UniqueName("fallback"), 16 * MiB));
  ASSERT_TRUE(cluster_.WaitForSegments([&](const auto& n) { return n.size() == 1; }, Millis(5000)));
  auto tcp = cluster_.MakeClient(false);
  auto shm = cluster_.MakeClient(true);
  ASSERT_NE(tcp, nullptr);
  ASSERT_NE(shm, nullptr);
  const Bytes value = testdata::Pattern("fallback/k", 300 * KiB);
  ASSERT_TRUE(tcp->Put("fallback/k", ByteSpan(value)).ok());
  ASSERT_TRUE(WaitOnDisk(*tcp, {"fallback/k"}, Millis(10'000)));
  auto st = tcp->Stat("fallback/k");
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->replicas.size(), 1u);
  {
    std::fstream f(disk_node_->ShmPath(), std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << disk_node_->ShmPath();
    f.seekp(static_cast<std::streamoff>(transfer::kShmHeaderBytes + st->replicas[0].offset + 4096));
    const char junk[16] = {'b', 'a', 'd', ' ', 'b', 'y', 't', 'e', 's', '!', '!', '!', '!', '!', '!', '!'};
    f.write(junk, sizeof junk);
    ASSERT_TRUE(f.good());
  }
  for (Client* c : {tcp.get(), shm.get()}) {
    const uint64_t loaded = c->Stats().disk_bytes_read;
    auto got = c->Get("fallback/k");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, value);
    EXPECT_EQ(c->Stats().disk_bytes_read - loaded, value.size()) << "not served from disk";
  }
  EXPECT_GT(shm->Stats().shm_mappings, 0u) << "the shm client did not take the memory path";
}

// ClientOptions.disk_dir: a client with an embedded node contributes memory and a disk tier; its
// objects are offloaded (master --persistence eager), survive a master restart on its disk, and
// another client reads them back from there.
TEST_F(DiskTierTest, AnEmbeddedNodesDiskTierServesAnotherClientAfterAMasterRestart) {
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "eager"}, {"--client-ttl", "10s"}}));
  ClientOptions options;
  options.segment_size = 16 * MiB;
  options.segment_name = UniqueName("embedded");
  options.disk_dir = disk_dir_.path();
  options.disk_size = 64 * MiB;
  options.offload_interval_ms = 100;
  auto owner = cluster_.MakeClient(false, options);
  ASSERT_NE(owner, nullptr);
  ASSERT_TRUE(cluster_.WaitForSegments([&](const auto& n) { return n.size() == 1; }, Millis(5000)));
  std::vector<std::string> keys;
  uint64_t total = 0;
  for (int i = 0; i < 8; ++i) {
    keys.push_back("embedded/" + std::to_string(i));
    const Bytes value = testdata::Pattern(keys.back(), (i + 1) * 53 * KiB);
    total += value.size();
    ASSERT_TRUE(owner->Put(keys.back(), ByteSpan(value)).ok());
  }
  ASSERT_TRUE(WaitOnDisk(*owner, keys, Millis(15'000))) << "the embedded node offloaded nothing";
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto listed = owner->ListSegments();
        return listed.ok() && listed->size() == 1 && (*listed)[0].disk_capacity == 64 * MiB &&
               (*listed)[0].disk_objects == keys.size();
      },
      Millis(5000), Millis(100)))
      << "the embedded node does not report its disk tier";
  EXPECT_TRUE(std::filesystem::exists(disk_dir_.File("DISK_ID")));

  // The master restarts: memory contents are gone, the embedded node registers its disk again.
  ASSERT_TRUE(cluster_.RestartMaster());
  auto reader = cluster_.MakeClient(false);
  ASSERT_NE(reader, nullptr);
  ASSERT_TRUE(WaitOnDisk(*reader, keys, Millis(15'000)))
      << "the embedded node did not register its disk copies with the restarted master";
  auto got = reader->BatchGet(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << keys[i] << ": " << got[i].status().ToString();
    EXPECT_EQ(*got[i], testdata::Pattern(keys[i], (i + 1) * 53 * KiB)) << keys[i];
  }
  EXPECT_EQ(reader->Stats().disk_bytes_read, total) << "the bytes did not come from the disk";
  // The embedded node runs the same tier, promotion included: a second read (once the segment is
  // remounted) brings keys[0] back into its memory.
  std::this_thread::sleep_for(Millis(1500));
  auto second = reader->Get(keys[0]);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto st = reader->Stat(keys[0]);
        return st.ok() && st->replicas.size() == 1;
      },
      Millis(10'000), Millis(100)))
      << "the embedded node did not promote an object read twice from its disk";
  const uint64_t loaded = reader->Stats().disk_bytes_read;
  auto third = reader->Get(keys[0]);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ(*third, testdata::Pattern(keys[0], 53 * KiB));
  EXPECT_EQ(reader->Stats().disk_bytes_read, loaded);
}

TEST_F(DiskTierTest, AnEmbeddedDiskTierWithBadSettingsFailsConnect) {
  ASSERT_TRUE(cluster_.Start(0, 0));
  auto connect = [&](ClientOptions o) {
    o.master_address = cluster_.master_address();
    auto c = Client::Connect(o);
    return c.ok() ? Status::Ok() : c.status();
  };
  ClientOptions no_segment;
  no_segment.disk_dir = disk_dir_.path();
  EXPECT_EQ(connect(no_segment).code(), ErrorCode::INVALID_PARAMS) << "a disk without memory";
  ClientOptions missing;
  missing.segment_size = 4 * MiB;
  missing.disk_dir = disk_dir_.File("no-such-dir");
  EXPECT_EQ(connect(missing).code(), ErrorCode::INVALID_PARAMS);
  ClientOptions bad_backend;
  bad_backend.segment_size = 4 * MiB;
  bad_backend.disk_dir = disk_dir_.path();
  bad_backend.disk_backend = "tape";
  Status s = connect(bad_backend);
  EXPECT_EQ(s.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(s.message().find("tape"), std::string::npos) << s.ToString();
  // Nothing half-started is left: the master lists no segment.
  auto segments = cluster_.ListSegmentNames();
  ASSERT_TRUE(segments.has_value());
  EXPECT_TRUE(segments->empty());
}

}  // namespace
}  // namespace granary::it
