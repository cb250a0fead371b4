// master/ha/replication_log.h against its promises: a contiguous run of the newest operations in
// order within a byte bound (the newest kept even alone over it), kTooOld for what was dropped,
// bounded waits past the end that an Append or Close ends, Reset and non-contiguous Appends
// starting a new run, and reads batched by max_bytes (at least one operation).
#include "master/ha/replication_log.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "master/ha/stream_wire.h"

namespace granary::master::ha {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using RR = ReplicationLog::ReadResult;

std::string Op(uint64_t seq, size_t size = 8) {
  std::string s = "op" + std::to_string(seq) + ":";
  s.resize(std::max(size, s.size()), 'x');
  return s;
}

// The records of a Read's output, as strings (SplitOps is the stream's own parser).
std::vector<std::string> Records(const std::string& out) {
  auto split = SplitOps(out);
  EXPECT_TRUE(split.ok()) << split.status().ToString();
  std::vector<std::string> records;
  if (split.ok()) {
    for (std::string_view r : *split) records.emplace_back(r);
  }
  return records;
}

TEST(HaReplicationLog, EmptyLogHasFirstOnePastLast) {
  ReplicationLog log(1 << 20);
  EXPECT_EQ(log.last_seq(), 0u);
  EXPECT_EQ(log.first_seq(), 1u);
  EXPECT_EQ(log.bytes(), 0u);
  std::string out;
  uint64_t last = 0;
  EXPECT_EQ(log.Read(1, 1 << 20, 0ms, &out, &last), RR::kTimeout);
  EXPECT_TRUE(out.empty());
}

TEST(HaReplicationLog, ContiguousAppendsReadBackInOrder) {
  ReplicationLog log(1 << 20);
  size_t bytes = 0;
  for (uint64_t seq = 1; seq <= 20; ++seq) {
    log.Append(seq, Op(seq, seq));  // sizes differ, so a misplaced record shows
    bytes += Op(seq, seq).size();
  }
  EXPECT_EQ(log.first_seq(), 1u);
  EXPECT_EQ(log.last_seq(), 20u);
  EXPECT_EQ(log.bytes(), bytes);

  std::string out = "prefix";  // Read appends: what the caller put first stays
  uint64_t last = 0;
  ASSERT_EQ(log.Read(1, 1 << 20, 0ms, &out, &last), RR::kOk);
  EXPECT_EQ(last, 20u);
  ASSERT_EQ(out.substr(0, 6), "prefix");
  std::vector<std::string> records = Records(out.substr(6));
  ASSERT_EQ(records.size(), 20u);
  for (uint64_t seq = 1; seq <= 20; ++seq) EXPECT_EQ(records[seq - 1], Op(seq, seq));

  // From the middle: exactly the tail.
  out.clear();
  ASSERT_EQ(log.Read(13, 1 << 20, 0ms, &out, &last), RR::kOk);
  EXPECT_EQ(last, 20u);
  records = Records(out);
  ASSERT_EQ(records.size(), 8u);
  EXPECT_EQ(records.front(), Op(13, 13));
  EXPECT_EQ(records.back(), Op(20, 20));
}

TEST(HaReplicationLog, DroppedOperationsAreTooOld) {
  ReplicationLog log(20);  // room for two 8-byte operations, not three
  for (uint64_t seq = 1; seq <= 6; ++seq) log.Append(seq, Op(seq));
  EXPECT_LE(log.bytes(), 20u);
  EXPECT_EQ(log.last_seq(), 6u);
  EXPECT_EQ(log.first_seq(), 5u);
  std::string out;
  uint64_t last = 0;
  for (uint64_t from = 1; from <= 4; ++from) {
    EXPECT_EQ(log.Read(from, 1 << 20, 0ms, &out, &last), RR::kTooOld) << from;
    // kTooOld even with a long wait: it answers at once.
    const auto start = Clock::now();
    EXPECT_EQ(log.Read(from, 1 << 20, 2s, &out, &last), RR::kTooOld) << from;
    EXPECT_LT(Clock::now() - start, 500ms);
  }
  EXPECT_TRUE(out.empty()) << "a refused read appends nothing";
  ASSERT_EQ(log.Read(5, 1 << 20, 0ms, &out, &last), RR::kOk);
  EXPECT_EQ(last, 6u);
  EXPECT_EQ(Records(out), (std::vector<std::string>{Op(5), Op(6)}));
}

TEST(HaReplicationLog, TheNewestIsKeptEvenOverTheBound) {
  ReplicationLog log(16);
  log.Append(1, Op(1));
  log.Append(2, Op(2));
  const std::string big = Op(3, 1000);
  log.Append(3, big);
  EXPECT_EQ(log.first_seq(), 3u);
  EXPECT_EQ(log.last_seq(), 3u);
  EXPECT_EQ(log.bytes(), big.size());
  std::string out;
  uint64_t last = 0;
  ASSERT_EQ(log.Read(3, 16, 0ms, &out, &last), RR::kOk);
  EXPECT_EQ(last, 3u);
  EXPECT_EQ(Records(out), std::vector<std::string>{big});
  EXPECT_EQ(log.Read(2, 16, 0ms, &out, &last), RR::kTooOld);

  // The next small one pushes the big one out.
  log.Append(4, Op(4));
  EXPECT_EQ(log.first_seq(), 4u);
  EXPECT_EQ(log.bytes(), Op(4).size());
}

TEST(HaReplicationLog, ReadPastTheEndWaitsBoundedAndTimesOut) {
  ReplicationLog log(1 << 20);
  log.Append(1, Op(1));
  std::string out;
  uint64_t last = 77;
  const auto start = Clock::now();
  EXPECT_EQ(log.Read(2, 1 << 20, 60ms, &out, &last), RR::kTimeout);
  const auto waited = Clock::now() - start;
  EXPECT_GE(waited, 55ms);
  EXPECT_LT(waited, 1s);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(last, 77u) << "*last untouched without an operation";
  // Far past the end: an append that does not reach `from` does not end the wait with kOk.
  std::thread appender([&] {
    std::this_thread::sleep_for(10ms);
    log.Append(2, Op(2));
  });
  EXPECT_EQ(log.Read(5, 1 << 20, 80ms, &out, &last), RR::kTimeout);
  appender.join();
  EXPECT_TRUE(out.empty());
}

TEST(HaReplicationLog, AnAppendWakesAWaitingRead) {
  ReplicationLog log(1 << 20);
  for (uint64_t seq = 1; seq <= 3; ++seq) log.Append(seq, Op(seq));
  auto reader = std::async(std::launch::async, [&] {
    std::string out;
    uint64_t last = 0;
    const auto start = Clock::now();
    RR r = log.Read(4, 1 << 20, 10s, &out, &last);
    return std::make_tuple(r, last, out, Clock::now() - start);
  });
  std::this_thread::sleep_for(30ms);
  ASSERT_EQ(reader.wait_for(0ms), std::future_status::timeout) << "Read returned before the append";
  log.Append(4, Op(4));
  ASSERT_EQ(reader.wait_for(5s), std::future_status::ready);
  auto [r, last, out, took] = reader.get();
  EXPECT_EQ(r, RR::kOk);
  EXPECT_EQ(last, 4u);
  EXPECT_EQ(Records(out), std::vector<std::string>{Op(4)});
  EXPECT_LT(took, 5s);
}

TEST(HaReplicationLog, CloseWakesAWaitingReadAndLaterReads) {
  ReplicationLog log(1 << 20);
  log.Append(1, Op(1));
  auto reader = std::async(std::launch::async, [&] {
    std::string out;
    uint64_t last = 0;
    return log.Read(2, 1 << 20, 10s, &out, &last);
  });
  std::this_thread::sleep_for(20ms);
  const auto start = Clock::now();
  log.Close();
  ASSERT_EQ(reader.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(reader.get(), RR::kClosed);
  EXPECT_LT(Clock::now() - start, 2s);
  // Later Reads too, even of what the log holds, and at once.
  std::string out;
  uint64_t last = 0;
  EXPECT_EQ(log.Read(1, 1 << 20, 0ms, &out, &last), RR::kClosed);
  const auto again = Clock::now();
  EXPECT_EQ(log.Read(2, 1 << 20, 5s, &out, &last), RR::kClosed);
  EXPECT_LT(Clock::now() - again, 1s);
  EXPECT_TRUE(out.empty());
}

TEST(HaReplicationLog, ResetStartsANewRun) {
  ReplicationLog log(1 << 20);
  for (uint64_t seq = 1; seq <= 3; ++seq) log.Append(seq, Op(seq));
  log.Reset(10);
  EXPECT_EQ(log.first_seq(), 11u);
  EXPECT_EQ(log.last_seq(), 10u);
  EXPECT_EQ(log.bytes(), 0u);
  std::string out;
  uint64_t last = 0;
  EXPECT_EQ(log.Read(3, 1 << 20, 0ms, &out, &last), RR::kTooOld);
  EXPECT_EQ(log.Read(10, 1 << 20, 0ms, &out, &last), RR::kTooOld);
  EXPECT_EQ(log.Read(11, 1 << 20, 10ms, &out, &last), RR::kTimeout);
  log.Append(11, Op(11));
  ASSERT_EQ(log.Read(11, 1 << 20, 0ms, &out, &last), RR::kOk);
  EXPECT_EQ(last, 11u);
  EXPECT_EQ(Records(out), std::vector<std::string>{Op(11)});

  // A Reset wakes a reader waiting for what the new run will never hold: it is now too old.
  auto reader = std::async(std::launch::async, [&] {
    std::string o;
    uint64_t l = 0;
    return log.Read(12, 1 << 20, 10s, &o, &l);
  });
  std::this_thread::sleep_for(20ms);
  log.Reset(50);
  ASSERT_EQ(reader.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(reader.get(), RR::kTooOld);

  // Reset backwards (a snapshot at a lower seq) is a new run too.
  log.Reset(5);
  EXPECT_EQ(log.first_seq(), 6u);
  log.Append(6, Op(6));
  EXPECT_EQ(log.last_seq(), 6u);
}

TEST(HaReplicationLog, ANonContiguousAppendStartsANewRun) {
  ReplicationLog log(1 << 20);
  for (uint64_t seq = 1; seq <= 3; ++seq) log.Append(seq, Op(seq));
  log.Append(7, Op(7));  // a gap
  EXPECT_EQ(log.first_seq(), 7u);
  EXPECT_EQ(log.last_seq(), 7u);
  EXPECT_EQ(log.bytes(), Op(7).size());
  std::string out;
  uint64_t last = 0;
  EXPECT_EQ(log.Read(3, 1 << 20, 0ms, &out, &last), RR::kTooOld);
  EXPECT_EQ(log.Read(4, 1 << 20, 0ms, &out, &last), RR::kTooOld) << "never a gap";
  ASSERT_EQ(log.Read(7, 1 << 20, 0ms, &out, &last), RR::kOk);
  EXPECT_EQ(Records(out), std::vector<std::string>{Op(7)});

  log.Append(5, Op(5));  // backwards
  EXPECT_EQ(log.first_seq(), 5u);
  EXPECT_EQ(log.last_seq(), 5u);
  log.Append(5, Op(5, 12));  // the same seq again: a new run holding only the new one
  EXPECT_EQ(log.first_seq(), 5u);
  EXPECT_EQ(log.last_seq(), 5u);
  out.clear();
  ASSERT_EQ(log.Read(5, 1 << 20, 0ms, &out, &last), RR::kOk);
  EXPECT_EQ(Records(out), std::vector<std::string>{Op(5, 12)});
}

TEST(HaReplicationLog, ReadsAreBatchedByMaxBytesWithAtLeastOne) {
  ReplicationLog log(1 << 20);
  for (uint64_t seq = 1; seq <= 10; ++seq) log.Append(seq, Op(seq, 10));  // 14 bytes a record
  std::string out;
  uint64_t last = 0;
  // Exactly two records fit in 28 bytes, not in 27.
  ASSERT_EQ(log.Read(1, 28, 0ms, &out, &last), RR::kOk);
  EXPECT_EQ(last, 2u);
  EXPECT_EQ(out.size(), 28u);
  EXPECT_EQ(Records(out), (std::vector<std::string>{Op(1, 10), Op(2, 10)}));
  out.clear();
  ASSERT_EQ(log.Read(1, 27, 0ms, &out, &last), RR::kOk);
  EXPECT_EQ(last, 1u);
  EXPECT_EQ(Records(out).size(), 1u);
  // At least one, however small the bound.
  for (size_t bound : {size_t{0}, size_t{1}, size_t{13}}) {
    out.clear();
    ASSERT_EQ(log.Read(4, bound, 0ms, &out, &last), RR::kOk) << bound;
    EXPECT_EQ(last, 4u) << bound;
    EXPECT_EQ(Records(out), std::vector<std::string>{Op(4, 10)}) << bound;
  }
  // Read in batches: every operation once, in order, never a batch over the bound.
  std::vector<std::string> all;
  uint64_t from = 1;
  while (from <= 10) {
    out.clear();
    ASSERT_EQ(log.Read(from, 50, 0ms, &out, &last), RR::kOk);
    EXPECT_LE(out.size(), 50u);
    EXPECT_GE(last, from);
    for (auto& r : Records(out)) all.push_back(r);
    from = last + 1;
  }
  ASSERT_EQ(all.size(), 10u);
  for (uint64_t seq = 1; seq <= 10; ++seq) EXPECT_EQ(all[seq - 1], Op(seq, 10));
}

// A reader racing a writer over a small log sees every operation it gets in order with no gap;
// when it falls behind it is told kTooOld, never handed a later operation instead.
TEST(HaReplicationLog, AConcurrentReaderSeesNoGap) {
  for (size_t bound : {size_t{1} << 20, size_t{64}}) {
    ReplicationLog log(bound);
    constexpr uint64_t kOps = 5000;
    std::thread writer([&] {
      for (uint64_t seq = 1; seq <= kOps; ++seq) log.Append(seq, Op(seq, 16));
    });
    uint64_t from = 1;
    uint64_t too_old = 0;
    const auto deadline = Clock::now() + 20s;
    while (from <= kOps && Clock::now() < deadline) {
      std::string out;
      uint64_t last = 0;
      RR r = log.Read(from, 200, 1s, &out, &last);
      if (r == RR::kTooOld) {
        too_old++;
        from = log.first_seq();  // start over where the log begins (a snapshot would)
        continue;
      }
      ASSERT_EQ(r, RR::kOk);
      std::vector<std::string> records = Records(out);
      ASSERT_EQ(records.size(), last - from + 1);
      for (size_t i = 0; i < records.size(); ++i) ASSERT_EQ(records[i], Op(from + i, 16));
      from = last + 1;
    }
    writer.join();
    EXPECT_EQ(from, kOps + 1) << "bound " << bound;
    if (bound == (size_t{1} << 20)) {
      EXPECT_EQ(too_old, 0u);
    }
  }
}

}  // namespace
}  // namespace granary::master::ha
