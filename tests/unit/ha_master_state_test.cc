// The MasterState pieces HA relies on: ResetEmpty gives an empty state with the new base whose
// names are above the old ones; LastSeqOnThisThread and AppliedOnThisThread are per thread
// (Apply and Replay alike);
// EncodeSnapshot's seq is the snapshot's; LoadSnapshot refuses another policy's snapshot
// (changing nothing) unless told to adopt it.
#include <gtest/gtest.h>

#include <thread>

#include "master/state/master_state.h"
#include "master/state/state_codec.h"

namespace granary::master {
namespace {

SegmentSpec Spec(const std::string& name, uint64_t size = 1 << 20) {
  return {name, size, "127.0.0.1:1", "granary-" + name, "host/boot", 7, true};
}

MasterPolicy SmallPolicy() {
  MasterPolicy p;
  p.shard_count = 8;
  return p;
}

// Mounts a segment and puts one object; returns {segment id, put gen}.
std::pair<uint64_t, uint64_t> MountAndPut(MasterState& state, const std::string& seg,
                                          const std::string& key) {
  MountResult m = state.Mount({"node", Spec(seg)});
  EXPECT_TRUE(m.status.ok()) << m.status.ToString();
  auto started = state.PutStart({"client", {key}, {4096}, {}, false});
  EXPECT_TRUE(started[0].status.ok()) << started[0].status.ToString();
  auto ended = state.PutEnd({"client", {key}, {1}, {started[0].put_gen}});
  EXPECT_TRUE(ended[0].ok()) << ended[0].ToString();
  return {m.segment_id, started[0].put_gen};
}

TEST(HaMasterState, ResetEmptyGivesAnEmptyStateWithTheNewBase) {
  ManualClock clock;
  MasterState state(SmallPolicy(), &clock, 1000);
  auto [old_segment, old_gen] = MountAndPut(state, "seg-a", "key-a");
  ASSERT_GT(state.last_seq(), 0u);
  ASSERT_EQ(state.object_count(), 1u);

  const uint64_t base = 1'000'000;
  state.ResetEmpty(base);
  EXPECT_EQ(state.last_seq(), 0u);
  EXPECT_EQ(state.object_count(), 0u);
  EXPECT_EQ(state.pending_count(), 0u);
  EXPECT_EQ(state.client_count(), 0u);
  EXPECT_EQ(state.segment_id_base(), base);
  EXPECT_TRUE(state.segments().Usage().empty());
  EXPECT_EQ(state.BatchExist(std::vector<std::string>{"key-a"})[0], 0);
  // Equal to a new master's state with that base.
  MasterState fresh(SmallPolicy(), &clock, base);
  EXPECT_EQ(state.Digest(), fresh.Digest());

  // Names handed out now are above every old one.
  auto [segment, gen] = MountAndPut(state, "seg-a", "key-b");
  EXPECT_GE(segment, base);
  EXPECT_GT(segment, old_segment);
  EXPECT_GT(gen, old_gen);
  EXPECT_EQ(state.last_seq(), 3u) << "the history starts over";
}

TEST(HaMasterState, ResetEmptyByDefaultNamesAboveADefaultMastersNames) {
  ManualClock clock;
  MasterState state(SmallPolicy(), &clock);  // the default base: wall clock ms << 16
  auto [old_segment, old_gen] = MountAndPut(state, "seg-a", "key-a");
  std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the clock's next millisecond
  state.ResetEmpty();
  auto [segment, gen] = MountAndPut(state, "seg-a", "key-a");
  EXPECT_GT(segment, old_segment);
  EXPECT_GT(gen, old_gen);
}

TEST(HaMasterState, LastSeqOnThisThreadIsPerThread) {
  ManualClock clock;
  MasterState state(SmallPolicy(), &clock, 1);
  MasterState replica(SmallPolicy(), &clock, 1);
  // (Observers may run on another caller's thread, ApplyCombiner: the seq is the caller's once
  // Apply returns, which is what a reply waits on.)
  uint64_t a_seen_before = 99, a_after_first = 0, a_after_others = 0;
  uint64_t b_before = 99, b_after = 0, r_after = 0;
  std::vector<Operation> ops;
  state.AddObserver([&](const Operation& op, const OpResult&) { ops.push_back(op); });

  std::thread a([&] {
    a_seen_before = MasterState::LastSeqOnThisThread();
    state.Ping("client-a");
    a_after_first = MasterState::LastSeqOnThisThread();
  });
  a.join();
  std::thread b([&] {
    b_before = MasterState::LastSeqOnThisThread();
    state.Ping("client-b");
    state.Ping("client-b");
    b_after = MasterState::LastSeqOnThisThread();
  });
  b.join();
  std::thread a2([&] {
    state.Ping("client-c");
    a_after_others = MasterState::LastSeqOnThisThread();
  });
  a2.join();
  EXPECT_EQ(a_seen_before, 0u) << "a thread that applied nothing";
  EXPECT_EQ(a_after_first, 1u);
  EXPECT_EQ(b_before, 0u) << "another thread's apply does not show here";
  EXPECT_EQ(b_after, 3u);
  EXPECT_EQ(a_after_others, 4u);

  // Replay sets it too.
  ASSERT_EQ(ops.size(), 4u);
  std::thread r([&] {
    for (const Operation& op : ops) ASSERT_TRUE(replica.Replay(op).ok());
    r_after = MasterState::LastSeqOnThisThread();
  });
  r.join();
  EXPECT_EQ(r_after, 4u);
  // A refused replay leaves it as it was.
  std::thread r2([&] {
    Operation bad = ops[0];
    EXPECT_FALSE(replica.Replay(bad).ok());
    EXPECT_EQ(MasterState::LastSeqOnThisThread(), 0u);
  });
  r2.join();
  EXPECT_EQ(replica.Digest(), state.Digest());
}

// AppliedOnThisThread counts this thread's operations, so a call knows it applied one even when
// the state went back and the new operation repeats an old seq.
TEST(HaMasterState, AppliedOnThisThreadCountsEvenARepeatedSeq) {
  ManualClock clock;
  MasterState state(SmallPolicy(), &clock, 1);
  std::thread t([&] {
    EXPECT_EQ(MasterState::AppliedOnThisThread(), 0u);
    state.Ping("a");
    const std::string before = state.EncodeSnapshot();
    state.Ping("b");
    EXPECT_EQ(MasterState::AppliedOnThisThread(), 2u);
    EXPECT_EQ(MasterState::LastSeqOnThisThread(), 2u);
    ASSERT_TRUE(state.LoadSnapshot(before).ok());  // back to seq 1
    state.Ping("c");                                // seq 2 again
    EXPECT_EQ(MasterState::LastSeqOnThisThread(), 2u);
    EXPECT_EQ(MasterState::AppliedOnThisThread(), 3u);
  });
  t.join();
  std::thread other([] { EXPECT_EQ(MasterState::AppliedOnThisThread(), 0u); });
  other.join();
}

TEST(HaMasterState, EncodeSnapshotSaysItsSeq) {
  ManualClock clock;
  MasterState state(SmallPolicy(), &clock, 1);
  uint64_t seq = 99;
  (void)state.EncodeSnapshot(&seq);
  EXPECT_EQ(seq, 0u);
  MountAndPut(state, "seg", "k");
  const std::string bytes = state.EncodeSnapshot(&seq);
  EXPECT_EQ(seq, state.last_seq());
  MasterState copy(SmallPolicy(), &clock, 5);
  ASSERT_TRUE(copy.LoadSnapshot(bytes).ok());
  EXPECT_EQ(copy.last_seq(), seq);
  EXPECT_EQ(copy.Digest(), state.Digest());
}

TEST(HaMasterState, AnotherPolicysSnapshotIsAdoptedOnlyWhenAsked) {
  ManualClock clock;
  MasterPolicy theirs = SmallPolicy();
  theirs.lease_ttl_ms = 7777;
  theirs.shard_count = 16;
  MasterState leader(theirs, &clock, 1 << 20);
  MountAndPut(leader, "seg", "key-1");
  MountAndPut(leader, "seg-2", "key-2");
  const std::string bytes = leader.EncodeSnapshot();

  MasterState standby(SmallPolicy(), &clock, 5);
  standby.Ping("mine");
  const MasterState::Fingerprint before = standby.StateFingerprint();
  Status refused = standby.LoadSnapshot(bytes);
  EXPECT_EQ(refused.code(), ErrorCode::INVALID_PARAMS) << refused.ToString();
  const MasterState::Fingerprint after = standby.StateFingerprint();
  EXPECT_EQ(after.seq, before.seq) << "nothing changes on a refusal";
  EXPECT_EQ(after.digest, before.digest);
  EXPECT_EQ(standby.policy().lease_ttl_ms, SmallPolicy().lease_ttl_ms);

  Status adopted = standby.LoadSnapshot(bytes, /*adopt_policy=*/true);
  ASSERT_TRUE(adopted.ok()) << adopted.ToString();
  EXPECT_EQ(standby.policy().lease_ttl_ms, 7777);
  EXPECT_EQ(standby.shard_count(), 16u);
  EXPECT_EQ(standby.Digest(), leader.Digest());
  EXPECT_EQ(standby.last_seq(), leader.last_seq());
  EXPECT_EQ(standby.segment_id_base(), leader.segment_id_base());
  // The adopted state serves and replays like the leader's.
  EXPECT_EQ(standby.BatchExist(std::vector<std::string>{"key-1", "key-2", "nope"}),
            (std::vector<int32_t>{1, 1, 0}));
  std::vector<Operation> ops;
  leader.AddObserver([&](const Operation& op, const OpResult&) { ops.push_back(op); });
  MountAndPut(leader, "seg-3", "key-3");
  for (const Operation& op : ops) {
    Result<OpResult> r = standby.Replay(op);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  EXPECT_EQ(standby.Digest(), leader.Digest());

  // A malformed snapshot is refused either way.
  EXPECT_FALSE(standby.LoadSnapshot(bytes.substr(0, bytes.size() / 2), true).ok());
  EXPECT_EQ(standby.Digest(), leader.Digest());
}

}  // namespace
}  // namespace granary::master
