// Integration tests of the master's gRPC API: the real granary-master binary, driven over gRPC.
// Segments, the put/get protocol, batch queries, removal and regex. Eviction and pins:
// master_api_eviction_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "master_fixture.h"

namespace granary::it {
namespace {

// Replica identity for comparisons.
std::tuple<uint64_t, uint64_t, uint64_t> Where(const pb::Replica& r) {
  return {r.segment_id(), r.offset(), r.length()};
}

std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> Wheres(
    const google::protobuf::RepeatedPtrField<pb::Replica>& replicas) {
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> out;
  for (const auto& r : replicas) out.push_back(Where(r));
  return out;
}

class MasterApiTest : public MasterTest {};

TEST_F(MasterApiTest, MountListUnmountSegments) {
  ASSERT_TRUE(StartMaster());
  MasterClient a = Client("client-a");
  MasterClient b = Client("client-b");

  auto listed = a.ListSegments();
  EXPECT_EQ(listed.segments_size(), 0);
  const uint64_t version0 = listed.view_version();

  auto mounted = a.Mount("seg-a", 1 * MiB, "10.0.0.1:7001");
  ASSERT_EQ(mounted.code(), code::kOk) << mounted.message();
  EXPECT_NE(mounted.segment_id(), 0u);
  EXPECT_GT(mounted.view_version(), version0);

  // Remounting the same segment by its owner is idempotent.
  auto again = a.Mount("seg-a", 1 * MiB, "10.0.0.1:7001");
  EXPECT_EQ(again.code(), code::kOk) << again.message();
  EXPECT_EQ(again.segment_id(), mounted.segment_id());

  // The name is taken by another client.
  auto taken = b.Mount("seg-a", 1 * MiB, "10.0.0.2:7001");
  EXPECT_EQ(taken.code(), code::kSegmentAlreadyExists);
  EXPECT_FALSE(taken.message().empty());

  ASSERT_EQ(b.Mount("seg-b", 2 * MiB, "10.0.0.2:7001").code(), code::kOk);

  pb::SegmentInfo info;
  ASSERT_TRUE(a.FindSegment("seg-a", &info));
  EXPECT_EQ(info.segment_id(), mounted.segment_id());
  EXPECT_EQ(info.node_id(), "client-a");
  EXPECT_EQ(info.endpoint(), "10.0.0.1:7001");
  EXPECT_EQ(info.size(), 1 * MiB);
  EXPECT_EQ(info.used_bytes(), 0u);
  EXPECT_EQ(info.free_bytes(), 1 * MiB);
  EXPECT_EQ(info.largest_free_block(), 1 * MiB);
  EXPECT_EQ(info.object_count(), 0u);
  ASSERT_TRUE(a.FindSegment("seg-b", &info));
  EXPECT_EQ(info.node_id(), "client-b");
  EXPECT_EQ(info.size(), 2 * MiB);
  EXPECT_EQ(a.ListSegments().segments_size(), 2);

  // Unmount: unknown name, someone else's segment, then the owner.
  EXPECT_EQ(a.Unmount("seg-nope").code(), code::kSegmentNotFound);
  auto stolen = b.Unmount("seg-a");
  EXPECT_EQ(stolen.code(), code::kIllegalClient);
  EXPECT_TRUE(a.FindSegment("seg-a", nullptr)) << "a refused unmount must leave the segment";

  const uint64_t before = a.ListSegments().view_version();
  auto gone = a.Unmount("seg-a");
  EXPECT_EQ(gone.code(), code::kOk) << gone.message();
  EXPECT_GT(gone.view_version(), before);
  EXPECT_FALSE(a.FindSegment("seg-a", nullptr));
  EXPECT_TRUE(a.FindSegment("seg-b", nullptr));
  EXPECT_EQ(a.Unmount("seg-a").code(), code::kSegmentNotFound);

  // The freed name can be taken by another client now.
  EXPECT_EQ(b.Mount("seg-a", 1 * MiB).code(), code::kOk);
}

TEST_F(MasterApiTest, PutStartPlacesReplicasInsideDistinctSegments) {
  ASSERT_TRUE(StartMaster());
  std::map<std::string, std::string> endpoint_of = {
      {"seg-a", "10.0.0.1:7001"}, {"seg-b", "10.0.0.2:7001"}, {"seg-c", "10.0.0.3:7001"}};
  for (const auto& [name, endpoint] : endpoint_of) {
    ASSERT_EQ(Client("node-" + name).Mount(name, 1 * MiB, endpoint).code(), code::kOk);
  }
  MasterClient w = Client("client-w");
  std::map<uint64_t, pb::SegmentInfo> segments;
  const pb::ListSegmentsResponse listed = w.ListSegments();
  for (const auto& s : listed.segments()) segments[s.segment_id()] = s;
  ASSERT_EQ(segments.size(), 3u);

  constexpr uint64_t kSize = 100'000;  // not a multiple of the 64-byte alignment
  std::vector<std::string> keys;
  for (int i = 0; i < 6; ++i) keys.push_back("obj-" + std::to_string(i));
  auto started = w.PutStart(keys, std::vector<uint64_t>(keys.size(), kSize), Replicas(2));
  ASSERT_EQ(started.results_size(), 6);

  std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> ranges;  // segment -> [begin,end)
  for (int i = 0; i < started.results_size(); ++i) {
    const auto& r = started.results(i);
    ASSERT_EQ(r.code(), code::kOk) << keys[i] << ": " << r.message();
    ASSERT_EQ(r.replicas_size(), 2) << keys[i];
    EXPECT_NE(r.replicas(0).segment_id(), r.replicas(1).segment_id())
        << keys[i] << ": both replicas on one segment";
    for (const auto& rep : r.replicas()) {
      ASSERT_TRUE(segments.count(rep.segment_id())) << "replica names unknown segment "
                                                    << rep.segment_id();
      const pb::SegmentInfo& seg = segments[rep.segment_id()];
      EXPECT_EQ(rep.segment_name(), seg.name());
      EXPECT_EQ(rep.node_id(), "node-" + seg.name());
      EXPECT_EQ(rep.endpoint(), endpoint_of[seg.name()]);
      EXPECT_EQ(rep.length(), kSize);
      EXPECT_EQ(rep.offset() % 64, 0u);
      EXPECT_LE(rep.offset() + rep.length(), seg.size()) << "replica outside its segment";
      ranges[rep.segment_id()].push_back({rep.offset(), rep.offset() + rep.length()});
    }
  }
  // No two replicas overlap inside a segment.
  for (auto& [id, list] : ranges) {
    std::sort(list.begin(), list.end());
    for (size_t i = 1; i < list.size(); ++i) {
      EXPECT_LE(list[i - 1].second, list[i].first) << "overlapping replicas on segment " << id;
    }
  }
  // Usage accounts for 12 replicas of 100,000 bytes rounded up to 64.
  uint64_t used = 0, count = 0;
  const pb::ListSegmentsResponse after = w.ListSegments();
  for (const auto& s : after.segments()) {
    used += s.used_bytes();
    count += s.object_count();
    EXPECT_EQ(s.used_bytes() + s.free_bytes(), s.size());
  }
  EXPECT_EQ(used, 12 * 100'032u);
  EXPECT_EQ(count, 12u);
}

TEST_F(MasterApiTest, ReplicaNumIsBestEffort) {
  ASSERT_TRUE(StartMaster());
  MasterClient w = Client("client-w");
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);

  // Two replicas wanted, one segment: one replica, and success.
  auto one = w.PutStartOne("k-two-on-one", 4096, Replicas(2));
  EXPECT_EQ(one.code(), code::kOk) << one.message();
  EXPECT_EQ(one.replicas_size(), 1);
  EXPECT_EQ(w.PutEndOne("k-two-on-one", 1), code::kOk);
  EXPECT_EQ(w.GetOne("k-two-on-one").replicas_size(), 1);

  // replica_num 0 is taken as 1.
  auto zero = w.PutStartOne("k-zero", 4096, Replicas(0));
  EXPECT_EQ(zero.code(), code::kOk) << zero.message();
  EXPECT_EQ(zero.replicas_size(), 1);

  // Three wanted, two segments: two replicas on distinct segments.
  ASSERT_EQ(Client("node-b").Mount("seg-b", 1 * MiB).code(), code::kOk);
  auto two = w.PutStartOne("k-three-on-two", 4096, Replicas(3));
  EXPECT_EQ(two.code(), code::kOk) << two.message();
  ASSERT_EQ(two.replicas_size(), 2);
  EXPECT_NE(two.replicas(0).segment_id(), two.replicas(1).segment_id());
}

TEST_F(MasterApiTest, PreferredSegmentsAreTriedFirst) {
  ASSERT_TRUE(StartMaster());
  MasterClient w = Client("client-w");
  for (const char* name : {"seg-a", "seg-b", "seg-c"}) {
    ASSERT_EQ(Client(std::string("node-") + name).Mount(name, 1 * MiB).code(), code::kOk);
  }
  ASSERT_EQ(Client("node-small").Mount("seg-small", 64 * KiB).code(), code::kOk);

  // One replica, seg-c preferred: every key lands there, whatever the rotation.
  pb::ReplicateConfig c = Replicas(1);
  c.add_preferred_segments("seg-c");
  for (int i = 0; i < 5; ++i) {
    auto r = w.PutStartOne("pref-c-" + std::to_string(i), 4096, c);
    ASSERT_EQ(r.code(), code::kOk) << r.message();
    ASSERT_EQ(r.replicas_size(), 1);
    EXPECT_EQ(r.replicas(0).segment_name(), "seg-c");
  }

  // Two replicas, [seg-b, seg-a] preferred: exactly those two, in that order.
  pb::ReplicateConfig ba = Replicas(2);
  ba.add_preferred_segments("seg-b");
  ba.add_preferred_segments("seg-a");
  for (int i = 0; i < 3; ++i) {
    auto r = w.PutStartOne("pref-ba-" + std::to_string(i), 4096, ba);
    ASSERT_EQ(r.code(), code::kOk) << r.message();
    ASSERT_EQ(r.replicas_size(), 2);
    EXPECT_EQ(r.replicas(0).segment_name(), "seg-b");
    EXPECT_EQ(r.replicas(1).segment_name(), "seg-a");
  }

  // An unknown preferred name is skipped, the next one honoured.
  pb::ReplicateConfig unknown = Replicas(1);
  unknown.add_preferred_segments("seg-does-not-exist");
  unknown.add_preferred_segments("seg-a");
  auto r = w.PutStartOne("pref-unknown", 4096, unknown);
  ASSERT_EQ(r.code(), code::kOk) << r.message();
  ASSERT_EQ(r.replicas_size(), 1);
  EXPECT_EQ(r.replicas(0).segment_name(), "seg-a");

  // A preferred segment too small for the object: the others take it.
  pb::ReplicateConfig small = Replicas(1);
  small.add_preferred_segments("seg-small");
  auto big = w.PutStartOne("pref-too-big", 128 * KiB, small);
  ASSERT_EQ(big.code(), code::kOk) << big.message();
  ASSERT_EQ(big.replicas_size(), 1);
  EXPECT_NE(big.replicas(0).segment_name(), "seg-small");
}

TEST_F(MasterApiTest, PutEndMakesTheObjectReadableWithItsReplicas) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB, "10.0.0.1:1").code(), code::kOk);
  ASSERT_EQ(Client("node-b").Mount("seg-b", 1 * MiB, "10.0.0.2:1").code(), code::kOk);
  MasterClient w = Client("client-w");
  MasterClient r = Client("client-r");

  constexpr uint64_t kChecksum = 0xdeadbeefcafef00dULL;
  auto started = w.PutStartOne("model/7b/prefix-1", 300'000, Replicas(2));
  ASSERT_EQ(started.code(), code::kOk) << started.message();
  ASSERT_EQ(started.replicas_size(), 2);
  ASSERT_EQ(w.PutEndOne("model/7b/prefix-1", kChecksum), code::kOk);

  auto resp = r.Get({"model/7b/prefix-1"});
  ASSERT_EQ(resp.results_size(), 1);
  EXPECT_EQ(resp.lease_ttl_ms(), 10'000u) << "the default read lease is 10 s";
  const auto& got = resp.results(0);
  ASSERT_EQ(got.code(), code::kOk) << got.message();
  EXPECT_EQ(got.size(), 300'000u);
  EXPECT_EQ(got.checksum(), kChecksum);
  EXPECT_EQ(Wheres(got.replicas()), Wheres(started.replicas()));
  for (int i = 0; i < got.replicas_size(); ++i) {
    EXPECT_EQ(got.replicas(i).segment_name(), started.replicas(i).segment_name());
    EXPECT_EQ(got.replicas(i).endpoint(), started.replicas(i).endpoint());
    EXPECT_EQ(got.replicas(i).node_id(), started.replicas(i).node_id());
  }

  auto stat = r.Stat("model/7b/prefix-1");
  EXPECT_EQ(stat.code(), code::kOk);
  EXPECT_EQ(stat.state(), "COMPLETE");
  EXPECT_EQ(stat.size(), 300'000u);
  EXPECT_EQ(stat.checksum(), kChecksum);
  EXPECT_EQ(stat.read_locks(), 1u) << "the get took a read lock";
  EXPECT_EQ(r.FinishReadOne("model/7b/prefix-1"), code::kOk);
  EXPECT_EQ(r.Stat("model/7b/prefix-1").read_locks(), 0u);
  // No second release of the same lock.
  EXPECT_EQ(r.FinishReadOne("model/7b/prefix-1"), code::kLeaseExpired);
}

TEST_F(MasterApiTest, SecondPutStartOfAKeyIsObjectAlreadyExists) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient a = Client("client-a");
  MasterClient b = Client("client-b");

  ASSERT_EQ(a.PutStartOne("k", 4096).code(), code::kOk);
  // In flight: nobody else may start it again; the writer itself takes it over (its retry after
  // a lost answer, docs/master.md), and ends the new start.
  EXPECT_EQ(b.PutStartOne("k", 8192).code(), code::kObjectAlreadyExists);
  EXPECT_EQ(a.PutStartOne("k", 4096).code(), code::kOk);
  EXPECT_EQ(b.PutStartOne("k", 8192).code(), code::kObjectAlreadyExists);
  ASSERT_EQ(a.PutEndOne("k", 42), code::kOk);
  // Complete: write-once.
  EXPECT_EQ(a.PutStartOne("k", 4096).code(), code::kObjectAlreadyExists);
  auto late = b.PutStart({"k", "k-new"}, {4096, 4096});
  ASSERT_EQ(late.results_size(), 2);
  EXPECT_EQ(late.results(0).code(), code::kObjectAlreadyExists);
  EXPECT_EQ(late.results(0).replicas_size(), 0);
  EXPECT_EQ(late.results(1).code(), code::kOk);
  // The object was not touched by the refused starts.
  auto got = b.GetOne("k");
  EXPECT_EQ(got.code(), code::kOk);
  EXPECT_EQ(got.size(), 4096u);
  EXPECT_EQ(got.checksum(), 42u);
}

TEST_F(MasterApiTest, ReadsOfMissingAndInFlightObjects) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient w = Client("client-w");
  MasterClient r = Client("client-r");

  EXPECT_EQ(r.GetOne("missing").code(), code::kObjectNotFound);
  EXPECT_EQ(r.ExistOne("missing"), 0);
  EXPECT_EQ(r.GetSize({"missing"}), std::vector<int64_t>{code::kObjectNotFound});
  EXPECT_EQ(r.Stat("missing").code(), code::kObjectNotFound);
  EXPECT_EQ(r.RemoveOne("missing"), code::kObjectNotFound);

  ASSERT_EQ(w.PutStartOne("in-flight", 4096).code(), code::kOk);
  auto got = r.GetOne("in-flight");
  EXPECT_EQ(got.code(), code::kReplicaIsNotReady);
  EXPECT_EQ(got.replicas_size(), 0) << "no replica of an object being written may be handed out";
  EXPECT_EQ(r.ExistOne("in-flight"), 0);
  EXPECT_EQ(r.GetSize({"in-flight"}), std::vector<int64_t>{code::kReplicaIsNotReady});
  EXPECT_EQ(r.PrefixMatch({"in-flight"}).matched(), 0u);
  EXPECT_EQ(r.Stat("in-flight").state(), "PROCESSING");
  EXPECT_EQ(r.RemoveOne("in-flight"), code::kReplicaIsNotReady);
  EXPECT_EQ(r.QueryByRegex("in-flight").objects_size(), 0);

  ASSERT_EQ(w.PutEndOne("in-flight", 9), code::kOk);
  EXPECT_EQ(r.GetOne("in-flight").code(), code::kOk);
  EXPECT_EQ(r.ExistOne("in-flight"), 1);
}

TEST_F(MasterApiTest, OnlyTheWriterMayEndOrRevoke) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient a = Client("client-a");
  MasterClient b = Client("client-b");

  ASSERT_EQ(a.PutStartOne("k", 4096).code(), code::kOk);
  auto end = b.PutEnd({"k"}, {1});
  ASSERT_EQ(end.results_size(), 1);
  EXPECT_EQ(end.results(0).code(), code::kIllegalClient);
  EXPECT_FALSE(end.results(0).message().empty());
  EXPECT_EQ(b.PutRevokeOne("k"), code::kIllegalClient);
  EXPECT_EQ(b.GetOne("k").code(), code::kReplicaIsNotReady) << "still the writer's";

  ASSERT_EQ(a.PutEndOne("k", 7), code::kOk);
  EXPECT_EQ(b.GetOne("k").checksum(), 7u);
  // Nothing to end or revoke any more.
  EXPECT_EQ(a.PutEndOne("k", 8), code::kInvalidWrite);
  EXPECT_EQ(a.PutRevokeOne("k"), code::kInvalidWrite);
  EXPECT_EQ(b.GetOne("k").checksum(), 7u);
  EXPECT_EQ(a.PutEndOne("never-started", 1), code::kObjectNotFound);
  EXPECT_EQ(a.PutRevokeOne("never-started"), code::kObjectNotFound);
}

