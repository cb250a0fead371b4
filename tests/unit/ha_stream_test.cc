// The history stream end to end in one process: a leader (MasterState + ReplicationLog fed by
// its observer, a StandbySet, a StreamServer behind a FastServer on 127.0.0.1:0) and a standby
// (another MasterState with another segment id base, followed by a StandbyFollower). Whatever
// path the standby takes (a snapshot at first, continuing within the log, refused after falling
// behind it, a history that diverged, a term change, a failed replay), once the leader is quiet
// the standby's StateFingerprint equals the leader's at the same seq. StopLeading ends streams
// within a beat and nothing applied after it is streamed; acks reach the StandbySet and what was
// acknowledged is applied by the time the follower stops; another policy's snapshot is adopted.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/socket_io.h"
#include "master/ha/replication_log.h"
#include "master/ha/standby_follower.h"
#include "master/ha/standby_set.h"
#include "master/ha/stream_server.h"
#include "common/byte_stream.h"
#include "master/ha/stream_wire.h"
#include "master/policy/evictor.h"
#include "master/service/fast_server.h"
#include "master/service/master_service.h"
#include "master/state/master_state.h"
#include "master/state/state_codec.h"
#include "proto/fast_frame.h"

namespace granary::master::ha {
namespace {

// A test's socket as the stream code takes it (not owned; a plain stream keeps no state).
struct Plain {
  explicit Plain(int fd) : stream(fd, /*owns_fd=*/false) {}
  operator net::ByteStream&() { return stream; }
  net::ByteStream stream;
};

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

constexpr uint64_t kLeaderBase = uint64_t{1} << 40;
constexpr uint64_t kStandbyBase = uint64_t{5} << 40;
constexpr uint64_t kKiB = 1024;

MasterPolicy TestPolicy() {
  MasterPolicy p;
  p.lease_ttl_ms = 40;
  p.mount_quarantine_ms = 20;
  p.write_quarantine_ms = 30;
  p.client_ttl_ms = 200;
  p.put_discard_timeout_ms = 30;
  p.put_release_timeout_ms = 60;
  p.reservation_ttl_ms = 40;
  p.reservation_max_bytes = 512 * kKiB;
  p.eviction_high_watermark = 0.8;
  p.shard_count = 16;
  return p;
}

// Polls `done` every few ms until it holds or `limit` passes.
bool WaitUntil(const std::function<bool()>& done, Millis limit = 15s) {
  const auto end = Clock::now() + limit;
  while (!done()) {  // bounded by `limit`
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

struct Leader {
  explicit Leader(MasterPolicy policy = TestPolicy(), size_t log_bytes = 64 << 20,
                  StreamOptions options = {})
      : state(policy, WallClock::Instance(), kLeaderBase), log(log_bytes), evictor(&state),
        service(&state, &evictor, &metrics), streams(&state, &log, &standbys, options),
        fast(&service, &metrics) {
    // Before anything is applied: the log holds the whole history from seq 1.
    state.AddObserver(
        [this](const Operation& op, const OpResult&) { log.Append(op.seq, EncodeOperation(op)); });
    fast.set_stream_handler(
        [this](net::ByteStream& conn, std::string_view request) { streams.Serve(conn, request); });
    EXPECT_TRUE(fast.Start("127.0.0.1", 0).ok());
  }
  ~Leader() {
    streams.StopLeading();
    fast.Stop();
    standbys.Close();
    log.Close();
  }

  MasterState state;
  ReplicationLog log;
  StandbySet standbys;
  Evictor evictor;
  MetricsRegistry metrics;
  MasterService service;
  StreamServer streams;
  FastServer fast;
};

struct Standby {
  explicit Standby(std::string id = "standby-1", MasterPolicy policy = TestPolicy(),
                   uint64_t base = kStandbyBase)
      : state(policy, WallClock::Instance(), base), log(64 << 20),
        follower(&state, &log, StandbyFollower::Options{id, id + ":50051", 1000ms}) {
    state.AddObserver(
        [this](const Operation& op, const OpResult&) { log.Append(op.seq, EncodeOperation(op)); });
  }
  MasterState state;
  ReplicationLog log;
  StandbyFollower follower;
};

SegmentSpec Spec(const std::string& name, uint64_t size, uint64_t token, bool fresh) {
  return {name, size, "127.0.0.1:1", "granary-" + name, "host/boot", token, fresh};
}

void MountNodes(MasterState& state) {
  for (int s = 0; s < 3; ++s) {
    MountResult m = state.Mount(
        {"node-" + std::to_string(s), Spec("seg-" + std::to_string(s), 2048 * kKiB, 100 + s, true)});
    EXPECT_TRUE(m.status.ok()) << m.status.ToString();
  }
}

// A realistic mix from several threads at once: puts (ended, revoked, abandoned), reads with
// and without finishing, removes, regex removes, evictions, sweeps, one-round-trip puts
// (reserve, commit, release), pings and expiries, and a node that goes and comes back.
void Drive(Leader& leader, int threads, int rounds, uint64_t seed) {
  MasterState& state = leader.state;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 1000 + t);
      const std::string client = "client-" + std::to_string(t);
      for (int i = 0; i < rounds; ++i) {
        const int pick = static_cast<int>(rng() % 100);
        std::vector<std::string> keys;
        const int n = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < n; ++k) keys.push_back("key/" + std::to_string(rng() % 200));
        if (pick < 35) {
          std::vector<uint64_t> sizes;
          for (int k = 0; k < n; ++k) sizes.push_back((4 + rng() % 60) * kKiB + rng() % 100);
          PlacementConfig config;
          config.replica_num = 1 + static_cast<uint32_t>(rng() % 2);
          config.with_soft_pin = rng() % 10 == 0;
          auto started = state.PutStart({client, keys, sizes, config, rng() % 8 == 0});
          std::vector<std::string> ok_keys;
          std::vector<uint64_t> gens, sums;
          for (int k = 0; k < n; ++k) {
            if (!started[k].status.ok()) continue;
            ok_keys.push_back(keys[k]);
            gens.push_back(started[k].put_gen);
            sums.push_back(rng());
          }
          if (ok_keys.empty()) {
            leader.evictor.EvictBytes(256 * kKiB);
            continue;
          }
          const int fate = static_cast<int>(rng() % 10);
          if (fate < 7) {
            state.PutEnd({client, ok_keys, sums, gens});
          } else if (fate < 9) {
            state.PutRevoke({client, ok_keys, gens, fate == 8});
          }  // else abandoned: swept later
        } else if (pick < 55) {
          state.GetReplicaList({client, keys});
          if (rng() % 4 != 0) state.FinishRead({client, keys});
        } else if (pick < 65) {
          state.Remove({keys, rng() % 3 == 0});
        } else if (pick < 68) {
          state.RemoveByRegex({"^key/" + std::to_string(rng() % 3) + "[0-9]$", false});
        } else if (pick < 72) {
          leader.evictor.EvictBytes((1 + rng() % 256) * kKiB);
        } else if (pick < 78) {
          state.Sweep();
          leader.evictor.RunIfAboveWatermark();
        } else if (pick < 90) {
          const uint64_t size = (4 + rng() % 28) * kKiB;
          ReserveResult reserved = state.Reserve({client, size, static_cast<uint32_t>(n), {}});
          std::vector<std::string> commit_keys;
          std::vector<uint64_t> names, sizes, sums, segments, offsets;
          std::vector<uint64_t> spare, spare_segments, spare_offsets;
          for (size_t k = 0; k < reserved.granted.size(); ++k) {
            if (rng() % 3 != 0) {
              commit_keys.push_back(keys[k]);
              names.push_back(reserved.granted[k].gen);
              sizes.push_back(size);
              sums.push_back(rng());
              segments.push_back(reserved.granted[k].extent.segment_id);
              offsets.push_back(reserved.granted[k].extent.offset);
            } else if (rng() % 2 == 0) {
              spare.push_back(reserved.granted[k].gen);
              spare_segments.push_back(reserved.granted[k].extent.segment_id);
              spare_offsets.push_back(reserved.granted[k].extent.offset);
            }  // else left to expire
          }
          if (!commit_keys.empty()) {
            state.PutCommit({client, commit_keys, names, sizes, sums, {}, rng() % 4 == 0,
                             segments, offsets});
          }
          if (!spare.empty()) state.ReleaseReservations({client, spare, spare_segments, spare_offsets});
        } else if (pick < 96) {
          state.Ping(client);
          for (const auto& silent : state.SilentClients(WallClock::Instance()->NowMs())) {
            state.ExpireClient(silent);
          }
        } else if (t == 0) {
          const uint64_t s = rng() % 3;
          const std::string name = "seg-" + std::to_string(s);
          if (state.segments().FindByName(name)) state.Unmount({"node-" + std::to_string(s), name});
          state.Mount({"node-" + std::to_string(s), Spec(name, 2048 * kKiB, rng() | 1, false)});
        }
      }
    });
  }
  for (auto& w : workers) w.join();
}

