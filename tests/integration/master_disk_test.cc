// The SSD tier's master RPCs against the real granary-master: a node (played over gRPC) offloads
// the objects the persistence policy picks, registers its disk inventory after a master restart,
// drops copies its disk evicted, and learns which copies the master let go (disk garbage). The
// node's own disk I/O is tested with the node.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <sstream>
#include <thread>

#include "master/history/history_file.h"
#include "master/state/state_codec.h"
#include "master_fixture.h"

namespace granary::it {
namespace {

class MasterDiskTest : public MasterTest {
 protected:
  // Each played node has one disk.
  static uint64_t DiskOf(const std::string& node) { return std::hash<std::string>{}(node) | 1; }
  template <typename Req, typename Resp>
  Resp Call(grpc::Status (pb::Master::Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
            const Req& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    Resp resp;
    grpc::Status s = (master_.stub()->*method)(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }
  pb::OffloadStartResponse OffloadStart(const std::string& node, uint32_t max_keys = 100,
                                        uint64_t max_bytes = 1ull << 40,
                                        const std::vector<uint64_t>& deleted_ids = {}) {
    pb::OffloadStartRequest req;
    req.set_client_id(node);
    req.set_max_keys(max_keys);
    req.set_max_bytes(max_bytes);
    req.set_disk_id(DiskOf(node));
    for (uint64_t id : deleted_ids) req.add_deleted_ids(id);
    return Call(&pb::Master::Stub::OffloadStart, req);
  }
  pb::BatchStatusResponse OffloadEnd(const std::string& node,
                                     const google::protobuf::RepeatedPtrField<pb::OffloadItem>& items,
                                     uint64_t first_location, bool written = true) {
    pb::OffloadEndRequest req;
    req.set_client_id(node);
    req.set_disk_id(DiskOf(node));
    for (const auto& item : items) {
      req.add_keys(item.key());
      req.add_version_gens(item.version_gen());
      req.add_locations(first_location++);
      req.add_written(written);
    }
    return Call(&pb::Master::Stub::OffloadEnd, req);
  }
  // One request holding the disk's whole inventory.
  pb::BatchStatusResponse Register(const std::string& node, const std::vector<pb::DiskCopy>& copies) {
    pb::DiskRegisterRequest req;
    req.set_client_id(node);
    req.set_disk_id(DiskOf(node));
    req.set_complete(true);
    for (const auto& c : copies) *req.add_copies() = c;
    return Call(&pb::Master::Stub::DiskRegister, req);
  }
  static pb::DiskCopy Copy(const std::string& key, uint64_t size, uint64_t checksum,
                           uint64_t location) {
    pb::DiskCopy c;
    c.set_key(key);
    c.set_size(size);
    c.set_checksum(checksum);
    c.set_location(location);
    return c;
  }
};

TEST_F(MasterDiskTest, EagerOffloadNamesEveryObjectOnTheNodesSegmentOnce) {
  ASSERT_TRUE(StartMaster({"--persistence", "eager"}));
  MasterClient node = Client("node-1");
  MasterClient other = Client("node-2");
  ASSERT_EQ(node.Mount("seg-1", 4 * MiB, "127.0.0.1:7001").code(), code::kOk);
  ASSERT_EQ(other.Mount("seg-2", 4 * MiB, "127.0.0.1:7002").code(), code::kOk);
  Register("node-1", {});  // an empty disk: it may offload from now on
  MasterClient w = Client("writer");
  pb::ReplicateConfig on_1 = Replicas(1);
  on_1.add_preferred_segments("seg-1");
  pb::ReplicateConfig on_2 = Replicas(1);
  on_2.add_preferred_segments("seg-2");
  ASSERT_EQ(w.Put("a", 1000, 11, on_1), code::kOk);
  ASSERT_EQ(w.Put("b", 2000, 22, on_1), code::kOk);
  ASSERT_EQ(w.Put("elsewhere", 3000, 33, on_2), code::kOk);
  ASSERT_EQ(w.PutStartOne("writing", 4000, on_1).code(), code::kOk);

  auto started = OffloadStart("node-1");
  ASSERT_EQ(started.code(), code::kOk) << started.message();
  ASSERT_EQ(started.items_size(), 2) << "only complete objects in node-1's own memory";
  EXPECT_EQ(started.items(0).key(), "a") << "eager goes in commit order";
  EXPECT_EQ(started.items(0).size(), 1000u);
  EXPECT_EQ(started.items(0).checksum(), 11u);
  EXPECT_EQ(started.items(0).source().segment_name(), "seg-1");
  EXPECT_EQ(started.items(1).key(), "b");
  EXPECT_EQ(OffloadStart("node-1").items_size(), 0) << "a key under offload was named twice";

  // "a" written, "b" given up: only "a" gains a disk replica, and "b" is offered again.
  pb::OffloadEndRequest end;
  end.set_client_id("node-1");
  end.set_disk_id(DiskOf("node-1"));
  for (int i = 0; i < 2; ++i) {
    end.add_keys(started.items(i).key());
    end.add_version_gens(started.items(i).version_gen());
    end.add_locations(100 + i);
    end.add_written(i == 0);
  }
  auto ended = Call(&pb::Master::Stub::OffloadEnd, end);
  ASSERT_EQ(ended.results_size(), 2);
  EXPECT_EQ(ended.results(0).code(), code::kOk) << ended.results(0).message();
  EXPECT_EQ(ended.results(1).code(), code::kOk) << ended.results(1).message();
  auto stat = w.Stat("a");
  ASSERT_EQ(stat.disk_replicas_size(), 1);
  EXPECT_EQ(stat.disk_replicas(0).node_id(), "node-1");
  EXPECT_EQ(stat.disk_replicas(0).location(), 100u);
  EXPECT_EQ(stat.disk_replicas(0).endpoint(), "127.0.0.1:7001");
  EXPECT_EQ(w.Stat("b").disk_replicas_size(), 0);
  auto again = OffloadStart("node-1");
  ASSERT_EQ(again.items_size(), 1);
  EXPECT_EQ(again.items(0).key(), "b");

  // The object upserted while it was being copied: the copy is refused, the new bytes stay.
  ASSERT_EQ(w.Put("b", 2500, 25, on_1, /*upsert=*/true), code::kOk);
  auto stale = OffloadEnd("node-1", again.items(), 200);
  ASSERT_EQ(stale.results_size(), 1);
  EXPECT_EQ(stale.results(0).code(), code::kObjectNotFound) << "a stale copy was attached";
  EXPECT_EQ(w.Stat("b").disk_replicas_size(), 0);
  EXPECT_EQ(w.Stat("b").size(), 2500u);
}

TEST_F(MasterDiskTest, LazyOffloadWaitsForTheWatermarkAndTakesTheLeastRecentlyReadFirst) {
  // Lazy is the default. The order is s3fifo's and lru's (prefix follows its queues instead:
  // prefix_eviction_test.cc).
  ASSERT_TRUE(StartMaster({"--offload-watermark", "0.5", "--eviction-policy", "s3fifo"}));
  MasterClient node = Client("node-1");
  ASSERT_EQ(node.Mount("seg-1", 1 * MiB, "127.0.0.1:7001").code(), code::kOk);
  Register("node-1", {});
  MasterClient w = Client("writer");
  // Access times are wall-clock milliseconds: a few apart, so that the order is the test's.
  auto step = [] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); };
  ASSERT_EQ(w.Put("k0", 200 * KiB), code::kOk);
  step();
  ASSERT_EQ(w.Put("k1", 200 * KiB), code::kOk);
  step();
  EXPECT_EQ(OffloadStart("node-1").items_size(), 0) << "offloaded below the watermark";
  ASSERT_EQ(w.Put("k2", 200 * KiB), code::kOk);
  step();
  ASSERT_EQ(w.Touch("k0"), code::kOk);  // k0 is now the most recently read
  auto started = OffloadStart("node-1", 2);
  ASSERT_EQ(started.items_size(), 2);
  EXPECT_EQ(started.items(0).key(), "k1");
  EXPECT_EQ(started.items(1).key(), "k2");
}

TEST_F(MasterDiskTest, TheDiskInventoryComesBackAfterAMasterRestart) {
  ASSERT_TRUE(StartMaster());
  MasterClient node = Client("node-1");
  ASSERT_EQ(node.Mount("seg-1", 1 * MiB, "127.0.0.1:7001").code(), code::kOk);
  // Memory contents are lost with the master (until HA); what the node's disk holds is not.
  ASSERT_TRUE(master_.Restart());
  ASSERT_EQ(node.Mount("seg-1", 1 * MiB, "127.0.0.1:7001").code(), code::kOk);
  auto registered = Register("node-1", {Copy("d1", 5 * MiB, 7, 1), Copy("d2", 4096, 8, 2),
                                        Copy("", 1, 1, 3), Copy("huge", 1ull << 62, 1, 4)});
  ASSERT_EQ(registered.results_size(), 4);
  EXPECT_EQ(registered.results(0).code(), code::kOk) << registered.results(0).message();
  EXPECT_EQ(registered.results(1).code(), code::kOk);
  EXPECT_EQ(registered.results(2).code(), code::kInvalidKey);
  EXPECT_EQ(registered.results(3).code(), code::kInvalidParams);
  MasterClient r = Client("reader");
  EXPECT_EQ(r.Exist({"d1", "d2", "huge"}), (std::vector<int32_t>{1, 1, 0}));
  EXPECT_EQ(r.GetSize({"d1"})[0], static_cast<int64_t>(5 * MiB)) << "larger than memory: fine";
  auto got = r.GetOne("d1");
  ASSERT_EQ(got.disk_replicas_size(), 1);
  EXPECT_EQ(got.disk_replicas(0).location(), 1u);
  EXPECT_EQ(got.replicas_size(), 0);
  // Readable: through the node's data server, named by the disk replica's endpoint.
  EXPECT_EQ(got.code(), code::kOk) << got.message();
  EXPECT_EQ(got.disk_replicas(0).endpoint(), "127.0.0.1:7001");
  EXPECT_EQ(got.checksum(), 7u);
  EXPECT_EQ(r.FinishReadOne("d1"), code::kOk);

  // The node's disk evicts d1: gone at once; a wrong location drops nothing.
  pb::DiskDropRequest drop;
  drop.set_client_id("node-1");
  drop.add_keys("d1");
  drop.add_locations(1);
  drop.add_keys("d2");
  drop.add_locations(99);
  auto dropped = Call(&pb::Master::Stub::DiskDrop, drop);
  ASSERT_EQ(dropped.results_size(), 2);
  EXPECT_EQ(dropped.results(0).code(), code::kOk);
  EXPECT_EQ(dropped.results(1).code(), code::kObjectNotFound);
  EXPECT_EQ(r.Exist({"d1", "d2"}), (std::vector<int32_t>{0, 1}));

  // A stranger registers nothing.
  EXPECT_EQ(Register("stranger", {Copy("x", 1, 1, 1)}).results(0).code(), code::kIllegalClient);

  // The node's pings carry its disk tier's size and use; segments list them with the node.
  pb::PingRequest ping;
  ping.set_client_id("node-1");
  ping.mutable_disk()->set_capacity_bytes(100 * MiB);
  ping.mutable_disk()->set_used_bytes(5 * MiB);
  ping.mutable_disk()->set_object_count(2);
  EXPECT_EQ(Call(&pb::Master::Stub::Ping, ping).code(), code::kOk);
  pb::SegmentInfo info;
  ASSERT_TRUE(node.FindSegment("seg-1", &info));
  EXPECT_EQ(info.node_disk().capacity_bytes(), 100 * MiB);
  EXPECT_EQ(info.node_disk().used_bytes(), 5 * MiB);
  EXPECT_EQ(info.node_disk().object_count(), 2u);

  // Its node unmounts: d2's disk copy has no data server to be read from. A miss, and no read
  // lock is left behind (a remove goes through at once, not OBJECT_HAS_LEASE).
  ASSERT_EQ(node.Unmount("seg-1").code(), code::kOk);
  auto orphan = r.GetOne("d2");
  ASSERT_GT(orphan.disk_replicas_size(), 0) << "the unmount dropped the disk copy: nothing to test";
  {
    EXPECT_EQ(orphan.code(), code::kObjectNotFound) << orphan.message();
    auto removed = r.Remove({"d2"});
    ASSERT_EQ(removed.results_size(), 1);
    EXPECT_EQ(removed.results(0).code(), code::kOk) << removed.results(0).message();
  }
}

TEST_F(MasterDiskTest, MalformedOffloadCallsAreRefusedWholesale) {
  ASSERT_TRUE(StartMaster({"--persistence", "eager"}));
  EXPECT_EQ(OffloadStart("nobody").code(), code::kIllegalClient);
  MasterClient node = Client("node-1");
  ASSERT_EQ(node.Mount("seg-1", 1 * MiB, "127.0.0.1:7001").code(), code::kOk);
  ASSERT_EQ(Client("w").Put("k", 100), code::kOk);
  auto unregistered = OffloadStart("node-1");
  EXPECT_TRUE(unregistered.disk_unknown()) << "offload from a disk that never registered";
  EXPECT_EQ(unregistered.items_size(), 0);
  Register("node-1", {});
  auto started = OffloadStart("node-1");
  ASSERT_EQ(started.items_size(), 1);
  pb::OffloadEndRequest bad;
  bad.set_client_id("node-1");
  bad.set_disk_id(DiskOf("node-1"));
  bad.add_keys("k");
  bad.add_version_gens(started.items(0).version_gen());
  auto refused = Call(&pb::Master::Stub::OffloadEnd, bad);  // no location, no outcome
  ASSERT_EQ(refused.results_size(), 1);
  EXPECT_EQ(refused.results(0).code(), code::kInvalidParams);
  // Another node may not end node-1's offload, nor a wrong version.
  auto foreign = OffloadEnd("node-2", started.items(), 5);
  EXPECT_EQ(foreign.results(0).code(), code::kIllegalClient);
  auto item = started.items(0);
  item.set_version_gen(item.version_gen() + 1);
  google::protobuf::RepeatedPtrField<pb::OffloadItem> wrong;
  *wrong.Add() = item;
  EXPECT_EQ(OffloadEnd("node-1", wrong, 5).results(0).code(), code::kIllegalClient);
  EXPECT_EQ(OffloadEnd("node-1", started.items(), 5).results(0).code(), code::kOk);
  ExpectServing();
}


// Stale copies: a removed object's disk copy is named to its node in every OffloadStart answer
// (even under --persistence none, and with nothing to offload) until the node acknowledges it;
// the disk may not bring it back. An acknowledgement is an operation of the ordered history; an
// idle round is none.
TEST_F(MasterDiskTest, OffloadStartNamesTheDiskGarbageUntilTheNodeAcknowledgesIt) {
  const std::string history = master_.dir().path() + "/history";
  ASSERT_TRUE(StartMaster({"--persistence", "none", "--history-file", history}));
  MasterClient node = Client("node-1");
  ASSERT_EQ(node.Mount("seg-1", 1 * MiB, "127.0.0.1:7001").code(), code::kOk);
  auto registered = Register("node-1", {Copy("d1", 4096, 7, 11), Copy("d2", 4096, 8, 12)});
  ASSERT_EQ(registered.results_size(), 2);
  ASSERT_EQ(registered.results(0).code(), code::kOk);
  MasterClient w = Client("writer");
  ASSERT_EQ(w.RemoveOne("d1"), code::kOk);
  auto metric = [&] {
    auto doc = nlohmann::json::parse(HttpGet(master_.http_port(), "/status").body, nullptr, false);
    return doc.is_object() && doc.contains("disk_garbage") ? doc["disk_garbage"].get<int64_t>() : -1;
  };
  EXPECT_EQ(metric(), 1);

  auto told = OffloadStart("node-1");
  ASSERT_EQ(told.code(), code::kOk) << told.message();
  EXPECT_EQ(told.items_size(), 0);
  ASSERT_EQ(told.delete_keys_size(), 1);
  ASSERT_EQ(told.delete_locations_size(), 1);
  ASSERT_EQ(told.delete_ids_size(), 1);
  EXPECT_EQ(told.delete_keys(0), "d1");
  EXPECT_EQ(told.delete_locations(0), 11u);
  EXPECT_FALSE(told.disk_unknown());
  EXPECT_EQ(OffloadStart("node-2").delete_keys_size(), 0) << "another disk was told";

  // Until the node deletes it, a registration (a restart) may not bring it back.
  auto back = Register("node-1", {Copy("d1", 4096, 7, 11)});
  ASSERT_EQ(back.results_size(), 1);
  EXPECT_EQ(back.results(0).code(), code::kObjectNotFound);
  EXPECT_EQ(w.Exist({"d1", "d2"}), (std::vector<int32_t>{0, 1}));

  // Asked again without an acknowledgement: named again.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(OffloadStart("node-1").delete_ids_size(), 1);
  // Acknowledged: gone from the answers and from the metric; a repeated ack is harmless.
  EXPECT_EQ(OffloadStart("node-1", 100, 1ull << 40, {told.delete_ids(0)}).delete_ids_size(), 0);
  EXPECT_EQ(OffloadStart("node-1", 100, 1ull << 40, {told.delete_ids(0)}).code(), code::kOk);
  EXPECT_EQ(metric(), 0);
  // Acknowledged or not, the copy stays out: the disk is known, d1 is not.
  EXPECT_EQ(Register("node-1", {Copy("d1", 4096, 7, 11)}).results(0).code(), code::kObjectNotFound);
  EXPECT_EQ(w.ExistOne("d1"), 0);

  // The history holds the two acknowledgements, and nothing for the idle rounds.
  ASSERT_EQ(HttpGet(master_.http_port(), "/debug/digest").status, 200);  // flushes the file
  auto records = master::ReadHistoryRecords(history);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  int acks = 0, demotions = 0;
  for (size_t i = 1; i < records->size(); ++i) {
    auto op = master::DecodeOperation((*records)[i]);
    ASSERT_TRUE(op.ok());
    if (const auto* ack = std::get_if<master::DiskGarbageAckOp>(&op->body)) {
      acks++;
      EXPECT_EQ(ack->ids, (std::vector<uint64_t>{told.delete_ids(0)}));
      EXPECT_EQ(ack->disk_id, DiskOf("node-1"));
    }
    demotions += std::holds_alternative<master::DemoteStartOp>(op->body);
  }
  EXPECT_EQ(acks, 2);
  EXPECT_EQ(demotions, 0);
  ExpectServing();
}

// The value of the sample `series` (name and labels as rendered) on a /metrics page; -1 if absent.
double Sample(const std::string& page, const std::string& series) {
  std::istringstream lines(page);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

// Issue 22's cache figures: each key a BatchGetReplicaList answers counts once, as a memory hit,
// a disk hit (disk replicas only) or a miss; prefix matches and demotions are counted too.
TEST_F(MasterDiskTest, MetricsCountGetsByTierPrefixMatchesAndDemotions) {
  ASSERT_TRUE(StartMaster({"--persistence", "eager"}));
  MasterClient node = Client("node-1");
  ASSERT_EQ(node.Mount("seg-1", 4 * MiB, "127.0.0.1:7001").code(), code::kOk);
  auto registered = Register("node-1", {Copy("on-disk", 5000, 7, 1)});
  ASSERT_EQ(registered.results_size(), 1);
  ASSERT_EQ(registered.results(0).code(), code::kOk) << registered.results(0).message();
  MasterClient w = Client("writer");
  ASSERT_EQ(w.Put("in-memory", 64 * KiB, 9), code::kOk);

  MasterClient r = Client("reader");
  for (int i = 0; i < 2; ++i) ASSERT_EQ(r.GetOne("in-memory").code(), code::kOk);
  ASSERT_EQ(r.GetOne("on-disk").code(), code::kOk);
  EXPECT_EQ(r.GetOne("on-disk").replicas_size(), 0) << "not a disk-only object";
  auto mixed = r.Get({"in-memory", "nowhere", "on-disk"});
  ASSERT_EQ(mixed.results_size(), 3);
  EXPECT_EQ(mixed.results(1).code(), code::kObjectNotFound);
  auto matched = r.PrefixMatch({"in-memory", "on-disk", "nowhere", "in-memory"});
  ASSERT_EQ(matched.code(), code::kOk);
  ASSERT_EQ(matched.matched(), 2u);
  (void)r.PrefixMatch({"nowhere"});

  // Eager offload of the memory object: one demotion started, then completed.
  auto started = OffloadStart("node-1");
  ASSERT_EQ(started.items_size(), 1);
  auto ended = OffloadEnd("node-1", started.items(), 100);
  ASSERT_EQ(ended.results_size(), 1);
  EXPECT_EQ(ended.results(0).code(), code::kOk);

  const HttpResult page = HttpGet(master_.http_port(), "/metrics");
  ASSERT_EQ(page.status, 200) << page.error;
  SCOPED_TRACE(page.body);
  EXPECT_EQ(Sample(page.body, "granary_master_gets_total{outcome=\"memory_hit\"}"), 3);
  EXPECT_EQ(Sample(page.body, "granary_master_gets_total{outcome=\"disk_hit\"}"), 3);
  EXPECT_EQ(Sample(page.body, "granary_master_gets_total{outcome=\"miss\"}"), 1);
  EXPECT_EQ(Sample(page.body, "granary_master_get_hit_bytes_total{tier=\"memory\"}"),
            3.0 * 64 * KiB);
  EXPECT_EQ(Sample(page.body, "granary_master_get_hit_bytes_total{tier=\"disk\"}"), 3.0 * 5000);
  EXPECT_EQ(Sample(page.body, "granary_master_prefix_match_keys_count"), 2);
  EXPECT_EQ(Sample(page.body, "granary_master_prefix_match_keys_sum"), 2);
  EXPECT_EQ(Sample(page.body, "granary_master_prefix_match_keys_bucket{le=\"0\"}"), 1);
  EXPECT_EQ(Sample(page.body, "granary_master_demotions_total{outcome=\"started\"}"), 1);
  EXPECT_EQ(Sample(page.body, "granary_master_demotions_total{outcome=\"completed\"}"), 1);
  EXPECT_EQ(Sample(page.body, "granary_master_demotions_total{outcome=\"aborted\"}"), 0);
  EXPECT_EQ(Sample(page.body, "granary_master_evictions_total{reason=\"watermark\"}"), 0);
  EXPECT_EQ(Sample(page.body, "granary_master_evictions_total{reason=\"allocation\"}"), 0);
}

// A put that finds no space evicts, and the evictions count under reason="allocation".
TEST_F(MasterDiskTest, EvictionsForAFullStoreCountUnderAllocation) {
  // The watermark at 1: housekeeping evicts only from a segment exactly full; puts do the rest.
  ASSERT_TRUE(StartMaster({"--eviction-high-watermark", "1"}));
  MasterClient node = Client("node-1");
  ASSERT_EQ(node.Mount("seg-1", 1 * MiB, "127.0.0.1:7001").code(), code::kOk);
  MasterClient w = Client("writer");
  // Twice the segment: the later puts must evict the earlier objects to fit.
  for (int i = 0; i < 32; ++i) {
    ASSERT_EQ(w.Put("full" + std::to_string(i), 64 * KiB), code::kOk) << i;
  }
  const HttpResult page = HttpGet(master_.http_port(), "/metrics");
  ASSERT_EQ(page.status, 200) << page.error;
  const double allocation = Sample(page.body, "granary_master_evictions_total{reason=\"allocation\"}");
  const double watermark = Sample(page.body, "granary_master_evictions_total{reason=\"watermark\"}");
  EXPECT_GE(watermark, 0) << page.body;
  EXPECT_GE(allocation, 8) << page.body;
  EXPECT_GE(Sample(page.body, "granary_master_evicted_objects_total"), 16) << page.body;
}

}  // namespace
}  // namespace granary::it
