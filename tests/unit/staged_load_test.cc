// client::ReplicaIo::ReadDisk against a real DataServer with a disk tier and a staging region:
// a same-host load goes through shared memory (disk_bytes_read_shm counts it), and everything
// the shared-memory path cannot serve (no region, an object larger than half of it, a client
// told not to use shared memory, a remote node) comes over TCP in the same call.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include "client/replica_io.h"
#include "client/segment_directory.h"
#include "common/checksum.h"
#include "disk_test_util.h"
#include "node/data_server.h"
#include "node/disk_read_service.h"
#include "node/shm_staging.h"
#include "transfer/shm_mapping.h"
#include "transfer/tcp_transport.h"

namespace granary {
namespace {

using disk::testing::TempDir;
using disk::testing::ValueFor;

class StagedLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    disk::DiskStoreOptions o;
    o.dir = dir_.path();
    o.disk_size = 64ull << 20;
    auto store = disk::DiskStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    // Small objects and one of 3 MiB, more than half of the 4 MiB region.
    for (size_t size : {size_t{1}, size_t{70000}, size_t{300000}, size_t{3} << 20, size_t{4096}}) {
      const std::string key = "k/" + std::to_string(values_.size());
      values_.push_back(ValueFor(key, 1, size));
      keys_.push_back(key);
    }
    std::vector<disk::ObjectWrite> writes;
    for (size_t i = 0; i < keys_.size(); ++i) {
      writes.push_back({keys_[i], 1, values_[i], Checksum(values_[i])});
    }
    for (auto& w : store_->Write(writes)) {
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      copies_.push_back(*w);
    }
    reads_ = std::make_unique<node::DiskReadService>(store_.get(), node::DiskReadServiceOptions{});
    server_ = std::make_unique<node::DataServer>(segment_.data(), segment_.size(), 1);
    server_->SetDiskReads(reads_.get());
  }
  void Start(bool with_region) {
    if (with_region) {
      static std::atomic<int> n{0};
      node::ShmStaging::Options so;
      so.bytes = 4 << 20;
      auto staging = node::ShmStaging::Create(
          "granary-test-sload-" + std::to_string(getpid()) + "-" + std::to_string(n++), so);
      ASSERT_TRUE(staging.ok()) << staging.status().ToString();
      staging_ = std::move(*staging);
      server_->SetShmStaging(staging_.get());
    }
    ASSERT_TRUE(server_->Start().ok());
    endpoint_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  // Loads every object through `io`; checks each one's bytes.
  void LoadAll(client::ReplicaIo& io, bool same_host) {
    std::vector<std::vector<std::byte>> bufs(keys_.size());
    std::vector<transfer::DiskReadItem> items;
    for (size_t i = 0; i < keys_.size(); ++i) {
      bufs[i].assign(values_[i].size(), std::byte{0});
      items.push_back({keys_[i], copies_[i].location, copies_[i].checksum, values_[i].size(),
                       {std::span<std::byte>(bufs[i])}});
    }
    std::vector<Status> got = io.ReadDisk(endpoint_, items, same_host);
    for (size_t i = 0; i < keys_.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << keys_[i] << ": " << got[i].ToString();
      EXPECT_EQ(bufs[i], values_[i]) << keys_[i];
    }
  }
  uint64_t Total(bool without_large) const {
    uint64_t t = 0;
    for (size_t i = 0; i < values_.size(); ++i) {
      if (!without_large || values_[i].size() < (2u << 20)) t += values_[i].size();
    }
    return t;
  }

  TempDir dir_;
  std::unique_ptr<disk::DiskStore> store_;
  std::vector<std::string> keys_;
  std::vector<std::vector<std::byte>> values_;
  std::vector<disk::StoredObject> copies_;
  std::vector<uint8_t> segment_ = std::vector<uint8_t>(4096);
  std::unique_ptr<node::ShmStaging> staging_;
  std::unique_ptr<node::DiskReadService> reads_;
  std::unique_ptr<node::DataServer> server_;
  std::string endpoint_;
  client::SegmentDirectory directory_{nullptr, "this-host", 1000};
  transfer::ShmMappingCache mappings_;
  transfer::TcpTransport tcp_;
};

TEST_F(StagedLoadTest, ASameHostLoadGoesThroughSharedMemory) {
  Start(/*with_region=*/true);
  client::ReplicaIo io(&directory_, &mappings_, &tcp_, /*use_shared_memory=*/true);
  LoadAll(io, /*same_host=*/true);
  const ClientStats s = io.Stats();
  EXPECT_EQ(s.disk_bytes_read, Total(false));
  // The 3 MiB object is over half the 4 MiB region: it alone came over TCP.
  EXPECT_EQ(s.disk_bytes_read_shm, Total(true));
  EXPECT_EQ(server_->stats().disk_bytes_staged, Total(true));
  EXPECT_EQ(server_->stats().disk_bytes_read, values_[3].size());
  EXPECT_EQ(staging_->stats().slots_in_use, 0u) << "the client left slots behind";
  EXPECT_EQ(staging_->stats().released, keys_.size() - 1);
}

TEST_F(StagedLoadTest, RemoteNodesAndClientsWithoutSharedMemoryLoadOverTcp) {
  Start(/*with_region=*/true);
  client::ReplicaIo io(&directory_, &mappings_, &tcp_, /*use_shared_memory=*/true);
  LoadAll(io, /*same_host=*/false);  // the directory says the node is elsewhere
  client::ReplicaIo tcp_only(&directory_, &mappings_, &tcp_, /*use_shared_memory=*/false);
  LoadAll(tcp_only, /*same_host=*/true);
  EXPECT_EQ(io.Stats().disk_bytes_read, Total(false));
  EXPECT_EQ(io.Stats().disk_bytes_read_shm, 0u);
  EXPECT_EQ(tcp_only.Stats().disk_bytes_read_shm, 0u);
  EXPECT_EQ(server_->stats().disk_bytes_staged, 0u);
  EXPECT_EQ(server_->stats().disk_bytes_read, 2 * Total(false));
}

TEST_F(StagedLoadTest, ANodeWithoutARegionIsLoadedOverTcp) {
  Start(/*with_region=*/false);
  client::ReplicaIo io(&directory_, &mappings_, &tcp_, /*use_shared_memory=*/true);
  LoadAll(io, /*same_host=*/true);
  LoadAll(io, /*same_host=*/true);  // the node's "no region" is remembered, still correct
  EXPECT_EQ(io.Stats().disk_bytes_read, 2 * Total(false));
  EXPECT_EQ(io.Stats().disk_bytes_read_shm, 0u);
}

}  // namespace
}  // namespace granary