// Waits until the standby has the leader's last operation (the leader quiet), then compares.
::testing::AssertionResult SameState(Leader& leader, Standby& standby, Millis limit = 20s) {
  const uint64_t target = leader.state.last_seq();
  // Connected too: a loaded snapshot's seq shows in the state before the follower counts it,
  // and the session is marked connected only after the count.
  if (!WaitUntil([&] {
        return standby.state.last_seq() == target && standby.follower.progress().connected;
      }, limit)) {
    return ::testing::AssertionFailure()
           << "the standby reached seq " << standby.state.last_seq() << ", the leader is at "
           << target << " (snapshots " << standby.follower.progress().snapshots << ")";
  }
  const MasterState::Fingerprint l = leader.state.StateFingerprint();
  const MasterState::Fingerprint s = standby.state.StateFingerprint();
  if (l.seq != target) return ::testing::AssertionFailure() << "the leader was not quiet";
  if (s.seq != l.seq || s.digest != l.digest) {
    return ::testing::AssertionFailure() << "at seq " << l.seq << " the standby's digest "
                                         << s.digest << " differs from the leader's " << l.digest;
  }
  return ::testing::AssertionSuccess();
}

void Follow(Leader& leader, Standby& standby, uint64_t term = 1) {
  standby.follower.Follow("127.0.0.1", leader.fast.port(), term);
}