TEST_F(MasterApiTest, RevokeFreesTheSpace) {
  ASSERT_TRUE(StartMaster());
  MasterClient node = Client("node-a");
  ASSERT_EQ(node.Mount("seg-a", 256 * KiB).code(), code::kOk);
  MasterClient a = Client("client-a");
  MasterClient b = Client("client-b");

  ASSERT_EQ(a.PutStartOne("fills-it", 256 * KiB).code(), code::kOk);
  pb::SegmentInfo seg;
  ASSERT_TRUE(node.FindSegment("seg-a", &seg));
  EXPECT_EQ(seg.free_bytes(), 0u);
  // Nothing is evictable (the only object is in flight): no space.
  auto full = b.PutStartOne("waits", 64 * KiB);
  EXPECT_EQ(full.code(), code::kNoAvailableHandle);
  EXPECT_FALSE(full.message().empty());

  ASSERT_EQ(a.PutRevokeOne("fills-it"), code::kOk);
  ASSERT_TRUE(node.FindSegment("seg-a", &seg));
  EXPECT_EQ(seg.free_bytes(), 256 * KiB);
  EXPECT_EQ(seg.object_count(), 0u);
  EXPECT_EQ(b.GetOne("fills-it").code(), code::kObjectNotFound);
  EXPECT_EQ(b.ExistOne("fills-it"), 0);

  // The whole segment is reusable.
  ASSERT_EQ(b.Put("waits", 256 * KiB), code::kOk);
  EXPECT_EQ(b.ExistOne("waits"), 1);
}

