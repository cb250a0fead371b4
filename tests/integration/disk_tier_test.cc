// The SSD tier end to end with real processes: a granary-node with --disk-dir offloads what the
// master's persistence policy picks from its segment to disk; the disk copies survive a master
// restart (the node registers them again) and a node restart on the same directory; memory
// eviction keeps objects that have a disk copy. Reads from disk are not served yet: a Get of a
// disk-only object is a clean miss, never wrong bytes.
#include <gtest/gtest.h>

#include <csignal>
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
  for (const auto& k : keys) {
    auto miss = client->Get(k);
    // Disk reads are not served yet: a miss, never wrong bytes.
    if (miss.ok()) {
      EXPECT_EQ(*miss, testdata::Pattern(k, miss->size())) << k;
    } else {
      EXPECT_EQ(miss.status().code(), ErrorCode::OBJECT_NOT_FOUND) << miss.status().ToString();
    }
  }

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

TEST_F(DiskTierTest, AnUnusableDiskDirStopsTheNodeWithAClearMessage) {
  ASSERT_TRUE(cluster_.Start(0, 0));
  NodeProcess node(UniqueName("baddisk"), 4 * MiB, logs_.path());
  auto started = node.Start(cluster_.master_address(), {"--disk-dir", "/nonexistent/granary"});
  EXPECT_FALSE(started) << "a node started on a missing disk directory";
  EXPECT_NE(node.AllLogs().find("/nonexistent/granary"), std::string::npos) << node.AllLogs();
}

}  // namespace
}  // namespace granary::it
