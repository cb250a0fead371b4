// The SSD tier end to end with real processes: a granary-node with --disk-dir offloads what the
// master's persistence policy picks from its segment to disk; the disk copies survive a master
// restart (the node registers them again) and a node restart on the same directory; memory
// eviction keeps objects that have a disk copy; a Get of a disk-only object loads it from the
// node's disk (DISK_READ), and a corrupted copy is a miss that the master forgets, never wrong
// bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "../tools/test_pattern.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

using Bytes = std::vector<std::byte>;

class DiskTierTest : public StoreTest {
 protected:
  // A node with a disk tier in disk_dir_, offloading every 100 ms.
  ::testing::AssertionResult StartDiskNode(const std::string& name, uint64_t segment_size) {
    disk_node_ = std::make_unique<NodeProcess>(name, segment_size, logs_.path());
    return disk_node_->Start(cluster_.master_address(),
                             {"--disk-dir", disk_dir_.path(), "--disk-size", "256MiB",
                              "--offload-interval", "100ms"});
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
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "eager"}, {"--client-ttl", "2s"}}));
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
  // registered under the new process (the old one's replicas went with its expiry).
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
  ASSERT_TRUE(disk_node_->Start(cluster_.master_address(),
                                {"--disk-dir", disk_dir_.path(), "--disk-size", "2MiB",
                                 "--disk-eviction", "fifo", "--offload-interval", "100ms"}));
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
}

// Flips one byte of the value in every other file-per-key record under `dir`; returns the keys
// whose copies it corrupted (read from each record's header: key_len u32 at 0, key at 64).
std::set<std::string> CorruptEveryOtherRecord(const std::string& dir) {
  std::set<std::string> corrupted;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".obj") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (size_t i = 0; i < files.size(); i += 2) {
    std::fstream f(files[i], std::ios::in | std::ios::out | std::ios::binary);
    uint32_t key_len = 0;
    f.read(reinterpret_cast<char*>(&key_len), sizeof(key_len));
    std::string key(key_len, '\0');
    f.seekg(64);
    f.read(key.data(), key_len);
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
  const std::set<std::string> corrupted = CorruptEveryOtherRecord(disk_dir_.path());
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

TEST_F(DiskTierTest, AnUnusableDiskDirStopsTheNodeWithAClearMessage) {
  ASSERT_TRUE(cluster_.Start(0, 0));
  NodeProcess node(UniqueName("baddisk"), 4 * MiB, logs_.path());
  auto started = node.Start(cluster_.master_address(), {"--disk-dir", "/nonexistent/granary"});
  EXPECT_FALSE(started) << "a node started on a missing disk directory";
  EXPECT_NE(node.AllLogs().find("/nonexistent/granary"), std::string::npos) << node.AllLogs();
}

}  // namespace
}  // namespace granary::it
