// Tests of client::ReplicaIo's shared-memory path against real segments (node::ShmSegment) and no
// master: the directory is told about the segments directly (SegmentDirectory::Learn). The TCP
// fallback points at a port nothing listens on, so any byte that does not go through shared
// memory fails the call.
#include "client/replica_io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "client/segment_directory.h"
#include "node/shm_segment.h"
#include "transfer/shm_mapping.h"
#include "transfer/tcp_transport.h"

namespace granary {
namespace {

constexpr uint64_t kSegSize = uint64_t{1} << 20;

std::string UniqueName(const std::string& tag) {
  static std::atomic<int> counter{0};
  return "granary-riotest-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" +
         tag;
}

proto::Replica MakeReplica(uint64_t segment_id, uint64_t token, uint64_t offset,
                           uint64_t length) {
  proto::Replica r;
  r.set_segment_id(segment_id);
  r.set_segment_name("seg");
  r.set_endpoint("127.0.0.1:1");  // nothing listens: TCP fallback fails fast
  r.set_token(token);
  r.set_offset(offset);
  r.set_length(length);
  return r;
}

class ReplicaIoTest : public ::testing::Test {
 protected:
  ReplicaIoTest()
      : directory_(nullptr, "this-host", 1000),
        tcp_(TcpOptions()),
        io_(&directory_, &mappings_, &tcp_, /*use_shared_memory=*/true) {}

  static transfer::TcpTransport::Options TcpOptions() {
    transfer::TcpTransport::Options o;
    o.connect_timeout_ms = 500;
    o.io_timeout_ms = 1000;
    return o;
  }
  std::unique_ptr<node::ShmSegment> Segment(const std::string& name, uint64_t token) {
    auto seg = node::ShmSegment::Create(name, kSegSize);
    EXPECT_TRUE(seg.ok()) << seg.status().ToString();
    if (!seg.ok()) return nullptr;
    (*seg)->PublishToken(token);
    return std::move(*seg);
  }