TEST_F(MasterApiTest, UpsertReplacesACompleteObjectAtEnd) {
  ASSERT_TRUE(StartMaster());
  MasterClient node = Client("node-a");
  ASSERT_EQ(node.Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient a = Client("client-a");
  MasterClient b = Client("client-b");

  ASSERT_EQ(a.Put("k", 64 * KiB, /*checksum=*/1), code::kOk);
  auto old = b.GetOne("k");
  ASSERT_EQ(old.code(), code::kOk);
  ASSERT_EQ(b.FinishReadOne("k"), code::kOk);

  auto up = a.PutStartOne("k", 128 * KiB, Replicas(1), /*upsert=*/true);
  ASSERT_EQ(up.code(), code::kOk) << up.message();
  ASSERT_EQ(up.replicas_size(), 1);
  EXPECT_NE(Where(up.replicas(0)), Where(old.replicas(0))) << "the new bytes need new space";

  // Until the end, readers see the old version.
  auto during = b.GetOne("k");
  ASSERT_EQ(during.code(), code::kOk) << during.message();
  EXPECT_EQ(during.checksum(), 1u);
  EXPECT_EQ(during.size(), 64 * KiB);
  EXPECT_EQ(Wheres(during.replicas()), Wheres(old.replicas()));
  ASSERT_EQ(b.FinishReadOne("k"), code::kOk);
  EXPECT_EQ(b.Stat("k").state(), "COMPLETE+PROCESSING");
  EXPECT_EQ(b.ExistOne("k"), 1);
  // A second writer cannot start another upsert or a put meanwhile.
  EXPECT_EQ(b.PutStartOne("k", 4096, Replicas(1), true).code(), code::kObjectAlreadyExists);
  EXPECT_EQ(b.PutStartOne("k", 4096).code(), code::kObjectAlreadyExists);

  ASSERT_EQ(a.PutEndOne("k", 2), code::kOk);
  auto now = b.GetOne("k");
  ASSERT_EQ(now.code(), code::kOk);
  EXPECT_EQ(now.checksum(), 2u);
  EXPECT_EQ(now.size(), 128 * KiB);
  EXPECT_EQ(Wheres(now.replicas()), Wheres(up.replicas()));
  ASSERT_EQ(b.FinishReadOne("k"), code::kOk);

  // No reader was on the old version: its space is back at once.
  pb::SegmentInfo seg;
  ASSERT_TRUE(node.FindSegment("seg-a", &seg));
  EXPECT_EQ(seg.used_bytes(), 128 * KiB);
  EXPECT_EQ(seg.object_count(), 1u);

  // Upsert of a key that does not exist is a plain put.
  EXPECT_EQ(a.Put("fresh", 4096, 3, Replicas(1), /*upsert=*/true), code::kOk);
  EXPECT_EQ(b.GetOne("fresh").checksum(), 3u);
}

TEST_F(MasterApiTest, BatchExistGetSizeAndPrefixMatch) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient w = Client("client-w");
  MasterClient r = Client("client-r");

  ASSERT_EQ(w.Put("a", 1000), code::kOk);
  ASSERT_EQ(w.Put("b", 2000), code::kOk);
  ASSERT_EQ(w.Put("c", 3000), code::kOk);
  ASSERT_EQ(w.Put("e", 5000), code::kOk);
  ASSERT_EQ(w.PutStartOne("f-in-flight", 6000).code(), code::kOk);

  EXPECT_EQ(r.Exist({"a", "b", "c", "d", "e", "f-in-flight"}),
            (std::vector<int32_t>{1, 1, 1, 0, 1, 0}));
  EXPECT_EQ(r.GetSize({"a", "b", "c", "d", "e", "f-in-flight"}),
            (std::vector<int64_t>{1000, 2000, 3000, code::kObjectNotFound, 5000,
                                  code::kReplicaIsNotReady}));

  auto m = r.PrefixMatch({"a", "b", "c", "d", "e"});
  EXPECT_EQ(m.code(), code::kOk);
  EXPECT_EQ(m.matched(), 3u);
  EXPECT_EQ(r.PrefixMatch({"a", "b", "c", "e"}).matched(), 4u);
  EXPECT_EQ(r.PrefixMatch({"d", "a"}).matched(), 0u);
  EXPECT_EQ(r.PrefixMatch({"a", "f-in-flight", "b"}).matched(), 1u);
  auto empty = r.PrefixMatch({});
  EXPECT_EQ(empty.code(), code::kOk);
  EXPECT_EQ(empty.matched(), 0u);
  EXPECT_TRUE(r.Exist({}).empty());

  // An existence check is not a read: no lock is taken.
  EXPECT_EQ(r.Stat("a").read_locks(), 0u);
  EXPECT_EQ(r.RemoveOne("a"), code::kOk);
  EXPECT_EQ(r.PrefixMatch({"a", "b"}).matched(), 0u);
}

