// master/ha/standby_set.h against its promises: WaitAcked releases a reply only once the
// synchronous standby (no other) acknowledged its seq, times out with RPC_TIMEOUT at its
// deadline, is woken by Close with UNAVAILABLE_IN_CURRENT_MODE, lets everything through when no
// standby is required; released() records what went through; a stale stream's last words are
// ignored; Ready() says whether a wait could succeed without a new standby.
#include "master/ha/standby_set.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

namespace granary::master::ha {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::future<Status> WaitAsync(StandbySet& set, uint64_t seq, std::chrono::milliseconds limit) {
  return std::async(std::launch::async,
                    [&set, seq, limit] { return set.WaitAcked(seq, Clock::now() + limit); });
}

// Whether `f` is still waiting after a short while (the wait did not return early).
bool StillWaiting(std::future<Status>& f) {
  return f.wait_for(40ms) == std::future_status::timeout;
}

TEST(HaStandbySet, OnlyTheSynchronousStandbysAckReleasesAWait) {
  StandbySet set;
  const uint64_t a = set.Connected("a", "a:1");
  const uint64_t b = set.Connected("b", "b:1");
  set.SetSync("a", true);
  auto wait = WaitAsync(set, 5, 10s);
  ASSERT_TRUE(StillWaiting(wait));
  set.Acked("b", b, 100);  // another standby far ahead: not the one etcd names
  ASSERT_TRUE(StillWaiting(wait));
  set.Acked("a", a, 4);  // short of it
  ASSERT_TRUE(StillWaiting(wait));
  EXPECT_EQ(set.released(), 0u) << "nothing released while waiting";
  set.Acked("a", a, 5);
  ASSERT_EQ(wait.wait_for(5s), std::future_status::ready);
  Status s = wait.get();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(set.released(), 5u);
  // Already acknowledged: at once, even with the deadline passed.
  EXPECT_TRUE(set.WaitAcked(3, Clock::now() - 1s).ok());
  EXPECT_EQ(set.released(), 5u) << "released() is the highest let through";
  EXPECT_TRUE(set.WaitAcked(5, Clock::now()).ok());
}

TEST(HaStandbySet, AnAckBelowTheLastNeverLowersIt) {
  StandbySet set;
  const uint64_t a = set.Connected("a", "a:1");
  set.SetSync("a", true);
  set.Acked("a", a, 10);
  set.Acked("a", a, 3);  // reordered or stale report
  EXPECT_TRUE(set.WaitAcked(10, Clock::now()).ok());
  auto list = set.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].acked, 10u);
}

TEST(HaStandbySet, AWaitTimesOutAtItsDeadline) {
  StandbySet set;
  const uint64_t a = set.Connected("a", "a:1");
  set.SetSync("a", true);
  set.Acked("a", a, 1);
  const auto start = Clock::now();
  Status s = set.WaitAcked(2, start + 80ms);
  const auto took = Clock::now() - start;
  EXPECT_EQ(s.code(), ErrorCode::RPC_TIMEOUT) << s.ToString();
  EXPECT_GE(took, 75ms);
  EXPECT_LT(took, 1s);
  EXPECT_EQ(set.released(), 0u) << "a timed-out reply was not released";
  // Required, but nobody named: the same.
  StandbySet none;
  EXPECT_EQ(none.WaitAcked(1, Clock::now() + 20ms).code(), ErrorCode::RPC_TIMEOUT);
}

