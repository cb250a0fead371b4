// One-round-trip puts into reserved space, end to end: real master, node and clients. The bytes
// of every object are checked by another client; a client killed while holding reservations
// gets no space back before its lease and the write quarantine are over; a reservation whose
// commit outcome the client does not know is never written again.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "../tools/test_pattern.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

using Bytes = std::vector<std::byte>;
using SteadyClock = std::chrono::steady_clock;

ByteSpan Span(const Bytes& b) { return ByteSpan(b.data(), b.size()); }

// Bytes used in the store's one segment, as `observer` lists it (UINT64_MAX if it cannot).
uint64_t SegmentUsed(Client& observer) {
  auto segments = observer.ListSegments();
  return segments.ok() && segments->size() == 1 ? (*segments)[0].used_bytes : UINT64_MAX;
}

class ReservedPutTest : public StoreTest {};

// Puts until at least `want` went through reserved space (the first ones of a size miss and
// go the two-call way while the pool fills in the background).
void PutUntilReserved(Client& writer, const std::string& prefix, uint64_t size, uint64_t want,
                      std::vector<std::pair<std::string, Bytes>>& written) {
  for (int i = 0; i < 400 && writer.Stats().reserved_puts < want; ++i) {
    std::string key = prefix + std::to_string(i);
    Bytes value = testdata::Pattern(key, size);
    Status s = writer.Put(key, Span(value));
    ASSERT_TRUE(s.ok()) << s.ToString();
    written.emplace_back(std::move(key), std::move(value));
    if (writer.Stats().reserved_puts == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(writer.Stats().reserved_puts, want) << "the reserved path was never taken";
}

TEST_F(ReservedPutTest, ObjectsPutInOneCallAreReadByteExactByAnotherClient) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  for (bool shm : {true, false}) {
    SCOPED_TRACE(shm ? "shared memory" : "tcp");
    auto writer = cluster_.MakeClient(shm);
    auto reader = cluster_.MakeClient(!shm);
    ASSERT_NE(writer, nullptr);
    ASSERT_NE(reader, nullptr);
    std::vector<std::pair<std::string, Bytes>> written;
    PutUntilReserved(*writer, shm ? "r/shm/" : "r/tcp/", 64 * KiB + 3, 20, written);
    for (const auto& [key, value] : written) {
      auto got = reader->Get(key);
      ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
      EXPECT_LT(testdata::FirstDifference(*got, value), 0) << "wrong bytes for " << key;
    }
    // Write-once: a second put of a key keeps the first bytes, reserved path or not.
    const Bytes other = testdata::Pattern("other", 64 * KiB + 3);
    EXPECT_TRUE(writer->Put(written[0].first, Span(other)).ok());
    auto got = reader->Get(written[0].first);
    ASSERT_TRUE(got.ok());
    EXPECT_LT(testdata::FirstDifference(*got, written[0].second), 0);
    // Upsert replaces them.
    EXPECT_TRUE(writer->Upsert(written[1].first, Span(other)).ok());
    got = reader->Get(written[1].first);
    ASSERT_TRUE(got.ok());
    EXPECT_LT(testdata::FirstDifference(*got, other), 0);
  }
}

// Objects of many sizes near each other (each of 60-64 KiB a different size) share reserved
// space: most go in one call, each is read back byte-exact, and once the writer has closed (its
// unused reservations released) the segment holds exactly the objects: every reservation was
// trimmed to its object at commit.
TEST_F(ReservedPutTest, ObjectsOfManyNearbySizesShareReservedSpaceAndKeepOnlyTheirBytes) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  auto observer = cluster_.MakeClient(false);
  ASSERT_NE(observer, nullptr);
  auto used = [&] { return SegmentUsed(*observer); };
  uint64_t held_by_objects = 0;
  for (bool shm : {true, false}) {
    SCOPED_TRACE(shm ? "shared memory" : "tcp");
    auto writer = cluster_.MakeClient(shm);
    auto reader = cluster_.MakeClient(!shm);
    ASSERT_NE(writer, nullptr);
    ASSERT_NE(reader, nullptr);
    std::vector<std::pair<std::string, Bytes>> written;
    for (uint64_t i = 0; i < 120; ++i) {
      std::string key = (shm ? "near/shm/" : "near/tcp/") + std::to_string(i);
      Bytes value = testdata::Pattern(key, 64 * KiB - (i * 37) % (4 * KiB));
      Status s = writer->Put(key, Span(value));
      ASSERT_TRUE(s.ok()) << s.ToString();
      held_by_objects += (value.size() + 63) / 64 * 64;
      written.emplace_back(std::move(key), std::move(value));
      // The pool refills in the background; a loaded machine may lag it behind the puts. Wait
      // (bounded) for it to hold space: one class for the 120 sizes is what is checked, and
      // with a class per size nothing held would fit the next size anyway.
      ASSERT_TRUE(WaitUntil([&] { return writer->Stats().reservations_held > 0; }, Millis(2000),
                            Millis(2)))
          << "the pool never refilled after put " << i;
    }
    EXPECT_GE(writer->Stats().reserved_puts, 110u) << "120 sizes, one class: most put in one call";
    for (const auto& [key, value] : written) {
      auto got = reader->Get(key);
      ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
      EXPECT_EQ(got->size(), value.size()) << key;
      EXPECT_LT(testdata::FirstDifference(*got, value), 0) << "wrong bytes for " << key;
    }
    writer->Close();
    EXPECT_TRUE(WaitUntil([&] { return used() == held_by_objects; }, Millis(3000), Millis(50)))
        << "used " << used() << ", the objects hold " << held_by_objects;
  }
}