// ---- a standby from nothing ----

TEST(HaStream, AStandbyFollowsAConcurrentMixToTheSameState) {
  Leader leader;
  leader.streams.Lead(1, {{1, 1}});
  MountNodes(leader.state);
  Drive(leader, 2, 50, 1);  // some history before the standby comes
  Standby standby;
  Follow(leader, standby);
  Drive(leader, 4, 400, 2);
  ASSERT_TRUE(SameState(leader, standby));
  const StandbyFollower::Progress p = standby.follower.progress();
  EXPECT_TRUE(p.connected);
  EXPECT_EQ(p.term, 1u);
  EXPECT_EQ(p.snapshots, 1u) << "one snapshot at first, then operations only";
  EXPECT_EQ(standby.state.segment_id_base(), kLeaderBase);
  EXPECT_GT(leader.state.last_seq(), 1500u);
  // And again after more: the stream goes on.
  Drive(leader, 3, 100, 3);
  ASSERT_TRUE(SameState(leader, standby));
  EXPECT_EQ(standby.follower.progress().snapshots, 1u);
  EXPECT_EQ(standby.follower.lineage().size(), 1u);
}

// A standby with no operation (last_seq 0) still needs the leader's initial state: its own
// segment id base differs, so replaying the operations alone would name segments differently.
TEST(HaStream, AnEmptyStandbyGetsASnapshotEvenOfAnEmptyLeader) {
  Leader leader;
  leader.streams.Lead(1, {{1, 1}});
  Standby standby;
  ASSERT_NE(standby.state.Digest(), leader.state.Digest()) << "the bases differ";
  Follow(leader, standby);
  ASSERT_TRUE(WaitUntil([&] { return standby.follower.progress().snapshots == 1; }));
  EXPECT_EQ(standby.state.segment_id_base(), kLeaderBase);
  ASSERT_TRUE(SameState(leader, standby));
  MountNodes(leader.state);
  ASSERT_TRUE(SameState(leader, standby));
  auto l = leader.state.segments().FindByName("seg-1");
  auto s = standby.state.segments().FindByName("seg-1");
  ASSERT_TRUE(l && s);
  EXPECT_EQ(s->id, l->id);
  EXPECT_GE(s->id, kLeaderBase);
}

// ---- continuing, or starting over ----

TEST(HaStream, AStandbyThatReconnectsWithinTheLogContinuesWithoutASnapshot) {
  Leader leader;
  leader.streams.Lead(1, {{1, 1}});
  MountNodes(leader.state);
  Standby standby;
  Follow(leader, standby);
  Drive(leader, 2, 100, 4);
  ASSERT_TRUE(SameState(leader, standby));
  standby.follower.Stop();
  const uint64_t stopped_at = standby.state.last_seq();
  Drive(leader, 2, 100, 5);
  ASSERT_GT(leader.state.last_seq(), stopped_at);
  Follow(leader, standby);
  ASSERT_TRUE(SameState(leader, standby));
  EXPECT_EQ(standby.follower.progress().snapshots, 1u) << "continued from seq " << stopped_at;
}

