// Integration tests of the master's timeouts and of its own life: dead nodes, dead writers, dead
// readers, restart and clean shutdown. TTLs are shortened by flags so the waits stay short.
#include <gtest/gtest.h>

#include <csignal>
#include <thread>

#include "master_fixture.h"

namespace granary::it {
namespace {

using std::chrono::steady_clock;

int64_t MsSince(steady_clock::time_point t) {
  return std::chrono::duration_cast<Millis>(steady_clock::now() - t).count();
}

class MasterLivenessTest : public MasterTest {};

TEST_F(MasterLivenessTest, PingOfAnUnknownClientAsksForARemount) {
  ASSERT_TRUE(StartMaster());
  MasterClient x = Client("node-x");
  auto first = x.Ping();
  EXPECT_EQ(first.code(), code::kOk);
  EXPECT_EQ(first.status(), pb::PingResponse::NEED_REMOUNT);
  auto second = x.Ping();
  EXPECT_EQ(second.code(), code::kOk);
  EXPECT_EQ(second.status(), pb::PingResponse::OK);

  // A node that mounted is known.
  MasterClient y = Client("node-y");
  auto mounted = y.Mount("seg-y", 1 * MiB);
  ASSERT_EQ(mounted.code(), code::kOk);
  auto ping = y.Ping();
  EXPECT_EQ(ping.status(), pb::PingResponse::OK);
  EXPECT_EQ(ping.view_version(), mounted.view_version());
}

TEST_F(MasterLivenessTest, SilentNodeIsDeclaredDeadAndItsObjectsGo) {
  ASSERT_TRUE(StartMaster({"--client-ttl", "1s"}));
  MasterClient dead = Client("node-dead");
  MasterClient alive = Client("node-alive");
  MasterClient w = Client("client-w");

  const auto mounted_at = steady_clock::now();
  ASSERT_EQ(dead.Mount("seg-dead", 1 * MiB).code(), code::kOk);
  alive.Ping();
  ASSERT_EQ(w.Put("k", 64 * KiB, 11), code::kOk);
  auto before = w.GetOne("k");
  ASSERT_EQ(before.code(), code::kOk);
  ASSERT_EQ(before.replicas(0).segment_name(), "seg-dead");
  ASSERT_EQ(w.FinishReadOne("k"), code::kOk);

  // Not before its TTL.
  std::this_thread::sleep_for(Millis(400));
  alive.Ping();
  EXPECT_TRUE(w.FindSegment("seg-dead", nullptr)) << "declared dead after 400 ms of a 1 s TTL";

  // The live node keeps pinging while the dead one stays silent.
  bool gone = WaitUntil(
      [&] {
        alive.Ping();
        return !w.FindSegment("seg-dead", nullptr);
      },
      Millis(6000), Millis(100));
  ASSERT_TRUE(gone) << "the segment of a node silent for its TTL is still mounted";
  EXPECT_GE(MsSince(mounted_at), 900) << "declared dead before its TTL";

  EXPECT_EQ(w.GetOne("k").code(), code::kObjectNotFound);
  EXPECT_EQ(w.ExistOne("k"), 0);
  EXPECT_EQ(w.GetSize({"k"}), std::vector<int64_t>{code::kObjectNotFound});
  // No segment left at all: no space.
  EXPECT_EQ(w.PutStartOne("k", 64 * KiB).code(), code::kNoAvailableHandle);

  // Another node brings space: the key can be put again.
  ASSERT_EQ(alive.Mount("seg-alive", 1 * MiB).code(), code::kOk);
  ASSERT_EQ(w.Put("k", 64 * KiB, 22), code::kOk);
  auto after = w.GetOne("k");
  ASSERT_EQ(after.code(), code::kOk);
  EXPECT_EQ(after.checksum(), 22u);
  ASSERT_EQ(after.replicas_size(), 1);
  EXPECT_EQ(after.replicas(0).segment_name(), "seg-alive");

  // The dead node comes back: told to remount, and it can.
  EXPECT_EQ(dead.Ping().status(), pb::PingResponse::NEED_REMOUNT);
  pb::SegmentSpec spec;
  spec.set_name("seg-dead");
  spec.set_size(1 * MiB);
  spec.set_endpoint("127.0.0.1:1");
  auto remount = dead.ReMount({spec});
  ASSERT_EQ(remount.results_size(), 1);
  EXPECT_EQ(remount.results(0).code(), code::kOk) << remount.results(0).message();
  EXPECT_TRUE(w.FindSegment("seg-dead", nullptr));
  EXPECT_TRUE(w.FindSegment("seg-alive", nullptr)) << "the pinging node was expired";
}

TEST_F(MasterLivenessTest, WriterThatDiesBetweenPutStartAndPutEnd) {
  ASSERT_TRUE(StartMaster(
      {"--put-discard-timeout", "1s", "--put-release-timeout", "2s", "--client-ttl", "30s"}));
  MasterClient node = Client("node-a");
  ASSERT_EQ(node.Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient dead = Client("client-dead");
  MasterClient other = Client("client-other");

  const auto started_at = steady_clock::now();
  ASSERT_EQ(dead.PutStartOne("k", 64 * KiB).code(), code::kOk);
  ASSERT_EQ(dead.PutStartOne("abandoned", 64 * KiB).code(), code::kOk);
  // ... and the writer never ends them.

  EXPECT_EQ(other.GetOne("k").code(), code::kReplicaIsNotReady);
  EXPECT_EQ(other.PutStartOne("k", 64 * KiB).code(), code::kObjectAlreadyExists)
      << "taken over before the discard timeout";
  pb::SegmentInfo seg;
  ASSERT_TRUE(node.FindSegment("seg-a", &seg));
  EXPECT_EQ(seg.used_bytes(), 128 * KiB);

  // After the discard timeout another client may put the key.
  bool taken = WaitUntil([&] { return other.PutStartOne("k", 64 * KiB).code() == code::kOk; },
                         Millis(5000), Millis(100));
  ASSERT_TRUE(taken) << "the key of a dead writer never became writable again";
  EXPECT_GE(MsSince(started_at), 900) << "taken over before the 1 s discard timeout";
  EXPECT_EQ(other.PutEndOne("k", 77), code::kOk);
  auto got = other.GetOne("k");
  ASSERT_EQ(got.code(), code::kOk);
  EXPECT_EQ(got.checksum(), 77u);
  ASSERT_EQ(other.FinishReadOne("k"), code::kOk);

  // The zombie writer wakes up: it can no longer end what is not its put.
  EXPECT_NE(dead.PutEndOne("k", 1), code::kOk);
  EXPECT_EQ(other.GetOne("k").checksum(), 77u) << "a late put-end of a dead writer won";
  ASSERT_EQ(other.FinishReadOne("k"), code::kOk);

  // The zombie's space (old "k" extent and "abandoned") comes back after the release timeout;
  // until then it may still be written by the zombie, so it must not be reused.
  ASSERT_TRUE(node.FindSegment("seg-a", &seg));
  if (MsSince(started_at) < 1800) {
    EXPECT_EQ(seg.used_bytes(), 192 * KiB) << "zombie space freed before the release timeout";
  }
  bool released = WaitUntil(
      [&] {
        pb::SegmentInfo s;
        return node.FindSegment("seg-a", &s) && s.used_bytes() == 64 * KiB;
      },
      Millis(6000), Millis(100));
  ASSERT_TRUE(node.FindSegment("seg-a", &seg));
  EXPECT_TRUE(released) << "used bytes stayed at " << seg.used_bytes();
  EXPECT_GE(MsSince(started_at), 1900) << "released before the 2 s release timeout";
  EXPECT_EQ(seg.object_count(), 1u);
  EXPECT_EQ(other.GetOne("abandoned").code(), code::kObjectNotFound);
  EXPECT_EQ(dead.PutEndOne("abandoned", 1), code::kObjectNotFound);
  EXPECT_EQ(other.Put("abandoned", 64 * KiB), code::kOk);
}

TEST_F(MasterLivenessTest, ReadLockOfAReaderThatNeverFinishesExpires) {
  ASSERT_TRUE(StartMaster({"--lease-ttl", "500ms"}));
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient w = Client("client-w");
  MasterClient reader = Client("client-reader");

  ASSERT_EQ(w.Put("k", 4096), code::kOk);
  const auto read_at = steady_clock::now();
  auto got = reader.Get({"k"});
  ASSERT_EQ(got.results_size(), 1);
  ASSERT_EQ(got.results(0).code(), code::kOk);
  EXPECT_EQ(got.lease_ttl_ms(), 500u);
  EXPECT_EQ(w.RemoveOne("k"), code::kObjectHasLease);

  bool removed = WaitUntil([&] { return w.RemoveOne("k") == code::kOk; }, Millis(3000), Millis(50));
  EXPECT_TRUE(removed) << "the lock of a dead reader never expired";
  EXPECT_GE(MsSince(read_at), 450) << "the lock expired before its TTL";
  EXPECT_EQ(w.ExistOne("k"), 0);

  // Finishing a read whose lease ran out says so.
  ASSERT_EQ(w.Put("k2", 4096), code::kOk);
  ASSERT_EQ(reader.GetOne("k2").code(), code::kOk);
  std::this_thread::sleep_for(Millis(650));
  EXPECT_EQ(reader.FinishReadOne("k2"), code::kLeaseExpired);
  EXPECT_EQ(w.RemoveOne("k2"), code::kOk);
}

TEST_F(MasterLivenessTest, MasterRestartMakesNodesRemount) {
  ASSERT_TRUE(StartMaster({"--mount-quarantine", "1500ms"}));
  MasterClient node = Client("node-a");
  MasterClient w = Client("client-w");
  ASSERT_EQ(node.Mount("seg-a", 1 * MiB, "127.0.0.1:7100").code(), code::kOk);
  EXPECT_EQ(node.Ping().status(), pb::PingResponse::OK);
  ASSERT_EQ(w.Put("before", 4096), code::kOk);
  const uint16_t grpc_port = master_.grpc_port();
  const uint16_t http_port = master_.http_port();

  ASSERT_TRUE(master_.Restart()) << "restart on the same ports";
  EXPECT_EQ(master_.grpc_port(), grpc_port);
  EXPECT_EQ(master_.http_port(), http_port);

  // The new master does not know the node.
  EXPECT_EQ(node.Ping().status(), pb::PingResponse::NEED_REMOUNT);
  EXPECT_FALSE(node.FindSegment("seg-a", nullptr));
  pb::SegmentSpec spec;
  spec.set_name("seg-a");
  spec.set_size(1 * MiB);
  spec.set_endpoint("127.0.0.1:7100");
  auto remount = node.ReMount({spec});
  ASSERT_EQ(remount.results_size(), 1);
  EXPECT_EQ(remount.results(0).code(), code::kOk) << remount.results(0).message();
  EXPECT_EQ(node.Ping().status(), pb::PingResponse::OK);
  pb::SegmentInfo seg;
  ASSERT_TRUE(node.FindSegment("seg-a", &seg));
  EXPECT_EQ(seg.size(), 1 * MiB);
  EXPECT_EQ(seg.endpoint(), "127.0.0.1:7100");
  EXPECT_EQ(seg.node_id(), "node-a");

  // A remount is not fresh memory: readers and writers of the old master's grants may still be
  // on it, so it takes no new object until its quarantine has passed.
  EXPECT_EQ(w.PutStartOne("during-quarantine", 4096).code(), code::kNoAvailableHandle);
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));
  ASSERT_EQ(w.Put("after", 4096, 5), code::kOk);
  auto got = w.GetOne("after");
  ASSERT_EQ(got.code(), code::kOk);
  EXPECT_EQ(got.checksum(), 5u);
  ASSERT_EQ(got.replicas_size(), 1);
  EXPECT_EQ(got.replicas(0).segment_name(), "seg-a");
}

TEST_F(MasterLivenessTest, SigtermStopsTheMasterWithExitCodeZero) {
  ASSERT_TRUE(StartMaster());
  MasterClient w = Client("client-w");
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  ASSERT_EQ(w.Put("k", 4096), code::kOk);
  ASSERT_EQ(w.GetOne("k").code(), code::kOk);  // a lock outstanding does not hold it up

  const auto t0 = steady_clock::now();
  auto status = master_.Stop(SIGTERM, Millis(5000));
  ASSERT_TRUE(status.has_value()) << "still running 5 s after SIGTERM";
  EXPECT_TRUE(status->Succeeded()) << status->ToString();
  EXPECT_LT(MsSince(t0), 5000);
  // Both ports are closed.
  EXPECT_NE(HttpGet(master_.http_port(), "/health", Millis(1000)).status, 200);
}

TEST_F(MasterLivenessTest, SigintStopsTheMasterWithExitCodeZero) {
  ASSERT_TRUE(StartMaster());
  auto status = master_.Stop(SIGINT, Millis(5000));
  ASSERT_TRUE(status.has_value()) << "still running 5 s after SIGINT";
  EXPECT_TRUE(status->Succeeded()) << status->ToString();
}

}  // namespace
}  // namespace granary::it