// Keys the master's /metrics counts as carried by `method`'s calls (-1 if it did not answer).
int64_t RpcKeys(StoreCluster& cluster, const std::string& method) {
  const std::string body = HttpGet(cluster.master().http_port(), "/metrics").body;
  const std::string name = "granary_master_rpc_keys_total{method=\"" + method + "\"} ";
  size_t at = body.find(name);
  if (at == std::string::npos) return -1;
  return std::stoll(body.substr(at + name.size()));
}

// A batch goes to the master in one operation, whichever way: all of it into reserved space, or
// (when the pool cannot cover every key) all of it the two-call way, never split between them.
// The prefix eviction policy reads a batch's tail and length from that operation.
TEST_F(ReservedPutTest, ABatchIsNeverSplitBetweenReservedSpaceAndTheTwoCallPut) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  ClientOptions options;
  options.reserve_bytes = 4 * 64 * KiB;  // a stock of four 64 KiB reservations at most
  auto writer = cluster_.MakeClient(true, options);
  auto reader = cluster_.MakeClient(false);
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(reader, nullptr);
  std::vector<std::pair<std::string, Bytes>> written;
  PutUntilReserved(*writer, "warm/", 64 * KiB, 2, written);
  auto batch_put = [&](const std::string& prefix, int n) {
    std::vector<std::string> keys;
    std::vector<Bytes> values;
    std::vector<ByteSpan> spans;
    for (int i = 0; i < n; ++i) {
      keys.push_back(prefix + std::to_string(i));
      values.push_back(testdata::Pattern(keys.back(), 64 * KiB));
    }
    for (const auto& v : values) spans.push_back(Span(v));
    for (const Status& s : writer->BatchPut(keys, spans)) ASSERT_TRUE(s.ok()) << s.ToString();
    for (int i = 0; i < n; ++i) written.emplace_back(keys[i], values[i]);
  };
  auto stocked = [&](uint64_t n) {
    return WaitUntil([&] { return writer->Stats().reservations_held >= n; }, Millis(5000),
                     Millis(10));
  };
  // Six keys against a stock of at most four: all six the two-call way.
  ASSERT_TRUE(stocked(2)) << "the pool never refilled";
  const uint64_t reserved = writer->Stats().reserved_puts;
  const int64_t committed = RpcKeys(cluster_, "BatchPutCommit");
  const int64_t ended = RpcKeys(cluster_, "BatchPutEnd");
  ASSERT_GE(committed, 0);
  ASSERT_GE(ended, 0);
  batch_put("six/", 6);
  EXPECT_EQ(writer->Stats().reserved_puts, reserved);
  EXPECT_EQ(RpcKeys(cluster_, "BatchPutCommit"), committed);
  EXPECT_EQ(RpcKeys(cluster_, "BatchPutEnd"), ended + 6);
  // Two keys the stock covers: both in one commit.
  ASSERT_TRUE(stocked(2)) << "the pool never refilled";
  batch_put("two/", 2);
  EXPECT_EQ(writer->Stats().reserved_puts, reserved + 2);
  EXPECT_EQ(RpcKeys(cluster_, "BatchPutCommit"), committed + 2);
  EXPECT_EQ(RpcKeys(cluster_, "BatchPutEnd"), ended + 6);
  for (const auto& [key, value] : written) {
    auto got = reader->Get(key);
    ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
    EXPECT_LT(testdata::FirstDifference(*got, value), 0) << "wrong bytes for " << key;
  }
}