// (b) A standby the log left behind while it was away comes back through a snapshot.
TEST(HaStream, AStandbyTheLogLeftBehindComesBackViaASnapshot) {
  Leader leader(TestPolicy(), /*log_bytes=*/2048);
  leader.streams.Lead(1, {{1, 1}});
  MountNodes(leader.state);
  Standby standby;
  Follow(leader, standby);
  Drive(leader, 1, 50, 6);
  ASSERT_TRUE(SameState(leader, standby));
  standby.follower.Stop();
  const uint64_t stopped_at = standby.state.last_seq();
  // The log is so short that the stream itself may have started over once already under load.
  const uint64_t snapshots = standby.follower.progress().snapshots;
  Drive(leader, 2, 200, 7);
  ASSERT_GT(leader.log.first_seq(), stopped_at + 1) << "the log still holds the standby's next";
  Follow(leader, standby);
  ASSERT_TRUE(SameState(leader, standby));
  // Counted just after the load: the state may look equal a moment before.
  EXPECT_TRUE(WaitUntil([&] { return standby.follower.progress().snapshots > snapshots; }))
      << standby.follower.progress().snapshots;
}

// (b) Falling behind the log while streaming: the leader refuses (kRefuse), never skips. A raw
// standby on a socketpair holds the leader in a send of a large operation while two more push
// the next one out of a one-operation log.
TEST(HaStream, AStandbyFallingBehindWhileStreamingIsRefused) {
  StreamOptions options;
  options.standby_timeout = 5s;  // the raw standby acks nothing for a while
  Leader leader(TestPolicy(), /*log_bytes=*/1, options);
  leader.state.Ping("a");
  leader.state.Ping("b");
  const uint64_t base = leader.state.last_seq();
  leader.streams.Lead(1, {{1, 1}});
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  const std::string hello = Encode(FrameKind::kHello, Hello{"raw", "raw:1", base, {{1, 1}}});
  std::thread server([&] { leader.streams.Serve(Plain(fds[0]), hello); });

  Result<std::string> frame = ReadFrame(Plain(fds[1]), fast::kMaxFastReply, Clock::now() + 5s);
  Welcome welcome;
  ASSERT_TRUE(frame.ok() && Decode(*frame, FrameKind::kWelcome, &welcome));
  EXPECT_FALSE(welcome.snapshot) << "the log holds its next operation";
  EXPECT_EQ(welcome.next_seq, base + 1);

  // A PutStart of 1 MiB of keys: its kOps frame cannot fit in the socket's buffers.
  PutStartOp big{"writer", {}, {}, {}, false};
  for (int i = 0; i < 250; ++i) {
    big.keys.push_back(std::string(4000, 'a' + i % 26) + std::to_string(i));
    big.sizes.push_back(1);
  }
  leader.state.PutStart(big);
  std::this_thread::sleep_for(50ms);  // the leader picks it up and blocks sending it
  leader.state.Ping("c");
  leader.state.Ping("d");  // base + 1 and + 2 are gone: the log holds base + 3 alone
  ASSERT_EQ(leader.log.first_seq(), base + 3);

  bool refused = false;
  uint64_t next = base + 1;
  for (int i = 0; i < 100 && !refused; ++i) {  // bounded: frames until the refusal or the end
    frame = ReadFrame(Plain(fds[1]), fast::kMaxFastReply, Clock::now() + 5s);
    ASSERT_TRUE(frame.ok()) << frame.status().ToString();
    switch (KindOf(*frame)) {
      case FrameKind::kOps: {
        auto ops = SplitOps(std::string_view(*frame).substr(1));
        ASSERT_TRUE(ops.ok());
        for (std::string_view record : *ops) {
          Result<Operation> op = DecodeOperation(record);
          ASSERT_TRUE(op.ok());
          EXPECT_EQ(op->seq, next) << "an operation out of order or after a gap";
          next++;
        }
        break;
      }
      case FrameKind::kBeat:
        break;
      case FrameKind::kRefuse:
        refused = true;
        break;
      default:
        FAIL() << "unexpected frame kind " << static_cast<int>(KindOf(*frame));
    }
  }
  EXPECT_TRUE(refused);
  EXPECT_LE(next, base + 2) << "it was streamed past what the log dropped";
  // The leader then closes the stream.
  frame = ReadFrame(Plain(fds[1]), fast::kMaxFastReply, Clock::now() + 5s);
  EXPECT_FALSE(frame.ok());
  server.join();
  ::close(fds[0]);
  ::close(fds[1]);
  auto list = leader.standbys.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_FALSE(list[0].connected);
}