TEST_F(MasterApiTest, RemoveRespectsReadLocks) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient a = Client("client-a");
  MasterClient reader = Client("client-reader");

  ASSERT_EQ(a.Put("locked", 4096), code::kOk);
  ASSERT_EQ(reader.GetOne("locked").code(), code::kOk);  // holds a read lock
  auto refused = a.Remove({"locked"});
  ASSERT_EQ(refused.results_size(), 1);
  EXPECT_EQ(refused.results(0).code(), code::kObjectHasLease);
  EXPECT_FALSE(refused.results(0).message().empty());
  EXPECT_EQ(a.ExistOne("locked"), 1);
  EXPECT_EQ(a.RemoveOne("locked", /*force=*/true), code::kOk);
  EXPECT_EQ(a.ExistOne("locked"), 0);
  EXPECT_EQ(a.GetOne("locked").code(), code::kObjectNotFound);
  // The name is free again at once.
  EXPECT_EQ(a.Put("locked", 4096, 2), code::kOk);
  EXPECT_EQ(a.GetOne("locked").checksum(), 2u);
  EXPECT_EQ(a.FinishReadOne("locked"), code::kOk);

  ASSERT_EQ(a.Put("released", 4096), code::kOk);
  ASSERT_EQ(reader.GetOne("released").code(), code::kOk);
  EXPECT_EQ(a.RemoveOne("released"), code::kObjectHasLease);
  ASSERT_EQ(reader.FinishReadOne("released"), code::kOk);
  EXPECT_EQ(a.RemoveOne("released"), code::kOk);
  EXPECT_EQ(a.ExistOne("released"), 0);

  // A batch answers per key.
  ASSERT_EQ(a.Put("free", 4096), code::kOk);
  ASSERT_EQ(a.Put("held", 4096), code::kOk);
  ASSERT_EQ(reader.GetOne("held").code(), code::kOk);
  auto batch = a.Remove({"held", "free", "nobody"});
  ASSERT_EQ(batch.results_size(), 3);
  EXPECT_EQ(batch.results(0).code(), code::kObjectHasLease);
  EXPECT_EQ(batch.results(1).code(), code::kOk);
  EXPECT_EQ(batch.results(2).code(), code::kObjectNotFound);
  EXPECT_EQ(a.Exist({"held", "free"}), (std::vector<int32_t>{1, 0}));
}