TEST_F(ReservedPutTest, ClosingAClientGivesItsReservationsBack) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  auto observer = cluster_.MakeClient(false);
  ASSERT_NE(observer, nullptr);
  auto used = [&] { return SegmentUsed(*observer); };
  uint64_t used_after_puts = 0;
  {
    auto writer = cluster_.MakeClient(true);
    ASSERT_NE(writer, nullptr);
    std::vector<std::pair<std::string, Bytes>> written;
    PutUntilReserved(*writer, "close/", 256 * KiB, 4, written);
    // The pool refills in the background: measure once it holds space again (CI measured
    // between a put that took the pool's last reservation and the refill).
    ASSERT_TRUE(WaitUntil([&] { return writer->Stats().reservations_held > 0; }, Millis(5000),
                          Millis(20)))
        << "the pool never refilled";
    used_after_puts = used();
    writer->Close();
  }
  // What the objects hold stays; the reserved rest goes at once.
  EXPECT_TRUE(WaitUntil([&] { return used() < used_after_puts; }, Millis(3000), Millis(50)))
      << "used " << used() << " of " << used_after_puts << " before close";
}

// A client killed while it holds reserved space may have been paused mid-copy: the space must
// not go to anyone before the lease (2 s) and the write quarantine (2 s) are over, then it must.
// The master's gauge of extents reserved (its /metrics), or -1 if it did not answer.
int64_t ReservationsGauge(StoreCluster& cluster) {
  const std::string body = HttpGet(cluster.master().http_port(), "/metrics").body;
  const std::string name = "\ngranary_master_reservations ";
  size_t at = body.find(name);
  if (at == std::string::npos) return -1;
  return std::stoll(body.substr(at + name.size()));
}