// (b) Under load with a tiny log: whatever mix of refusals and snapshots it takes, the standby
// ends equal.
TEST(HaStream, AStandbyBehindATinyLogUnderLoadEndsEqual) {
  Leader leader(TestPolicy(), /*log_bytes=*/512);
  leader.streams.Lead(1, {{1, 1}});
  MountNodes(leader.state);
  Standby standby;
  Follow(leader, standby);
  Drive(leader, 4, 300, 8);
  ASSERT_TRUE(SameState(leader, standby));
  EXPECT_GE(standby.follower.progress().snapshots, 1u);
}

// (c) A standby that applied operations of its own under term 1, past where the leader's
// lineage ends term 1: its history is not a prefix, so it gets a snapshot.
TEST(HaStream, ADivergedStandbyGetsASnapshot) {
  Leader leader;
  leader.streams.Lead(1, {{1, 1}});
  MountNodes(leader.state);
  Standby standby;
  Follow(leader, standby);
  Drive(leader, 2, 50, 9);
  ASSERT_TRUE(SameState(leader, standby));
  standby.follower.Stop();
  const uint64_t shared = standby.state.last_seq();
  ASSERT_EQ(standby.follower.lineage().size(), 1u);
  // The standby's own operations (it led term 1 on its own for a moment, say).
  standby.state.Ping("rogue-1");
  standby.state.Remove({{"key/1", "key/2"}, true});
  standby.state.Ping("rogue-2");
  // The leader of term 2 continues the shared history at shared + 1.
  leader.streams.StopLeading();
  leader.streams.Lead(2, {{1, 1}, {2, shared + 1}});
  Drive(leader, 2, 30, 10);
  ASSERT_FALSE(IsPrefix(standby.follower.lineage(), standby.state.last_seq(),
                        {{1, 1}, {2, shared + 1}}));
  Follow(leader, standby, 2);
  ASSERT_TRUE(SameState(leader, standby));
  EXPECT_TRUE(WaitUntil([&] { return standby.follower.progress().snapshots == 2; }))
      << standby.follower.progress().snapshots;
  EXPECT_EQ(standby.follower.progress().term, 2u);
  const Lineage lineage = standby.follower.lineage();
  ASSERT_EQ(lineage.size(), 2u);
  EXPECT_EQ(lineage[1].term, 2u);
  EXPECT_EQ(lineage[1].first_seq, shared + 1);
}

// A standby that holds exactly the old term's history goes on into the new term without one.
TEST(HaStream, AStandbyAtTheEndOfTheOldTermContinuesIntoTheNewOne) {
  Leader leader;
  leader.streams.Lead(1, {{1, 1}});
  MountNodes(leader.state);
  Standby standby;
  Follow(leader, standby);
  Drive(leader, 2, 50, 11);
  ASSERT_TRUE(SameState(leader, standby));
  const uint64_t end_of_term_1 = leader.state.last_seq();
  leader.streams.StopLeading();
  leader.streams.Lead(2, {{1, 1}, {2, end_of_term_1 + 1}});
  Follow(leader, standby, 2);
  Drive(leader, 2, 50, 12);
  ASSERT_TRUE(SameState(leader, standby));
  EXPECT_TRUE(WaitUntil([&] { return standby.follower.progress().term == 2; }, 5s));
  EXPECT_EQ(standby.follower.progress().snapshots, 1u);
  const Lineage lineage = standby.follower.lineage();
  ASSERT_EQ(lineage.size(), 2u);
  EXPECT_EQ(lineage[1].first_seq, end_of_term_1 + 1);
}