  client::SegmentDirectory directory_;
  transfer::ShmMappingCache mappings_;
  transfer::TcpTransport tcp_;
  client::ReplicaIo io_;
};

// Issue 13: "a thread holding an old replica can attach to a restarted node's new segment". The
// node restarts under the same segment name (new file, new token) and a current replica makes
// this client map the new file; a write through a replica of the old process must not land in
// it, and a read through one must not return its bytes.
TEST_F(ReplicaIoTest, OldReplicaNeverMovesBytesInARestartedNodesSegment) {
  const std::string name = UniqueName("restart");
  constexpr uint64_t kOldToken = 0x1001, kNewToken = 0x2001;
  auto old_seg = Segment(name, kOldToken);
  ASSERT_NE(old_seg, nullptr);
  directory_.Learn(1, {name, kSegSize, kOldToken});
  const std::vector<std::byte> first(4096, std::byte{0x11});
  const proto::Replica old_replica = MakeReplica(1, kOldToken, 0, first.size());
  ASSERT_TRUE(io_.Write(old_replica, {ByteSpan(first)}).ok());
  EXPECT_EQ(std::memcmp(old_seg->data(), first.data(), first.size()), 0);

  // The node restarts under the same name: the old file is unlinked, a new one made.
  old_seg.reset();
  auto new_seg = Segment(name, kNewToken);
  ASSERT_NE(new_seg, nullptr);
  directory_.Learn(2, {name, kSegSize, kNewToken});
  const std::vector<std::byte> current(4096, std::byte{0x22});
  const proto::Replica new_replica = MakeReplica(2, kNewToken, 0, current.size());
  ASSERT_TRUE(io_.Write(new_replica, {ByteSpan(current)}).ok()) << "the new segment is mapped";
  EXPECT_EQ(std::memcmp(new_seg->data(), current.data(), current.size()), 0);

  // A thread still holding the old replica (same name, same offset, the old token).
  const std::vector<std::byte> late(4096, std::byte{0x33});
  Status s = io_.Write(old_replica, {ByteSpan(late)});
  EXPECT_FALSE(s.ok()) << "a stale replica's write was accepted";
  EXPECT_EQ(std::memcmp(new_seg->data(), current.data(), current.size()), 0)
      << "a stale replica's write landed in the restarted node's segment";
  std::vector<std::byte> out(4096);
  auto read = io_.Read(old_replica, {MutableByteSpan(out)});
  EXPECT_FALSE(read.ok()) << "a stale replica read the restarted node's segment";
  EXPECT_EQ(io_.Stats().shm_bytes_read, 0u);
}

// A remount in place (same file, new token in its header): replicas of the previous mount are
// refused before any copy, the current mount's work.
TEST_F(ReplicaIoTest, ReplicaOfAPreviousMountIsRefusedAfterARemount) {
  const std::string name = UniqueName("remount");
  auto seg = Segment(name, 0xA1);
  ASSERT_NE(seg, nullptr);
  directory_.Learn(7, {name, kSegSize, 0xA1});
  const std::vector<std::byte> bytes(1000, std::byte{0x44});
  ASSERT_TRUE(io_.Write(MakeReplica(7, 0xA1, 500, bytes.size()), {ByteSpan(bytes)}).ok());
  seg->PublishToken(0xA2);  // the node remounted: the master may hand this space out again
  const std::vector<std::byte> late(1000, std::byte{0x55});
  EXPECT_FALSE(io_.Write(MakeReplica(7, 0xA1, 500, late.size()), {ByteSpan(late)}).ok());
  EXPECT_EQ(std::memcmp(seg->data() + 500, bytes.data(), bytes.size()), 0);
  std::vector<std::byte> out(1000);
  EXPECT_FALSE(io_.Read(MakeReplica(7, 0xA1, 500, out.size()), {MutableByteSpan(out)}).ok());
  auto now = io_.Read(MakeReplica(7, 0xA2, 500, out.size()), {MutableByteSpan(out)});
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  EXPECT_EQ(out, bytes);
  EXPECT_EQ(io_.Stats().shm_mappings, 1u);
}

// A remount as a node does it (ShmSegment::Renew: a new file under the same name, the old one
// retired): the client's cached mapping of the retired file is dropped and the new file mapped at
// the first copy of the new mount; a replica of the previous mount moves nothing in either.
TEST_F(ReplicaIoTest, RenewedSegmentIsMappedAfreshAndTheRetiredMappingDropped) {
  const std::string name = UniqueName("renew");
  auto seg = Segment(name, 0xB1);
  ASSERT_NE(seg, nullptr);
  directory_.Learn(9, {name, kSegSize, 0xB1});
  const std::vector<std::byte> bytes(1000, std::byte{0x44});
  ASSERT_TRUE(io_.Write(MakeReplica(9, 0xB1, 500, bytes.size()), {ByteSpan(bytes)}).ok());
  EXPECT_EQ(io_.Stats().shm_mappings, 1u);

  auto renewed = seg->Renew();
  ASSERT_TRUE(renewed.ok()) << renewed.status().ToString();
  std::unique_ptr<node::ShmSegment> next = std::move(*renewed);
  next->PublishToken(0xB2);
  directory_.Learn(9, {name, kSegSize, 0xB2});
  const std::vector<std::byte> late(1000, std::byte{0x55});
  EXPECT_FALSE(io_.Write(MakeReplica(9, 0xB1, 500, late.size()), {ByteSpan(late)}).ok());
  const std::vector<std::byte> current(1000, std::byte{0x66});
  ASSERT_TRUE(io_.Write(MakeReplica(9, 0xB2, 500, current.size()), {ByteSpan(current)}).ok())
      << "the renewed file was not mapped";
  EXPECT_EQ(std::memcmp(next->data() + 500, current.data(), current.size()), 0);
  EXPECT_EQ(io_.Stats().shm_mappings, 1u) << "the retired file's mapping was kept";
  std::vector<std::byte> out(1000);
  EXPECT_FALSE(io_.Read(MakeReplica(9, 0xB1, 500, out.size()), {MutableByteSpan(out)}).ok());
  auto now = io_.Read(MakeReplica(9, 0xB2, 500, out.size()), {MutableByteSpan(out)});
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  EXPECT_EQ(out, current);
}

}  // namespace
}  // namespace granary