// A commit sent to a paused master times out in the client, then applies when the master
// resumes: the client cannot tell, so it must never write that reservation again. Its pool holds
// one reservation only, so a client that put it back would hand it to the very next put.
TEST_F(ReservedPutTest, AReservationWhoseCommitOutcomeIsUnknownIsNeverWrittenAgain) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  constexpr uint64_t kSize = 256 * KiB;
  ClientOptions one;
  one.reserve_bytes = kSize;
  one.rpc_timeout_ms = 1000;
  auto writer = cluster_.MakeClient(true, one);
  ClientOptions no_reserve;
  no_reserve.reserve_bytes = 0;
  auto reader = cluster_.MakeClient(false, no_reserve);
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(reader, nullptr);
  std::vector<std::pair<std::string, Bytes>> written;
  PutUntilReserved(*writer, "unknown/warm/", kSize, 1, written);
  // The pool refills its one reservation in the background: the master granted it, and the
  // writer's pool holds it (else the put below would go the two-call way).
  ASSERT_TRUE(WaitUntil(
      [&] { return ReservationsGauge(cluster_) == 1 && writer->Stats().reservations_held == 1; },
      Millis(5000), Millis(20)))
      << "reservations held: " << ReservationsGauge(cluster_) << " at the master, "
      << writer->Stats().reservations_held << " in the pool";

  const Bytes a = testdata::Pattern("unknown/a", kSize);
  ASSERT_TRUE(cluster_.master().process().Kill(SIGSTOP));
  ASSERT_TRUE(cluster_.master().process().WaitStopped(Millis(2000)));
  const uint64_t reserved_before = writer->Stats().reserved_puts;
  Status put_a = writer->Put("unknown/a", Span(a));  // copied into the reservation; commit hangs
  ASSERT_TRUE(cluster_.master().process().Kill(SIGCONT));
  EXPECT_FALSE(put_a.ok()) << "a commit to a paused master answered";
  EXPECT_EQ(writer->Stats().reserved_puts, reserved_before);

  // The master reads the commit that waited in its socket and applies it: "a" is readable now,
  // in the extent the writer reserved, though its writer was told the put failed.
  ASSERT_TRUE(WaitUntil([&] { return reader->Get("unknown/a").ok(); }, Millis(5000), Millis(50)))
      << "the commit sent to the paused master never applied; the test could not pose its case";

  // The writer's next puts of that size must go elsewhere.
  for (int i = 0; i < 4; ++i) {
    const std::string key = "unknown/b" + std::to_string(i);
    Bytes b = testdata::Pattern(key, kSize);
    Status s = writer->Put(key, Span(b));
    ASSERT_TRUE(s.ok()) << s.ToString();
    written.emplace_back(key, std::move(b));
  }
  written.emplace_back("unknown/a", a);
  for (const auto& [key, value] : written) {
    auto got = reader->Get(key);
    ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
    EXPECT_LT(testdata::FirstDifference(*got, value), 0) << "wrong bytes for " << key;
  }
}

TEST_F(ReservedPutTest, AKilledClientsReservationsComeBackOnlyAfterLeaseAndQuarantine) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB,
                             {{"--reservation-ttl", "2s"}, {"--write-quarantine", "2s"},
                              {"--eviction-high-watermark", "1.0"}}));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  auto used = [&] { return SegmentUsed(*client); };
  // 48 MiB of pinned objects (eviction cannot make room), then 16 MiB reserved (a quarter).
  ClientOptions no_reserve;
  no_reserve.reserve_bytes = 0;  // the two-call path: plain allocations
  auto writer = cluster_.MakeClient(false, no_reserve);
  ASSERT_NE(writer, nullptr);
  ReplicateConfig pinned;
  pinned.with_hard_pin = true;
  for (int i = 0; i < 12; ++i) {
    const std::string key = "fill/" + std::to_string(i);
    ASSERT_TRUE(writer->Put(key, Span(testdata::Pattern(key, 4 * MiB)), pinned).ok());
  }
  const uint64_t used_full = used();

  ChildProcess worker;
  std::string error;
  TempDir dir("granary-it-reserve");
  ASSERT_TRUE(worker.Start(BinaryPath("granary-test-worker"),
                           {"reserve-and-hang", "--master", cluster_.master_address(), "--size",
                            std::to_string(4 * MiB), "--count", "4"},
                           dir.File("worker.log"), &error))
      << error;
  ASSERT_TRUE(WaitForLog(worker, "reserved 4", Millis(10'000))) << worker.LogContents();
  const auto reserved_at = SteadyClock::now();
  worker.KillAndReap();
  EXPECT_EQ(used(), used_full + 16 * MiB);

  // The segment is full: until lease + quarantine (4 s) a put finds no room.
  const Bytes value = testdata::Pattern("after", 4 * MiB);
  while (SteadyClock::now() - reserved_at < Millis(3500)) {
    Status s = writer->Put("after", Span(value));
    ASSERT_FALSE(s.ok()) << "space of a killed client's reservation was handed out "
                         << std::chrono::duration_cast<Millis>(SteadyClock::now() - reserved_at).count()
                         << " ms after it was granted";
    std::this_thread::sleep_for(Millis(100));
  }
  EXPECT_TRUE(WaitUntil([&] { return writer->Put("after", Span(value)).ok(); }, Millis(6000),
                        Millis(100)))
      << "the space never came back; used " << used();
  auto got = client->Get("after");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_LT(testdata::FirstDifference(*got, value), 0);
}

}  // namespace
}  // namespace granary::it