TEST_F(MasterApiTest, RemoveByRegexAndQueryByRegex) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient w = Client("client-w");
  MasterClient reader = Client("client-reader");

  ASSERT_EQ(w.Put("model-x/1", 1000), code::kOk);
  ASSERT_EQ(w.Put("model-x/2", 2000), code::kOk);
  ASSERT_EQ(w.Put("model-x/3", 3000, 0, Replicas(1)), code::kOk);
  ASSERT_EQ(w.Put("model-y/1", 4000), code::kOk);
  ASSERT_EQ(w.Put("unrelated", 5000), code::kOk);
  ASSERT_EQ(w.PutStartOne("model-x/4", 6000).code(), code::kOk);  // in flight
  ASSERT_EQ(reader.GetOne("model-x/3").code(), code::kOk);       // read-locked

  auto q = w.QueryByRegex("model-x/.*");
  EXPECT_EQ(q.code(), code::kOk);
  EXPECT_FALSE(q.truncated());
  std::map<std::string, uint64_t> found;
  for (const auto& o : q.objects()) {
    found[o.key()] = o.size();
    EXPECT_EQ(o.replica_count(), 1u);
  }
  EXPECT_EQ(found, (std::map<std::string, uint64_t>{
                       {"model-x/1", 1000}, {"model-x/2", 2000}, {"model-x/3", 3000}}))
      << "complete objects only";

  auto limited = w.QueryByRegex("model-.*", 2);
  EXPECT_EQ(limited.code(), code::kOk);
  EXPECT_EQ(limited.objects_size(), 2);
  EXPECT_TRUE(limited.truncated());

  auto removed = w.RemoveByRegex("model-x/.*");
  EXPECT_EQ(removed.code(), code::kOk) << removed.message();
  EXPECT_EQ(removed.removed(), 2u);
  EXPECT_EQ(removed.skipped(), 2u) << "the read-locked and the in-flight object are kept";
  EXPECT_EQ(w.Exist({"model-x/1", "model-x/2", "model-x/3", "model-y/1", "unrelated"}),
            (std::vector<int32_t>{0, 0, 1, 1, 1}));

  auto forced = w.RemoveByRegex("model-x/.*", /*force=*/true);
  EXPECT_EQ(forced.code(), code::kOk);
  EXPECT_EQ(forced.removed(), 1u);
  EXPECT_EQ(forced.skipped(), 1u) << "force ignores read locks, not writes in flight";
  EXPECT_EQ(w.ExistOne("model-x/3"), 0);
  // The in-flight put is unharmed and can still complete.
  EXPECT_EQ(w.PutEndOne("model-x/4", 4), code::kOk);
  EXPECT_EQ(w.ExistOne("model-x/4"), 1);

  auto rest = w.QueryByRegex("model-.*");
  std::set<std::string> keys;
  for (const auto& o : rest.objects()) keys.insert(o.key());
  EXPECT_EQ(keys, (std::set<std::string>{"model-x/4", "model-y/1"}));
  auto none = w.QueryByRegex("nothing-matches-this");
  EXPECT_EQ(none.code(), code::kOk);
  EXPECT_EQ(none.objects_size(), 0);
}