TEST(HaStandbySet, CloseWakesEveryWaiterWithUnavailable) {
  StandbySet set;
  const uint64_t a = set.Connected("a", "a:1");
  set.SetSync("a", true);
  auto w1 = WaitAsync(set, 5, 10s);
  auto w2 = WaitAsync(set, 9, 10s);
  ASSERT_TRUE(StillWaiting(w1));
  const auto start = Clock::now();
  set.Close();
  ASSERT_EQ(w1.wait_for(5s), std::future_status::ready);
  ASSERT_EQ(w2.wait_for(5s), std::future_status::ready);
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_EQ(w1.get().code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE);
  EXPECT_EQ(w2.get().code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE);
  EXPECT_EQ(set.released(), 0u);
  // After Close: refused at once, even when the standby has it or none is required.
  set.Acked("a", a, 100);
  EXPECT_EQ(set.WaitAcked(1, Clock::now() + 5s).code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE);
  set.SetSync("", false);
  EXPECT_EQ(set.WaitAcked(1, Clock::now() + 5s).code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE);
  EXPECT_FALSE(set.Ready());
  EXPECT_EQ(set.released(), 0u);
}

// A new term forgets every standby and every ack: an ack of an earlier term (or of an earlier
// connection) says nothing about this term's history, so it releases no reply of it.
TEST(HaStandbySet, ReopenStartsATermWithNoStandbyAndNoAck) {
  StandbySet set;
  const uint64_t a = set.Connected("a", "a:1");
  set.SetSync("a", true);
  set.Acked("a", a, 10);
  set.Close();
  set.Reopen(42);
  EXPECT_EQ(set.released(), 42u);
  EXPECT_EQ(set.sync_id(), "");
  EXPECT_TRUE(set.sync_required());
  EXPECT_TRUE(set.List().empty()) << "the earlier term's standbys are forgotten";
  EXPECT_FALSE(set.Ready()) << "nobody named yet";
  EXPECT_EQ(set.WaitAcked(5, Clock::now() + 20ms).code(), ErrorCode::RPC_TIMEOUT);
  set.SetSync("a", true);
  EXPECT_FALSE(set.Ready()) << "named, but not connected in this term";
  EXPECT_EQ(set.WaitAcked(10, Clock::now() + 20ms).code(), ErrorCode::RPC_TIMEOUT)
      << "an ack of the earlier term released a reply of this one";
  set.Acked("a", a, 10);  // the old stream's late ack: ignored
  EXPECT_EQ(set.WaitAcked(10, Clock::now() + 20ms).code(), ErrorCode::RPC_TIMEOUT);
  const uint64_t a2 = set.Connected("a", "a:1");
  EXPECT_EQ(set.WaitAcked(10, Clock::now() + 20ms).code(), ErrorCode::RPC_TIMEOUT)
      << "a reconnect brought its old acked position back";
  set.Acked("a", a2, 10);
  EXPECT_TRUE(set.WaitAcked(10, Clock::now()).ok());
  EXPECT_EQ(set.released(), 42u);
}

