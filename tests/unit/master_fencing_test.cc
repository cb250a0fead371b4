// The master's share of "no space reused under a live reader or writer" (Master core v2, part 2):
// put generations, quarantined remounts and revokes, pings that carry mounts, dead writers,
// hostile pins and names. Each test reproduces a way the old master broke the promise.
#include <gtest/gtest.h>

#include <limits>

#include "master/state/master_state.h"

namespace granary::master {
namespace {

constexpr uint64_t kMiB = 1 << 20;

class MasterFencingTest : public ::testing::Test {
 protected:
  MasterFencingTest() : state_(Policy(), &clock_) {}

  static MasterPolicy Policy() {
    MasterPolicy p;
    p.lease_ttl_ms = 10'000;
    p.mount_quarantine_ms = 10'000;
    p.write_quarantine_ms = 120'000;
    p.client_ttl_ms = 10'000;
    p.put_discard_timeout_ms = 30'000;
    p.put_release_timeout_ms = 600'000;
    return p;
  }
  static SegmentSpec Spec(const std::string& name, uint64_t size, uint64_t token = 1,
                          bool fresh = true) {
    return {name, size, "127.0.0.1:1", "granary-" + name, "host/boot", token, fresh};
  }
  PutStartKeyResult Start(const std::string& client, const std::string& key, uint64_t size,
                          PlacementConfig config = {}) {
    return state_.PutStart({client, {key}, {size}, config, false})[0];
  }