// master.proto: RegexRequest.pattern is "RE2 syntax, matched against the whole key".
TEST_F(MasterApiTest, RegexSearchesWithinKeysAndHonoursAnchors) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient w = Client("client-w");
  ASSERT_EQ(w.Put("alpha-1", 64), code::kOk);
  ASSERT_EQ(w.Put("beta-alpha-2", 64), code::kOk);
  ASSERT_EQ(w.Put("gamma", 64), code::kOk);

  EXPECT_EQ(w.QueryByRegex("alpha").objects_size(), 2) << "a pattern is searched for, like grep";
  auto q = w.QueryByRegex("^alpha-");
  ASSERT_EQ(q.objects_size(), 1) << "an anchor restricts it to the start of the key";
  EXPECT_EQ(q.objects(0).key(), "alpha-1");
  EXPECT_EQ(w.QueryByRegex("^alpha$").objects_size(), 0);

  auto removed = w.RemoveByRegex("^alpha-.*$");
  EXPECT_EQ(removed.removed(), 1u);
  EXPECT_EQ(w.Exist({"alpha-1", "beta-alpha-2", "gamma"}), (std::vector<int32_t>{0, 1, 1}))
      << "remove-by-regex deleted a key the anchored pattern does not match";
}

TEST_F(MasterApiTest, RemoveAllSkipsLockedAndInFlightUnlessForced) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient w = Client("client-w");
  MasterClient reader = Client("client-reader");

  ASSERT_EQ(w.Put("k1", 4096), code::kOk);
  ASSERT_EQ(w.Put("k2", 4096), code::kOk);
  ASSERT_EQ(w.Put("k3", 4096), code::kOk);
  ASSERT_EQ(w.PutStartOne("k4", 4096).code(), code::kOk);
  ASSERT_EQ(reader.GetOne("k2").code(), code::kOk);

  auto all = w.RemoveAll();
  EXPECT_EQ(all.code(), code::kOk);
  EXPECT_EQ(all.removed(), 2u);
  EXPECT_EQ(all.skipped(), 2u);
  EXPECT_EQ(w.Exist({"k1", "k2", "k3"}), (std::vector<int32_t>{0, 1, 0}));

  auto forced = w.RemoveAll(/*force=*/true);
  EXPECT_EQ(forced.code(), code::kOk);
  EXPECT_EQ(forced.removed(), 1u);
  EXPECT_EQ(forced.skipped(), 1u);
  EXPECT_EQ(w.ExistOne("k2"), 0);

  ASSERT_EQ(w.PutEndOne("k4", 4), code::kOk);
  EXPECT_EQ(w.RemoveAll().removed(), 1u);
  EXPECT_EQ(w.QueryByRegex(".*").objects_size(), 0);
  auto empty = w.RemoveAll();
  EXPECT_EQ(empty.removed(), 0u);
  EXPECT_EQ(empty.skipped(), 0u);
}

}  // namespace
}  // namespace granary::it