// A history that cannot be replayed (here: the standby applied an operation of its own while
// following) marks the state invalid; the next connection asks for a snapshot.
TEST(HaStream, AFailedReplayLeadsToASnapshot) {
  Leader leader;
  leader.streams.Lead(1, {{1, 1}});
  MountNodes(leader.state);
  Standby standby;
  Follow(leader, standby);
  ASSERT_TRUE(SameState(leader, standby));
  ASSERT_EQ(standby.follower.progress().snapshots, 1u);
  standby.state.Ping("rogue");  // takes the seq the leader's next operation has
  leader.state.Ping("leader's");
  ASSERT_TRUE(WaitUntil([&] { return standby.follower.progress().snapshots >= 2; }));
  ASSERT_TRUE(SameState(leader, standby));
  EXPECT_TRUE(standby.follower.state_valid());
}

// ---- the leader's side ----

// (d) StopLeading ends every stream within a beat; the follower then applies nothing more,
// until the master leads again (and then goes on from where it was).
TEST(HaStream, StopLeadingEndsStreamsWithinABeat) {
  StreamOptions options;
  options.beat = 100ms;
  Leader leader(TestPolicy(), 64 << 20, options);
  leader.streams.Lead(1, {{1, 1}});
  MountNodes(leader.state);
  Standby standby;
  Follow(leader, standby);
  Drive(leader, 2, 30, 13);
  ASSERT_TRUE(SameState(leader, standby));
  ASSERT_TRUE(WaitUntil([&] { return standby.follower.progress().connected; }, 5s));

  const auto start = Clock::now();
  leader.streams.StopLeading();
  ASSERT_TRUE(WaitUntil([&] { return !standby.follower.progress().connected; }, 5s));
  const auto took = Clock::now() - start;
  EXPECT_LT(took, options.beat + 150ms)
      << "the stream ended " << std::chrono::duration_cast<Millis>(took).count() << " ms later";
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto list = leader.standbys.List();
        return list.size() == 1 && !list[0].connected;
      },
      5s));

  const MasterState::Fingerprint frozen = standby.state.StateFingerprint();
  Drive(leader, 1, 30, 14);  // a master that stopped leading would not apply; this one shows
  std::this_thread::sleep_for(300ms);  // several reconnect attempts, each refused
  const MasterState::Fingerprint after = standby.state.StateFingerprint();
  EXPECT_EQ(after.seq, frozen.seq);
  EXPECT_EQ(after.digest, frozen.digest);
  EXPECT_FALSE(standby.follower.progress().connected);

  // Leading again (term 2, which began after what the standby holds): it goes on.
  leader.streams.Lead(2, {{1, 1}, {2, leader.state.last_seq() + 1}});
  Follow(leader, standby, 2);
  ASSERT_TRUE(SameState(leader, standby));
  EXPECT_EQ(standby.follower.progress().snapshots, 1u);
}

// A stream welcomed in a term sends nothing the master applied after it stopped leading that
// term (here: an operation applied at once after StopLeading, while the stream waits for the
// next one).
TEST(HaStream, NothingAppliedAfterStopLeadingIsStreamed) {
  StreamOptions options;
  options.beat = 2s;  // the stream sits in its wait for the next operation
  options.standby_timeout = 10s;
  Leader leader(TestPolicy(), 64 << 20, options);
  leader.state.Ping("a");
  const uint64_t last = leader.state.last_seq();
  leader.streams.Lead(1, {{1, 1}});
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  std::thread server([&] {
    leader.streams.Serve(Plain(fds[0]), Encode(FrameKind::kHello, Hello{"raw", "raw:1", last, {{1, 1}}}));
  });
  Result<std::string> frame = ReadFrame(Plain(fds[1]), fast::kMaxFastReply, Clock::now() + 5s);
  Welcome welcome;
  ASSERT_TRUE(frame.ok() && Decode(*frame, FrameKind::kWelcome, &welcome));
  ASSERT_FALSE(welcome.snapshot);
  std::this_thread::sleep_for(20ms);  // the stream waits for seq last + 1
  leader.streams.StopLeading();
  leader.state.Ping("after");  // not of term 1's history as this stream knows it
  uint64_t streamed_past = 0;
  for (int i = 0; i < 100; ++i) {  // bounded: frames until the leader hangs up
    frame = ReadFrame(Plain(fds[1]), fast::kMaxFastReply, Clock::now() + 5s);
    if (!frame.ok()) break;
    if (KindOf(*frame) != FrameKind::kOps) continue;
    auto ops = SplitOps(std::string_view(*frame).substr(1));
    ASSERT_TRUE(ops.ok());
    for (std::string_view record : *ops) {
      Result<Operation> op = DecodeOperation(record);
      ASSERT_TRUE(op.ok());
      streamed_past = std::max(streamed_past, op->seq);
    }
  }
  EXPECT_EQ(streamed_past, 0u) << "seq " << streamed_past << " was streamed after StopLeading";
  server.join();
  ::close(fds[0]);
  ::close(fds[1]);
}

