// Reserved space (ReserveOp, PutCommitOp, ReleaseReservationsOp): a put in one master call, and
// the promise that space a client may still write is never handed to anyone else.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <thread>

#include "master/state/master_state.h"
#include "master/state/state_codec.h"

namespace granary::master {
namespace {

constexpr uint64_t kMiB = 1 << 20;

class ReservationTest : public ::testing::Test {
 protected:
  ReservationTest() : state_(Policy(), &clock_) {}

  static MasterPolicy Policy() {
    MasterPolicy p;
    p.reservation_ttl_ms = 1'000;
    p.write_quarantine_ms = 5'000;
    p.put_discard_timeout_ms = 1'000;
    p.put_release_timeout_ms = 3'000;  // below lease + quarantine: the quarantine decides
    p.eviction_high_watermark = 0.9;
    p.reservation_max_bytes = 64 * kMiB;
    return p;
  }
  uint64_t MountSeg(const std::string& name, uint64_t size, uint64_t token = 1) {
    MountResult r = state_.Mount({"node", {name, size, "127.0.0.1:1", "", "", token, true}});
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    return r.segment_id;
  }
  // `trim` as the service sets it (MasterState::CommitTrims): when the object is smaller.
  static PutCommitOp CommitOp(const std::string& client, const std::string& key,
                              const Reservation& r, uint64_t size, PlacementConfig config = {},
                              bool upsert = false) {
    return {client, {key},   {r.gen}, {size}, {0xC0FFEE}, config, upsert,
            {r.extent.segment_id}, {r.extent.offset}, size < r.extent.length};
  }
  // Releases each by name and its own place.
  static ReleaseReservationsOp ReleaseOp(const std::string& client,
                                         const std::vector<Reservation>& rs) {
    ReleaseReservationsOp op{client, {}, {}, {}};
    for (const Reservation& r : rs) {
      op.reservations.push_back(r.gen);
      op.segment_ids.push_back(r.extent.segment_id);
      op.offsets.push_back(r.extent.offset);
    }
    return op;
  }
  Status Commit(const std::string& client, const std::string& key, const Reservation& r,
                uint64_t size, PlacementConfig config = {}, bool upsert = false) {
    return state_.PutCommit(CommitOp(client, key, r, size, config, upsert))[0];
  }
  uint64_t Used() const {
    uint64_t used = 0;
    for (const auto& u : state_.segments().Usage()) used += u.stats.used_bytes;
    return used;
  }