TEST(HaStandbySet, NotRequiredLetsEverythingThroughAtOnce) {
  StandbySet set;
  set.SetSync("", false);
  EXPECT_TRUE(set.Ready());
  const auto start = Clock::now();
  EXPECT_TRUE(set.WaitAcked(1000, start + 10s).ok());
  EXPECT_LT(Clock::now() - start, 500ms);
  EXPECT_EQ(set.released(), 1000u);
  EXPECT_FALSE(set.sync_required());
  // Turning the requirement on again makes waits wait; turning it off releases them.
  set.SetSync("a", true);
  auto wait = WaitAsync(set, 1001, 10s);
  ASSERT_TRUE(StillWaiting(wait));
  set.SetSync("", false);
  ASSERT_EQ(wait.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(wait.get().ok());
  EXPECT_EQ(set.released(), 1001u);
}

// Changing the synchronous standby releases nobody by itself: the newcomer's own acks do.
TEST(HaStandbySet, ANewSynchronousStandbyReleasesOnlyByItsOwnAcks) {
  StandbySet set;
  const uint64_t a = set.Connected("a", "a:1");
  const uint64_t b = set.Connected("b", "b:1");
  set.SetSync("a", true);
  set.Acked("a", a, 10);
  set.Acked("b", b, 2);
  set.SetSync("b", true);
  auto wait = WaitAsync(set, 5, 10s);
  ASSERT_TRUE(StillWaiting(wait)) << "a's acks do not count for b";
  set.Acked("a", a, 20);
  ASSERT_TRUE(StillWaiting(wait));
  set.Acked("b", b, 6);
  ASSERT_EQ(wait.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(wait.get().ok());
  EXPECT_EQ(set.sync_id(), "b");
}

TEST(HaStandbySet, AStaleStreamsAcksAndGoneAreIgnored) {
  StandbySet set;
  const uint64_t old_stream = set.Connected("a", "a:1");
  const uint64_t new_stream = set.Connected("a", "a:2");  // it reconnected
  EXPECT_NE(old_stream, new_stream);
  set.SetSync("a", true);
  set.Acked("a", old_stream, 50);
  EXPECT_EQ(set.WaitAcked(1, Clock::now() + 20ms).code(), ErrorCode::RPC_TIMEOUT)
      << "the old connection's ack reached the new entry";
  set.Gone("a", old_stream);
  EXPECT_TRUE(set.Ready()) << "the old connection's end marked the new one gone";
  auto list = set.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_TRUE(list[0].connected);
  EXPECT_EQ(list[0].advertise, "a:2");
  EXPECT_EQ(list[0].stream, new_stream);
  EXPECT_EQ(list[0].acked, 0u);
  set.Acked("a", new_stream, 7);
  EXPECT_TRUE(set.WaitAcked(7, Clock::now()).ok());
  set.Gone("a", new_stream);
  EXPECT_FALSE(set.Ready());
  EXPECT_FALSE(set.List()[0].connected);
  // A standby never seen: its reports change nothing.
  set.Acked("ghost", 12345, 99);
  set.Gone("ghost", 12345);
  EXPECT_EQ(set.List().size(), 1u);
}

TEST(HaStandbySet, ReadySemantics) {
  StandbySet set;
  EXPECT_FALSE(set.Ready()) << "required by default, nobody named";
  set.SetSync("a", true);
  EXPECT_FALSE(set.Ready()) << "named but never connected";
  const uint64_t a = set.Connected("a", "a:1");
  EXPECT_TRUE(set.Ready());
  set.SetSync("b", true);
  EXPECT_FALSE(set.Ready()) << "another one named";
  set.SetSync("a", true);
  set.Gone("a", a);
  EXPECT_FALSE(set.Ready()) << "named and gone";
  set.SetSync("", false);
  EXPECT_TRUE(set.Ready()) << "none required";
  set.Close();
  EXPECT_FALSE(set.Ready()) << "closed";
}

// Many waiters on different seqs: each returns exactly when the ack covers it.
TEST(HaStandbySet, ManyWaitersReleaseInSeqOrder) {
  StandbySet set;
  const uint64_t a = set.Connected("a", "a:1");
  set.SetSync("a", true);
  std::vector<std::future<Status>> waits;
  for (uint64_t seq = 1; seq <= 8; ++seq) waits.push_back(WaitAsync(set, seq, 10s));
  std::this_thread::sleep_for(20ms);
  set.Acked("a", a, 4);
  for (uint64_t seq = 1; seq <= 4; ++seq) {
    ASSERT_EQ(waits[seq - 1].wait_for(5s), std::future_status::ready) << seq;
    EXPECT_TRUE(waits[seq - 1].get().ok()) << seq;
  }
  for (uint64_t seq = 5; seq <= 8; ++seq) {
    EXPECT_EQ(waits[seq - 1].wait_for(seq == 5 ? 40ms : 0ms), std::future_status::timeout) << seq;
  }
  EXPECT_EQ(set.released(), 4u);
  set.Acked("a", a, 8);
  for (uint64_t seq = 5; seq <= 8; ++seq) {
    ASSERT_EQ(waits[seq - 1].wait_for(5s), std::future_status::ready) << seq;
    EXPECT_TRUE(waits[seq - 1].get().ok()) << seq;
  }
  EXPECT_EQ(set.released(), 8u);
}

}  // namespace
}  // namespace granary::master::ha