// (e) Acks reach the StandbySet: once the standby is synchronous, WaitAcked of the leader's last
// seq succeeds; an acknowledged operation is one the standby received in order, and it is
// applied there (at once, or before Stop() returns).
TEST(HaStream, AcksReachTheStandbySet) {
  Leader leader;
  leader.streams.Lead(1, {{1, 1}});
  MountNodes(leader.state);
  // No standby yet: a required synchronous standby that is not there holds replies.
  leader.standbys.SetSync("standby-1", true);
  EXPECT_EQ(leader.standbys.WaitAcked(leader.state.last_seq(), Clock::now() + 50ms).code(),
            ErrorCode::RPC_TIMEOUT);
  Standby standby("standby-1");
  Follow(leader, standby);
  ASSERT_TRUE(WaitUntil([&] { return leader.standbys.Ready(); }, 5s));
  auto list = leader.standbys.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].id, "standby-1");
  EXPECT_EQ(list[0].advertise, "standby-1:50051");
  EXPECT_TRUE(list[0].connected);

  for (int i = 0; i < 50; ++i) {
    leader.state.Ping("client-" + std::to_string(i % 5));
    const uint64_t seq = leader.state.last_seq();
    Status s = leader.standbys.WaitAcked(seq, Clock::now() + 5s);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(WaitUntil([&] { return standby.state.last_seq() >= seq; }, 5s))
        << "acknowledged seq " << seq << " never applied";
  }
  // From several threads at once, each waiting for its own operation.
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        leader.state.Ping("writer-" + std::to_string(t));
        const uint64_t mine = MasterState::LastSeqOnThisThread();
        if (!leader.standbys.WaitAcked(mine, Clock::now() + 5s).ok()) failures++;
      }
    });
  }
  for (auto& w : writers) w.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(leader.standbys.released(), leader.state.last_seq());
  ASSERT_TRUE(SameState(leader, standby));
}

// Whatever the standby acknowledged is applied once Stop() returns (a promotion may follow),
// even with the leader writing all the while.
TEST(HaStream, StopAppliesEverythingAcknowledged) {
  Leader leader;
  leader.streams.Lead(1, {{1, 1}});
  MountNodes(leader.state);
  Standby standby("standby-1");
  Follow(leader, standby);
  ASSERT_TRUE(WaitUntil([&] { return standby.follower.progress().connected; }, 5s));
  for (int round = 0; round < 3; ++round) {
    std::thread writer([&] { Drive(leader, 2, 150, 30 + round); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 15 * round));
    standby.follower.Stop();
    const uint64_t applied = standby.state.last_seq();
    uint64_t acked = 0;
    for (const auto& s : leader.standbys.List()) acked = std::max(acked, s.acked);
    EXPECT_GE(applied, acked) << "round " << round << ": acknowledged but not applied";
    writer.join();
    Follow(leader, standby);
  }
  ASSERT_TRUE(SameState(leader, standby));
}

// (f) A standby built with another policy adopts the leader's from its snapshot.
TEST(HaStream, AStandbyAdoptsTheLeadersPolicy) {
  MasterPolicy theirs = TestPolicy();
  theirs.lease_ttl_ms = 7777;
  theirs.shard_count = 32;
  Leader leader(theirs);
  leader.streams.Lead(1, {{1, 1}});
  MountNodes(leader.state);
  Drive(leader, 2, 50, 15);
  MasterPolicy mine = TestPolicy();
  mine.shard_count = 8;
  Standby standby("standby-1", mine);
  // Without adopting, its own LoadSnapshot refuses the leader's.
  ASSERT_EQ(standby.state.LoadSnapshot(leader.state.EncodeSnapshot()).code(),
            ErrorCode::INVALID_PARAMS);
  Follow(leader, standby);
  Drive(leader, 2, 50, 16);
  ASSERT_TRUE(SameState(leader, standby));
  EXPECT_EQ(standby.state.policy().lease_ttl_ms, 7777);
  EXPECT_EQ(standby.state.shard_count(), 32u);
}