  ManualClock clock_;
  MasterState state_;
};

TEST_F(ReservationTest, AReservedPutIsReadableAfterOneCommitInTheReservedExtent) {
  MountSeg("seg", 64 * kMiB);
  ReserveResult r = state_.Reserve({"c", kMiB, 2, {}});
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(r.granted.size(), 2u);
  EXPECT_NE(r.granted[0].gen, r.granted[1].gen);
  EXPECT_EQ(r.granted[0].expires_ms, clock_.NowMs() + 1'000);
  EXPECT_EQ(state_.reservation_count(), 2u);
  EXPECT_GE(Used(), 2 * kMiB) << "reserved space counts as used";
  EXPECT_EQ(state_.BatchExist({"k"})[0], 0);

  ASSERT_TRUE(Commit("c", "k", r.granted[0], kMiB).ok());
  EXPECT_EQ(state_.BatchExist({"k"})[0], 1) << "readable as soon as the commit returns";
  auto got = state_.GetReplicaList({"reader", {"k"}})[0];
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.size, kMiB);
  EXPECT_EQ(got.checksum, 0xC0FFEEu);
  ASSERT_EQ(got.replicas.size(), 1u);
  EXPECT_EQ(got.replicas[0].offset, r.granted[0].extent.offset);
  EXPECT_EQ(got.replicas[0].segment_id, r.granted[0].extent.segment_id);
  EXPECT_EQ(state_.reservation_count(), 1u);
  EXPECT_EQ(Commit("c", "k2", r.granted[0], kMiB).code(), ErrorCode::INVALID_WRITE)
      << "a reservation holds one object";
}

TEST_F(ReservationTest, RefusedCommitsChangeNothingAndTheReservationStaysUsable) {
  MountSeg("seg", 64 * kMiB);
  ReserveResult r = state_.Reserve({"c", kMiB, 1, {}});
  ASSERT_EQ(r.granted.size(), 1u);
  const Reservation held = r.granted[0];
  Reservation unknown = held;
  unknown.gen += 1000;
  Reservation elsewhere = held;
  elsewhere.extent.offset += 4096;  // a name of an earlier master, say: not this place
  EXPECT_EQ(Commit("other", "k", held, kMiB).code(), ErrorCode::ILLEGAL_CLIENT);
  EXPECT_EQ(Commit("c", "k", held, kMiB + 1).code(), ErrorCode::INVALID_PARAMS)
      << "larger than the reservation";
  EXPECT_EQ(Commit("c", "k", held, 0).code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(Commit("c", "k", unknown, kMiB).code(), ErrorCode::INVALID_WRITE);
  EXPECT_EQ(Commit("c", "k", elsewhere, kMiB).code(), ErrorCode::INVALID_WRITE);
  EXPECT_EQ(Commit("c", "", held, kMiB).code(), ErrorCode::INVALID_KEY);
  PlacementConfig two;
  two.replica_num = 2;
  EXPECT_EQ(Commit("c", "k", held, kMiB, two).code(), ErrorCode::INVALID_PARAMS);
  PlacementConfig placed;
  placed.preferred_segments = {"seg"};
  EXPECT_EQ(Commit("c", "k", held, kMiB, placed).code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(state_.BatchExist({"k"})[0], 0);

  // An existing key: refused unless upsert, and the reservation is still the client's.
  auto start = state_.PutStart({"w", {"taken"}, {4096}, {}, false})[0];
  ASSERT_TRUE(start.status.ok());
  ASSERT_TRUE(state_.PutEnd({"w", {"taken"}, {1}, {start.put_gen}})[0].ok());
  EXPECT_EQ(Commit("c", "taken", held, kMiB).code(), ErrorCode::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ(state_.GetReplicaList({"r", {"taken"}})[0].size, 4096u);
  EXPECT_EQ(state_.reservation_count(), 1u);
  ASSERT_TRUE(Commit("c", "taken", held, kMiB, {}, /*upsert=*/true).ok());
  EXPECT_EQ(state_.GetReplicaList({"r", {"taken"}})[0].size, kMiB);
}

TEST_F(ReservationTest, ReservationsStayBelowTheWatermarkAndWithinTheClientsCap) {
  const uint64_t id = MountSeg("seg", 10 * kMiB);
  // 7 MiB of objects: the watermark (9 MiB) leaves room for 2 more, the quarter share for 2.
  for (int i = 0; i < 7; ++i) {
    const std::string key = "o" + std::to_string(i);
    auto s = state_.PutStart({"w", {key}, {kMiB}, {}, false})[0];
    ASSERT_TRUE(s.status.ok());
    ASSERT_TRUE(state_.PutEnd({"w", {key}, {1}, {s.put_gen}})[0].ok());
  }
  ReserveResult r = state_.Reserve({"c", kMiB, 20, {}});
  ASSERT_TRUE(r.status.ok());
  EXPECT_GT(r.granted.size(), 0u);
  EXPECT_LE(r.granted.size() * kMiB, 10 * kMiB / 4) << "at most a quarter of a segment is reserved";
  for (const auto& u : state_.segments().Usage()) {
    if (u.identity->id == id) {
      EXPECT_LE(u.stats.used_bytes, 9 * kMiB) << "a reservation never makes eviction run";
    }
  }
  EXPECT_EQ(state_.Reserve({"c", kMiB, 1, {}}).status.code(), ErrorCode::NO_AVAILABLE_HANDLE);

  MasterPolicy capped = Policy();
  capped.reservation_max_bytes = 3 * kMiB;
  MasterState small(capped, &clock_);
  ASSERT_TRUE(small.Mount({"node", {"s", 64 * kMiB, "127.0.0.1:1", "", "", 1, true}}).status.ok());
  EXPECT_EQ(small.Reserve({"c", kMiB, 5, {}}).granted.size(), 3u);
  EXPECT_EQ(small.Reserve({"c", kMiB, 1, {}}).status.code(), ErrorCode::NO_AVAILABLE_HANDLE);
  EXPECT_EQ(small.Reserve({"d", kMiB, 1, {}}).granted.size(), 1u) << "the cap is per client";
  // Bad requests.
  EXPECT_EQ(small.Reserve({"", kMiB, 1, {}}).status.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(small.Reserve({"c", 0, 1, {}}).status.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(small.Reserve({"c", kMiB, 0, {}}).status.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(small.Reserve({"c", uint64_t{1} << 62, 1, {}}).status.code(),
            ErrorCode::INVALID_PARAMS);
}

// A batch of reservations spreads over the segments (a client's reserved puts do not all land
// on one node), unless the client prefers segments, which are filled first.
TEST_F(ReservationTest, AReserveBatchSpreadsOverSegmentsAndPreferredOnesComeFirst) {
  std::map<uint64_t, std::string> names;
  for (const std::string name : {"a", "b", "c", "d"}) names[MountSeg(name, 64 * kMiB)] = name;
  ReserveResult spread = state_.Reserve({"c1", 64 << 10, 40, {}});
  ASSERT_EQ(spread.granted.size(), 40u);
  std::map<std::string, int> per_segment;
  for (const auto& r : spread.granted) per_segment[names.at(r.extent.segment_id)]++;
  for (const auto& [id, name] : names) {
    EXPECT_GE(per_segment[name], 5) << name << " got " << per_segment[name] << " of 40";
  }
  ReserveResult local = state_.Reserve({"c2", 64 << 10, 10, {"b"}});
  ASSERT_EQ(local.granted.size(), 10u);
  for (const auto& r : local.granted) EXPECT_EQ(names.at(r.extent.segment_id), "b");
}

// A probe took 90% of a 1 MiB segment with 1-byte reservations, 65,536 a call, though the
// share is a quarter: the caps count what the allocator takes (64 bytes each), so it cannot,
// and another client's put still finds room.
TEST_F(ReservationTest, TinyReservationsTakeNoMoreThanTheirShareAndOthersStillPut) {
  MountSeg("seg", kMiB);
  uint64_t granted = 0;
  for (int call = 0; call < 8; ++call) {
    ReserveResult r = state_.Reserve({"greedy", 1, 65'536, {}});
    granted += r.granted.size();
    if (!r.status.ok()) break;
  }
  EXPECT_GT(granted, 0u);
  EXPECT_LE(granted * OffsetAllocator::AllocationSize(1), kMiB / 4);
  EXPECT_LE(Used(), kMiB / 4) << "reserved space beyond a quarter of the segment";
  EXPECT_LE(state_.reserved_bytes(), kMiB / 4);
  auto put = state_.PutStart({"other", {"k"}, {kMiB / 2}, {}, false})[0];
  EXPECT_TRUE(put.status.ok()) << put.status.ToString();

  // However large its byte cap, a client holds at most 65,536 reservations (master memory).
  MasterPolicy big = Policy();
  big.reservation_max_bytes = uint64_t{1} << 40;
  MasterState roomy(big, &clock_);
  ASSERT_TRUE(roomy.Mount({"node", {"s", 64 * kMiB, "127.0.0.1:1", "", "", 1, true}}).status.ok());
  uint64_t held = 0;
  for (int call = 0; call < 4; ++call) held += roomy.Reserve({"c", 1, 40'000, {}}).granted.size();
  EXPECT_EQ(held, 65'536u);
  EXPECT_EQ(roomy.Reserve({"c", 1, 1, {}}).status.code(), ErrorCode::NO_AVAILABLE_HANDLE);
  EXPECT_EQ(roomy.Reserve({"d", 1, 1, {}}).granted.size(), 1u) << "the count is per client";
}

// The promise: space a writer may still touch is never handed to anyone else. An expired
// reservation waits write_quarantine_ms more before any allocation may take it.
TEST_F(ReservationTest, AnExpiredReservationIsQuarantinedBeforeAnyoneElseGetsItsSpace) {
  MasterPolicy p = Policy();
  p.eviction_high_watermark = 1.0;
  MasterState state(p, &clock_);
  ASSERT_TRUE(state.Mount({"node", {"s", 16 * kMiB, "127.0.0.1:1", "", "", 1, true}}).status.ok());
  auto fill = state.PutStart({"w", {"fill"}, {12 * kMiB}, {}, false})[0];
  ASSERT_TRUE(fill.status.ok());
  ASSERT_TRUE(state.PutEnd({"w", {"fill"}, {1}, {fill.put_gen}})[0].ok());
  ReserveResult r = state.Reserve({"c", 4 * kMiB, 1, {}});
  ASSERT_EQ(r.granted.size(), 1u);
  clock_.Advance(Millis(1'000));
  EXPECT_EQ(state.PutCommit(CommitOp("c", "k", r.granted[0], 4 * kMiB))[0].code(),
            ErrorCode::LEASE_EXPIRED);
  EXPECT_EQ(state.Sweep().expired_reservations, 1u);
  EXPECT_EQ(state.reservation_count(), 0u);
  EXPECT_EQ(state.PutStart({"w", {"x"}, {4 * kMiB}, {}, false})[0].status.code(),
            ErrorCode::NO_AVAILABLE_HANDLE);
  EXPECT_EQ(state.Reserve({"d", 4 * kMiB, 1, {}}).granted.size(), 0u);
  clock_.Advance(Millis(4'999));
  state.Sweep();
  EXPECT_EQ(state.PutStart({"w", {"x"}, {4 * kMiB}, {}, false})[0].status.code(),
            ErrorCode::NO_AVAILABLE_HANDLE);
  clock_.Advance(Millis(1));
  state.Sweep();
  EXPECT_TRUE(state.PutStart({"w", {"x"}, {4 * kMiB}, {}, false})[0].status.ok());
}

// A paused holder may write its reservation long after the lease: the space waits as long as a
// two-call put's whose writer went silent (put_release_timeout from the grant).
TEST_F(ReservationTest, AnExpiredReservationWaitsAsLongAsASilentPutsSpaceWould) {
  MasterPolicy p = Policy();
  p.eviction_high_watermark = 1.0;
  p.write_quarantine_ms = 2'000;
  p.put_release_timeout_ms = 10'000;  // above lease + quarantine: it decides
  MasterState state(p, &clock_);
  ASSERT_TRUE(state.Mount({"node", {"s", 16 * kMiB, "127.0.0.1:1", "", "", 1, true}}).status.ok());
  auto fill = state.PutStart({"w", {"fill"}, {12 * kMiB}, {}, false})[0];
  ASSERT_TRUE(fill.status.ok());
  ASSERT_TRUE(state.PutEnd({"w", {"fill"}, {1}, {fill.put_gen}})[0].ok());
  const int64_t granted_ms = clock_.NowMs();
  ASSERT_EQ(state.Reserve({"c", 4 * kMiB, 1, {}}).granted.size(), 1u);
  clock_.Advance(Millis(1'000));
  EXPECT_EQ(state.Sweep().expired_reservations, 1u);
  for (int64_t at : {3'000, 9'999}) {  // past lease + quarantine, short of the release timeout
    clock_.Advance(Millis(granted_ms + at - clock_.NowMs()));
    state.Sweep();
    EXPECT_EQ(state.PutStart({"w", {"x"}, {4 * kMiB}, {}, false})[0].status.code(),
              ErrorCode::NO_AVAILABLE_HANDLE)
        << "the space came back " << at << " ms after the grant";
  }
  clock_.Advance(Millis(1));
  state.Sweep();
  EXPECT_TRUE(state.PutStart({"w", {"x"}, {4 * kMiB}, {}, false})[0].status.ok());
}

TEST_F(ReservationTest, AReleaseFreesOnlyTheExtentItNames) {
  MountSeg("seg", 64 * kMiB);
  const uint64_t before = Used();
  ReserveResult r = state_.Reserve({"c", kMiB, 1, {}});
  ASSERT_EQ(r.granted.size(), 1u);
  Reservation elsewhere = r.granted[0];
  elsewhere.extent.offset += 64;
  auto released = state_.ReleaseReservations(ReleaseOp("c", {elsewhere}));
  EXPECT_EQ(released[0].code(), ErrorCode::INVALID_WRITE);
  elsewhere = r.granted[0];
  elsewhere.extent.segment_id += 1;
  released = state_.ReleaseReservations(ReleaseOp("c", {elsewhere}));
  EXPECT_EQ(released[0].code(), ErrorCode::INVALID_WRITE);
  ReleaseReservationsOp short_op = ReleaseOp("c", {r.granted[0]});
  short_op.offsets.clear();
  EXPECT_EQ(state_.ReleaseReservations(short_op)[0].code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(state_.reservation_count(), 1u) << "a release at the wrong place freed something";
  EXPECT_TRUE(Commit("c", "k", r.granted[0], kMiB).ok());
  EXPECT_GT(Used(), before);
}

// Names restart no more with a new master: a client still holding an earlier master's names
// (its pool) can neither release nor commit the new master's reservations with them.
TEST_F(ReservationTest, ARestartedMastersNamesAreAboveAnyEarlierOnes) {
  const auto wall_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  auto mount = [](MasterState& s) {
    return s.Mount({"node", {"seg", 64 * kMiB, "127.0.0.1:1", "", "", 1, true}});
  };
  MasterState first(Policy(), &clock_);
  ASSERT_TRUE(mount(first).status.ok());
  ReserveResult old_names = first.Reserve({"c", kMiB, 8, {}});
  ASSERT_EQ(old_names.granted.size(), 8u);
  auto put = first.PutStart({"c", {"p"}, {kMiB}, {}, false})[0];
  ASSERT_TRUE(put.status.ok());
  const int64_t started = wall_ms();
  while (wall_ms() == started) std::this_thread::sleep_for(std::chrono::microseconds(200));

  MasterState second(Policy(), &clock_);  // the restart: an empty state
  MountResult remount = mount(second);
  ASSERT_TRUE(remount.status.ok());
  ReserveResult new_names = second.Reserve({"c", kMiB, 8, {}});
  ASSERT_EQ(new_names.granted.size(), 8u);
  uint64_t highest_old = put.put_gen;
  for (const auto& g : old_names.granted) highest_old = std::max(highest_old, g.gen);
  for (const auto& g : new_names.granted) EXPECT_GT(g.gen, highest_old);
  EXPECT_GT(second.PutStart({"c", {"q"}, {kMiB}, {}, false})[0].put_gen, highest_old);

  // The old names, even quoted at the new mount's place, free and fill nothing.
  std::vector<Reservation> stale = old_names.granted;
  for (Reservation& s : stale) s.extent.segment_id = remount.segment_id;
  for (const Status& s : second.ReleaseReservations(ReleaseOp("c", stale))) {
    EXPECT_EQ(s.code(), ErrorCode::INVALID_WRITE);
  }
  EXPECT_EQ(second.reservation_count(), 8u);
  EXPECT_EQ(second.PutCommit(CommitOp("c", "k", stale[0], kMiB))[0].code(),
            ErrorCode::INVALID_WRITE);
}

TEST_F(ReservationTest, ReleaseFreesAtOnceButOnlyTheOwnersWord) {
  MountSeg("seg", 64 * kMiB);
  const uint64_t before = Used();
  ReserveResult r = state_.Reserve({"c", kMiB, 2, {}});
  ASSERT_EQ(r.granted.size(), 2u);
  auto released = state_.ReleaseReservations(ReleaseOp("other", {r.granted[0]}));
  EXPECT_EQ(released[0].code(), ErrorCode::ILLEGAL_CLIENT);
  Reservation unknown = r.granted[1];
  unknown.gen = 12345;
  released = state_.ReleaseReservations(ReleaseOp("c", {r.granted[0], r.granted[1], unknown}));
  EXPECT_TRUE(released[0].ok());
  EXPECT_TRUE(released[1].ok());
  EXPECT_EQ(released[2].code(), ErrorCode::INVALID_WRITE);
  EXPECT_EQ(Used(), before);
  EXPECT_EQ(state_.reserved_bytes(), 0u);
  EXPECT_EQ(Commit("c", "k", r.granted[0], kMiB).code(), ErrorCode::INVALID_WRITE);
}

TEST_F(ReservationTest, UnmountDropsTheReservationsOnItsSegment) {
  MountSeg("seg", 64 * kMiB);
  ReserveResult r = state_.Reserve({"c", kMiB, 3, {}});
  ASSERT_EQ(r.granted.size(), 3u);
  ASSERT_TRUE(state_.Unmount({"node", "seg"}).status.ok());
  EXPECT_EQ(state_.reservation_count(), 0u);
  EXPECT_EQ(state_.reserved_bytes(), 0u);
  MountSeg("seg", 64 * kMiB, /*token=*/2);
  EXPECT_EQ(Commit("c", "k", r.granted[0], kMiB).code(), ErrorCode::INVALID_WRITE)
      << "a reservation of the old mount never commits into the new one";
  EXPECT_EQ(state_.BatchExist({"k"})[0], 0);
}

// Clients reserve one size for objects up to 1/8 smaller (client/reservation_pool.h): a
// smaller object commits into the reservation's start and the rest is free at once.
TEST_F(ReservationTest, ASmallerObjectIsTrimmedIntoItsReservationAndTheRestFreedAtCommit) {
  MountSeg("seg", 8 * kMiB);  // a reservation takes at most a quarter of it
  ReserveResult r = state_.Reserve({"c", 2 * kMiB, 1, {}});
  ASSERT_EQ(r.granted.size(), 1u) << r.status.ToString();
  const Reservation held = r.granted[0];
  const uint64_t size = 2 * kMiB - 200'000 - 5;
  EXPECT_EQ(Used(), 2 * kMiB);
  ASSERT_TRUE(Commit("c", "k", held, size).ok());
  EXPECT_EQ(Used(), OffsetAllocator::AllocationSize(size)) << "the tail went back at commit";
  EXPECT_EQ(state_.reservation_count(), 0u);
  EXPECT_EQ(state_.reserved_bytes(), 0u);
  auto got = state_.GetReplicaList({"r", {"k"}})[0];
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.size, size);
  ASSERT_EQ(got.replicas.size(), 1u);
  EXPECT_EQ(got.replicas[0].offset, held.extent.offset) << "at the reservation's start";
  EXPECT_EQ(got.replicas[0].length, size) << "a reader reads the object, not the reservation";
  ASSERT_TRUE(state_.FinishRead({"r", {"k"}})[0].ok());
  // Everything else of the segment is one put's now: only possible with the tail given back.
  const uint64_t rest = 8 * kMiB - OffsetAllocator::AllocationSize(size);
  auto start = state_.PutStart({"w", {"rest"}, {rest}, {}, false})[0];
  ASSERT_TRUE(start.status.ok()) << start.status.ToString();
  ASSERT_TRUE(state_.PutEnd({"w", {"rest"}, {1}, {start.put_gen}})[0].ok());
  EXPECT_EQ(Used(), 8 * kMiB);
  // Removing the trimmed object frees exactly what it holds.
  ASSERT_TRUE(state_.Remove({{"k"}, /*force=*/true})[0].ok());
  EXPECT_EQ(Used(), rest);
}

// A replayed or standby master trims the same way: the same state, digest for digest.
// A commit op without `trim` (every record a master before the trim wrote) keeps the exact-size
// rule and its words, so a standby replaying such records does what their master did.
TEST_F(ReservationTest, WithoutTrimASmallerObjectIsRefusedAsBeforeAndNothingChanges) {
  MountSeg("seg", 8 * kMiB);
  ReserveResult r = state_.Reserve({"c", 2 * kMiB, 1, {}});
  ASSERT_EQ(r.granted.size(), 1u);
  PutCommitOp exact = CommitOp("c", "k", r.granted[0], kMiB);
  EXPECT_TRUE(state_.CommitTrims(exact)) << "what the service asks before it sets trim";
  exact.trim = false;
  const Status refused = state_.PutCommit(exact)[0];
  EXPECT_EQ(refused.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(refused.message().find("is not the reservation's"), std::string::npos)
      << refused.ToString() << ": the words a client reads as \"this master does not trim\"";
  EXPECT_EQ(Used(), 2 * kMiB);
  EXPECT_EQ(state_.reservation_count(), 1u);
  EXPECT_FALSE(state_.CommitTrims(CommitOp("c", "k", r.granted[0], 2 * kMiB)));
  ASSERT_TRUE(Commit("c", "k", r.granted[0], 2 * kMiB).ok()) << "the reservation is still usable";
}

// An exact commit's record is byte for byte what masters before the trim wrote (no trim field),
// and a trimming one carries it: a standby of an earlier build cannot decode that record and
// stops, rather than refuse the commit and place every later object elsewhere.
TEST_F(ReservationTest, OnlyATrimmingCommitsRecordCarriesTheFlag) {
  MountSeg("seg", 8 * kMiB);
  ReserveResult r = state_.Reserve({"c", kMiB, 1, {}});
  ASSERT_EQ(r.granted.size(), 1u);
  Operation op{123, 7, CommitOp("c", "k", r.granted[0], kMiB)};
  const std::string exact = EncodeOperation(op);
  Encoder before;  // the field list of PutCommitOp before the trim
  PutCommitOp& o = std::get<PutCommitOp>(op.body);
  uint64_t index = op.body.index();
  before(op.seq); before(op.now_ms); before(index);
  before(o.client_id); before(o.keys); before(o.reservations); before(o.sizes); before(o.checksums);
  before(o.config); before(o.upsert); before(o.segment_ids); before(o.offsets);
  EXPECT_EQ(exact, before.Take());
  o.trim = true;
  const std::string trimming = EncodeOperation(op);
  EXPECT_GT(trimming.size(), exact.size());
  auto decoded = DecodeOperation(trimming);
  ASSERT_TRUE(decoded.ok());
  EXPECT_TRUE(std::get<PutCommitOp>(decoded->body).trim);
  decoded = DecodeOperation(exact);
  ASSERT_TRUE(decoded.ok());
  EXPECT_FALSE(std::get<PutCommitOp>(decoded->body).trim);
}

TEST_F(ReservationTest, ATrimmedCommitGivesTheSameStateOnACopyAndThroughASnapshot) {
  MountSeg("seg", 64 * kMiB);
  ReserveResult r = state_.Reserve({"c", kMiB, 3, {}});
  ASSERT_EQ(r.granted.size(), 3u);
  MasterState copy(Policy(), &clock_);
  ASSERT_TRUE(copy.LoadSnapshot(state_.EncodeSnapshot()).ok());
  for (size_t i = 0; i < 3; ++i) {
    const std::string key = "k" + std::to_string(i);
    const uint64_t size = kMiB - 1000 * (i + 1) - i;
    ASSERT_TRUE(Commit("c", key, r.granted[i], size).ok());
    ASSERT_TRUE(copy.PutCommit(CommitOp("c", key, r.granted[i], size))[0].ok());
  }
  EXPECT_EQ(copy.Digest(), state_.Digest());
  MasterState loaded(Policy(), &clock_);
  ASSERT_TRUE(loaded.LoadSnapshot(state_.EncodeSnapshot()).ok());
  EXPECT_EQ(loaded.Digest(), state_.Digest());
  // The loaded allocator has the trimmed tails free: the same next placement.
  auto a = state_.PutStart({"w", {"next"}, {3000}, {}, false})[0];
  auto b = loaded.PutStart({"w", {"next"}, {3000}, {}, false})[0];
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  ASSERT_EQ(a.replicas.size(), 1u);
  ASSERT_EQ(b.replicas.size(), 1u);
  EXPECT_EQ(a.replicas[0].offset, b.replicas[0].offset);
}

TEST_F(ReservationTest, ReservationsAreInTheSnapshotAndItsDigest) {
  MountSeg("seg", 64 * kMiB);
  ReserveResult r = state_.Reserve({"c", kMiB, 2, {}});
  ASSERT_EQ(r.granted.size(), 2u);
  const std::string snapshot = state_.EncodeSnapshot();
  MasterState copy(Policy(), &clock_);
  ASSERT_TRUE(copy.LoadSnapshot(snapshot).ok());
  EXPECT_EQ(copy.Digest(), state_.Digest());
  EXPECT_EQ(copy.reservation_count(), 2u);
  EXPECT_EQ(copy.reserved_bytes(), 2 * kMiB);
  ASSERT_TRUE(copy.PutCommit(CommitOp("c", "k", r.granted[1], kMiB))[0].ok());
  ASSERT_TRUE(Commit("c", "k", r.granted[1], kMiB).ok());
  EXPECT_EQ(copy.Digest(), state_.Digest()) << "the same commit on both gives the same state";
  // Still within the per-client cap after loading: the derived bytes were rebuilt.
  MasterPolicy capped = Policy();
  capped.reservation_max_bytes = 2 * kMiB;
  MasterState small(capped, &clock_);
  ASSERT_TRUE(small.Mount({"node", {"s", 64 * kMiB, "127.0.0.1:1", "", "", 1, true}}).status.ok());
  ASSERT_EQ(small.Reserve({"c", kMiB, 2, {}}).granted.size(), 2u);
  MasterState loaded(capped, &clock_);
  ASSERT_TRUE(loaded.LoadSnapshot(small.EncodeSnapshot()).ok());
  EXPECT_EQ(loaded.Reserve({"c", kMiB, 1, {}}).status.code(), ErrorCode::NO_AVAILABLE_HANDLE);
}

}  // namespace
}  // namespace granary::master