  ManualClock clock_;
  MasterState state_;
};

TEST_F(MasterFencingTest, AStalledWriterCannotEndTheNextPutOfTheSameKey) {
  ASSERT_TRUE(state_.Mount({"node", Spec("seg", 64 * kMiB)}).status.ok());
  // Thread A of client w starts a put and stalls past the discard timeout...
  PutStartKeyResult first = Start("w", "k", kMiB);
  ASSERT_TRUE(first.status.ok());
  clock_.Advance(Millis(31'000));
  // ...thread B of the same client starts the key again and gets new space.
  PutStartKeyResult second = Start("w", "k", kMiB);
  ASSERT_TRUE(second.status.ok()) << second.status.ToString();
  ASSERT_NE(first.put_gen, second.put_gen);
  // A wakes up: its end and its revoke must not touch B's put (same client id).
  EXPECT_EQ(state_.PutEnd({"w", {"k"}, {111}, {first.put_gen}})[0].code(),
            ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(state_.PutRevoke({"w", {"k"}, {first.put_gen}})[0].code(), ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(state_.BatchExist({"k"})[0], 0) << "A's end made B's half-written bytes readable";
  ASSERT_TRUE(state_.PutEnd({"w", {"k"}, {222}, {second.put_gen}})[0].ok());
  EXPECT_EQ(state_.GetReplicaList({"r", {"k"}})[0].checksum, 222u);
}

TEST_F(MasterFencingTest, PutEndAndRevokeWithoutGenerationsAreRefused) {
  ASSERT_TRUE(state_.Mount({"node", Spec("seg", 64 * kMiB)}).status.ok());
  ASSERT_TRUE(Start("w", "k", kMiB).status.ok());
  EXPECT_EQ(state_.PutEnd({"w", {"k"}, {1}, {}})[0].code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(state_.PutRevoke({"w", {"k"}, {}})[0].code(), ErrorCode::INVALID_PARAMS);
}

TEST_F(MasterFencingTest, RevokeAfterATransferErrorQuarantinesTheSpace) {
  ASSERT_TRUE(state_.Mount({"node", Spec("seg", kMiB)}).status.ok());
  PutStartKeyResult failed = Start("w", "k", kMiB);
  ASSERT_TRUE(failed.status.ok());
  // The transfer failed: bytes may still be in a socket buffer on their way to the node.
  ASSERT_TRUE(state_.PutRevoke({"w", {"k"}, {failed.put_gen}, true})[0].ok());
  EXPECT_EQ(Start("w2", "other", kMiB).status.code(), ErrorCode::NO_AVAILABLE_HANDLE)
      << "the space of a failed transfer was handed out at once";
  clock_.Advance(Millis(119'000));
  state_.Sweep();
  EXPECT_EQ(Start("w2", "other", kMiB).status.code(), ErrorCode::NO_AVAILABLE_HANDLE);
  clock_.Advance(Millis(2'000));
  state_.Sweep();
  EXPECT_TRUE(Start("w2", "other", kMiB).status.ok()) << "the quarantine never ended";
}

TEST_F(MasterFencingTest, PlainRevokeFreesAtOnce) {
  ASSERT_TRUE(state_.Mount({"node", Spec("seg", kMiB)}).status.ok());
  PutStartKeyResult started = Start("w", "k", kMiB);
  ASSERT_TRUE(state_.PutRevoke({"w", {"k"}, {started.put_gen}, false})[0].ok());
  EXPECT_TRUE(Start("w2", "other", kMiB).status.ok());
}

TEST_F(MasterFencingTest, ARemountIsQuarantinedAFreshMountIsNot) {
  ASSERT_TRUE(state_.Mount({"node", Spec("fresh", 4 * kMiB, 1, true)}).status.ok());
  EXPECT_TRUE(Start("w", "a", kMiB, {1, false, false, {"fresh"}}).status.ok());
  // The same memory mounted again (a master restart, or expiry and return): late readers and
  // writers of the old mount may still be on it.
  ASSERT_TRUE(state_.Mount({"node2", Spec("again", 4 * kMiB, 2, false)}).status.ok());
  ASSERT_TRUE(state_.Unmount({"node", "fresh"}).status.ok());
  EXPECT_EQ(Start("w", "b", kMiB).status.code(), ErrorCode::NO_AVAILABLE_HANDLE);
  clock_.Advance(Millis(9'999));
  EXPECT_EQ(Start("w", "b", kMiB).status.code(), ErrorCode::NO_AVAILABLE_HANDLE);
  clock_.Advance(Millis(2));
  EXPECT_TRUE(Start("w", "b", kMiB).status.ok());
}

TEST_F(MasterFencingTest, ARemountUnderANewTokenReplacesTheMountAndIsQuarantined) {
  ASSERT_TRUE(state_.Mount({"node", Spec("seg", 4 * kMiB, 7)}).status.ok());
  PutStartKeyResult put = Start("w", "k", kMiB);
  ASSERT_TRUE(state_.PutEnd({"w", {"k"}, {1}, {put.put_gen}})[0].ok());
  // The node was told to remount (e.g. its ping named a mount the master no longer holds).
  MountResult again = state_.Mount({"node", Spec("seg", 4 * kMiB, 8, false)});
  ASSERT_TRUE(again.status.ok()) << again.status.ToString();
  EXPECT_EQ(state_.BatchExist({"k"})[0], 0) << "a replica quoting the old token survived";
  EXPECT_FALSE(state_.Ping("node", {{"seg", 8}}).need_remount);
  EXPECT_EQ(Start("w", "k2", kMiB).status.code(), ErrorCode::NO_AVAILABLE_HANDLE)
      << "the old mount's memory was handed out at once";
  clock_.Advance(Millis(10'001));
  EXPECT_TRUE(Start("w", "k2", kMiB).status.ok());
}

TEST_F(MasterFencingTest, PingNamesMountsTheMasterNoLongerHolds) {
  ASSERT_TRUE(state_.Mount({"node", Spec("seg", 4 * kMiB, 7)}).status.ok());
  EXPECT_FALSE(state_.Ping("node", {{"seg", 7}}).need_remount);
  // The node believes in a mount the master replaced or lost: it must remount.
  EXPECT_TRUE(state_.Ping("node", {{"seg", 6}}).need_remount) << "stale token accepted";
  EXPECT_TRUE(state_.Ping("node", {{"other", 7}}).need_remount) << "unknown segment accepted";
  ASSERT_TRUE(state_.Mount({"thief", Spec("seg2", 4 * kMiB, 9)}).status.ok());
  EXPECT_TRUE(state_.Ping("node", {{"seg2", 9}}).need_remount) << "another client's segment";
}

TEST_F(MasterFencingTest, APutOverAnExpiredWritersPendingPutTakesTheKeyAtOnce) {
  ASSERT_TRUE(state_.Mount({"node", Spec("seg", 64 * kMiB)}).status.ok());
  state_.Ping("dying");  // a client the master tracks (it heartbeats, e.g. an embedded node)
  ASSERT_TRUE(Start("dying", "k", kMiB).status.ok());
  state_.Ping("node");
  clock_.Advance(Millis(10'001));
  state_.Ping("node");
  EXPECT_EQ(Start("other", "k", kMiB).status.code(), ErrorCode::OBJECT_ALREADY_EXISTS)
      << "not yet declared dead";
  state_.ExpireClient("dying");
  PutStartKeyResult taken = Start("other", "k", kMiB);
  ASSERT_TRUE(taken.status.ok()) << "the key stayed blocked until the discard timeout";
  ASSERT_TRUE(state_.PutEnd({"other", {"k"}, {5}, {taken.put_gen}})[0].ok());
  EXPECT_EQ(state_.BatchExist({"k"})[0], 1);
}

TEST_F(MasterFencingTest, HugeSoftPinTtlDoesNotOverflow) {
  ASSERT_TRUE(state_.Mount({"node", Spec("seg", 64 * kMiB)}).status.ok());
  PlacementConfig pin;
  pin.with_soft_pin = true;
  pin.soft_pin_ttl_ms = std::numeric_limits<int64_t>::max();
  PutStartKeyResult started = Start("w", "k", kMiB, pin);
  ASSERT_TRUE(started.status.ok());
  ASSERT_TRUE(state_.PutEnd({"w", {"k"}, {1}, {started.put_gen}})[0].ok());
  EXPECT_TRUE(state_.Stat("k")->soft_pinned) << "now + ttl wrapped negative";
  ASSERT_TRUE(state_.GetReplicaList({"r", {"k"}})[0].status.ok());  // renews the pin
  EXPECT_TRUE(state_.Stat("k")->soft_pinned);
}

TEST_F(MasterFencingTest, MountNamesFollowTheSharedMemoryNameRules) {
  for (const std::string& bad : {std::string("a\0b", 3), std::string("../etc"), std::string("a/b"),
                                 std::string(4096, 'x'), std::string(""), std::string(".."),
                                 std::string("sp ace")}) {
    MountResult r = state_.Mount({"node", Spec(bad, 4 * kMiB)});
    EXPECT_EQ(r.status.code(), ErrorCode::INVALID_PARAMS) << "accepted '" << bad.substr(0, 20) << "'";
  }
  SegmentSpec bad_shm = Spec("good-name", 4 * kMiB);
  bad_shm.shm_name = "../../dev/mem";
  EXPECT_EQ(state_.Mount({"node", bad_shm}).status.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(state_.segments().segment_count(), 0u);
  EXPECT_TRUE(state_.Mount({"node", Spec("host-1.seg_2", 4 * kMiB)}).status.ok());
  // Mooncake names segments "host:port"; the node derives a valid shm name from it.
  SegmentSpec mooncake = Spec("seg-x", 4 * kMiB);
  mooncake.name = "10.0.0.5:17812";
  EXPECT_TRUE(state_.Mount({"node", mooncake}).status.ok());
}

}  // namespace
}  // namespace granary::master
