// Same-host disk loads with real processes: a granary-node with a disk tier (and, by default, a
// shared-memory staging region) holds objects only on disk after a master restart; a client on
// this host gets them through the staging region (ClientStats.disk_bytes_read_shm), a client
// told not to use shared memory gets them over TCP (DISK_READ) as before, and a node started
// with --disk-shm-staging 0 serves even a same-host client over TCP. Every byte is checked.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "../tools/test_pattern.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

using Bytes = std::vector<std::byte>;

class SameHostLoadTest : public StoreTest {
 protected:
  // A node with a disk tier; objects put through it are on disk only once the master restarts.
  void PutThenForgetMemory(const std::vector<std::string>& extra_flags) {
    // --promote-after 0: the objects must stay disk-only while the test reads them repeatedly.
    ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "eager"}, {"--client-ttl", "10s"},
                                      {"--promote-after", "0"}}));
    std::vector<std::string> flags = {"--disk-dir", disk_dir_.path(), "--disk-size", "256MiB",
                                      "--offload-interval", "100ms"};
    flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
    node_ = std::make_unique<NodeProcess>(UniqueName("stage"), 64 * MiB, logs_.path());
    ASSERT_TRUE(node_->Start(cluster_.master_address(), flags));
    ASSERT_TRUE(cluster_.WaitForSegments([](const auto& n) { return n.size() == 1; },
                                         Millis(5000)));
    auto writer = cluster_.MakeClient(false);
    ASSERT_NE(writer, nullptr);
    for (int i = 0; i < 12; ++i) {
      keys_.push_back("stage/" + std::to_string(i));
      sizes_.push_back((i + 1) * 83 * KiB + i);  // odd sizes: the slot padding must not show
      total_ += sizes_.back();
      const Bytes value = testdata::Pattern(keys_.back(), sizes_.back());
      ASSERT_TRUE(writer->Put(keys_.back(), ByteSpan(value)).ok());
    }
    ASSERT_TRUE(WaitOnDisk(*writer, Millis(15'000))) << "not every object reached the disk";
    ASSERT_TRUE(cluster_.RestartMaster());
    ASSERT_TRUE(WaitOnDisk(*writer, Millis(15'000))) << "the node did not register its disk";
    for (const auto& k : keys_) {
      auto st = writer->Stat(k);
      ASSERT_TRUE(st.ok());
      ASSERT_TRUE(st->replicas.empty()) << k << " still has a memory replica";
    }
  }
  bool WaitOnDisk(Client& client, Millis timeout) {
    return WaitUntil(
        [&] {
          for (const auto& k : keys_) {
            auto st = client.Stat(k);
            if (!st.ok() || st->disk_replicas.empty()) return false;
          }
          return true;
        },
        timeout, Millis(100));
  }
  void GetAllAndCheck(Client& client) {
    auto got = client.BatchGet(keys_);
    for (size_t i = 0; i < keys_.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << keys_[i] << ": " << got[i].status().ToString();
      EXPECT_EQ(*got[i], testdata::Pattern(keys_[i], sizes_[i])) << keys_[i];
    }
    auto one = client.Get(keys_[4]);
    ASSERT_TRUE(one.ok()) << one.status().ToString();
    EXPECT_EQ(*one, testdata::Pattern(keys_[4], sizes_[4]));
  }
  void TearDown() override {
    if (HasFailure() && node_) ADD_FAILURE() << "disk node log:\n" << node_->AllLogs();
    node_.reset();
    StoreTest::TearDown();
  }

  TempDir disk_dir_{"granary-stage-it"};
  TempDir logs_{"granary-stage-logs"};
  std::unique_ptr<NodeProcess> node_;
  std::vector<std::string> keys_;
  std::vector<uint64_t> sizes_;
  uint64_t total_ = 0;
};

TEST_F(SameHostLoadTest, ASameHostClientLoadsThroughSharedMemoryAndATcpClientStillWorks) {
  PutThenForgetMemory({});
  EXPECT_TRUE(std::filesystem::exists(node_->ShmPath() + "-stage"))
      << "the node made no staging region";
  auto local = cluster_.MakeClient(true);
  ASSERT_NE(local, nullptr);
  GetAllAndCheck(*local);
  const uint64_t loaded = total_ + sizes_[4];
  EXPECT_EQ(local->Stats().disk_bytes_read, loaded);
  EXPECT_EQ(local->Stats().disk_bytes_read_shm, loaded) << "a same-host load went over TCP";
  EXPECT_EQ(local->Stats().tcp_bytes_read, 0u);

  auto remote = cluster_.MakeClient(false);  // as a client on another host would
  ASSERT_NE(remote, nullptr);
  GetAllAndCheck(*remote);
  EXPECT_EQ(remote->Stats().disk_bytes_read, loaded);
  EXPECT_EQ(remote->Stats().disk_bytes_read_shm, 0u);

  // Both again, interleaved from threads: slots are released, so nothing runs short.
  std::thread a([&] { GetAllAndCheck(*local); });
  std::thread b([&] { GetAllAndCheck(*remote); });
  a.join();
  b.join();
  EXPECT_EQ(local->Stats().disk_bytes_read_shm, 2 * loaded);
}

TEST_F(SameHostLoadTest, ANodeWithoutStagingServesSameHostClientsOverTcp) {
  PutThenForgetMemory({"--disk-shm-staging", "0"});
  EXPECT_FALSE(std::filesystem::exists(node_->ShmPath() + "-stage"));
  auto local = cluster_.MakeClient(true);
  ASSERT_NE(local, nullptr);
  GetAllAndCheck(*local);
  EXPECT_EQ(local->Stats().disk_bytes_read, total_ + sizes_[4]);
  EXPECT_EQ(local->Stats().disk_bytes_read_shm, 0u);
}

}  // namespace
}  // namespace granary::it