TEST(HaStream, ANonLeaderAndAMalformedHelloAreRefused) {
  Leader leader;  // not leading
  auto hello_to = [&](const std::string& body) -> Status {
    auto fd = net::ConnectTcp("127.0.0.1", leader.fast.port(), Clock::now() + 5s);
    if (!fd.ok()) return fd.status();
    Status sent = SendFrame(Plain(*fd), body, Clock::now() + 5s, /*request=*/true);
    Result<std::string> reply = ReadFrame(Plain(*fd), fast::kMaxFastReply, Clock::now() + 5s);
    ::close(*fd);
    if (!sent.ok()) return sent;
    return reply.ok() ? Status(ErrorCode::INTERNAL_ERROR, "a welcome") : reply.status();
  };
  const std::string hello = Encode(FrameKind::kHello, Hello{"s", "s:1", 0, {}});
  EXPECT_EQ(hello_to(hello).code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE);
  leader.streams.Lead(1, {{1, 1}});
  EXPECT_EQ(hello_to(Encode(FrameKind::kHello, Hello{"", "s:1", 0, {}})).code(),
            ErrorCode::INVALID_PARAMS)
      << "a hello without a standby id";
  EXPECT_EQ(hello_to(Encode(FrameKind::kAck, Ack{1})).code(), ErrorCode::INVALID_PARAMS)
      << "not a hello";
  EXPECT_EQ(hello_to("").code(), ErrorCode::INVALID_PARAMS);
  EXPECT_TRUE(leader.standbys.List().empty());
}

// A standby that never acknowledges (not even a beat) is dropped after standby_timeout, or, as
// here before its first ack (it may be loading the snapshot), after first_ack_timeout.
TEST(HaStream, ASilentStandbyIsDropped) {
  StreamOptions options;
  options.standby_timeout = 50ms;
  options.first_ack_timeout = 200ms;
  options.beat = 50ms;
  Leader leader(TestPolicy(), 64 << 20, options);
  leader.streams.Lead(1, {{1, 1}});
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  const auto start = Clock::now();
  std::thread server([&] {
    leader.streams.Serve(Plain(fds[0]), Encode(FrameKind::kHello, Hello{"mute", "mute:1", 0, {}}));
  });
  // Reads what comes (welcome, snapshot, beats) and never answers, until the leader hangs up.
  bool ended = false;
  for (int i = 0; i < 1000 && !ended; ++i) {  // bounded: frames until the end of the stream
    Result<std::string> frame = ReadFrame(Plain(fds[1]), fast::kMaxFastReply, Clock::now() + 5s);
    ended = !frame.ok();
  }
  const auto took = Clock::now() - start;
  server.join();
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_TRUE(ended);
  EXPECT_GE(took, 180ms);
  EXPECT_LT(took, 2s);
  auto list = leader.standbys.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_FALSE(list[0].connected);
}

// ---- the follower's side ----

TEST(HaStream, ALeaderOfALowerTermIsNotFollowed) {
  Leader leader;
  leader.streams.Lead(2, {{2, 1}});
  MountNodes(leader.state);
  Standby standby;
  const MasterState::Fingerprint before = standby.state.StateFingerprint();
  Follow(leader, standby, /*term=*/5);
  std::this_thread::sleep_for(300ms);  // several attempts
  const MasterState::Fingerprint after = standby.state.StateFingerprint();
  EXPECT_EQ(after.seq, before.seq);
  EXPECT_EQ(after.digest, before.digest);
  EXPECT_EQ(standby.follower.progress().snapshots, 0u);
  EXPECT_FALSE(standby.follower.progress().connected);
}

TEST(HaStream, AfterStopTheFollowerChangesNothing) {
  Leader leader;
  leader.streams.Lead(1, {{1, 1}});
  MountNodes(leader.state);
  Standby standby;
  Follow(leader, standby);
  Drive(leader, 2, 30, 17);
  ASSERT_TRUE(SameState(leader, standby));
  standby.follower.Stop();
  EXPECT_FALSE(standby.follower.progress().connected);
  const MasterState::Fingerprint frozen = standby.state.StateFingerprint();
  Drive(leader, 2, 30, 18);
  std::this_thread::sleep_for(200ms);
  const MasterState::Fingerprint after = standby.state.StateFingerprint();
  EXPECT_EQ(after.seq, frozen.seq);
  EXPECT_EQ(after.digest, frozen.digest);
  standby.follower.Stop();  // twice is fine
}

}  // namespace
}  // namespace granary::master::ha
