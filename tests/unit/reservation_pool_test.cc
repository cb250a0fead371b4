// ReservationPool against an in-process master (its gRPC service on loopback): what reservation_pool.h
// promises about misses, background refill, the byte cap, half-lease hand-outs and Close.
#include "client/reservation_pool.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <thread>

#include "master/policy/evictor.h"
#include "master/service/master_service.h"
#include "master/state/master_state.h"
#include "proto/rpc_util.h"

namespace granary::client {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
constexpr uint64_t kSize = 64 << 10;

master::MasterPolicy Policy() {
  master::MasterPolicy p;
  p.reservation_ttl_ms = 600;  // the pool hands each out for 300 ms at most
  return p;
}

class ReservationPoolTest : public ::testing::Test {
 protected:
  ReservationPoolTest()
      : state_(Policy(), WallClock::Instance()), evictor_(&state_),
        service_(&state_, &evictor_, &metrics_) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &grpc_port_);
    builder.RegisterService(&service_);
    grpc_ = builder.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(grpc_port_);
    stub_ = proto::Master::NewStub(rpc::MakeChannel(address_));
    link_ = std::make_unique<MasterLink>(MasterLocator::Create(address_).value(), 5000,
                                         MasterLink::Path::kGrpc);
    EXPECT_TRUE(state_.Mount({"node", {"seg", 64 << 20, "127.0.0.1:1", "", "", 1, true}}).status.ok());
  }
  ~ReservationPoolTest() override { grpc_->Shutdown(); }

  // Takes until one comes (the refill runs in the background), bounded.
  std::optional<ReservationPool::Held> TakeSoon(ReservationPool& pool, uint64_t size) {
    const auto end = steady_clock::now() + milliseconds(3000);
    while (steady_clock::now() < end) {
      if (auto held = pool.Take(size)) return held;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return std::nullopt;
  }

  // TakeSoon, checking that no reservation is handed out twice across `names`.
  std::optional<ReservationPool::Held> TakeOnce(ReservationPool& pool, uint64_t size,
                                                std::set<uint64_t>& names) {
    auto held = TakeSoon(pool, size);
    if (held) {
      EXPECT_TRUE(names.insert(held->name).second) << "reservation " << held->name << " twice";
    }
    return held;
  }
  // The master's count of Reserve calls served.
  Counter* ReserveCalls() {
    return metrics_.AddCounter("granary_master_rpc_total", "RPCs served",
                               {{"method", "Reserve"}});
  }

  master::MasterState state_;
  master::Evictor evictor_;
  MetricsRegistry metrics_;
  master::MasterService service_;
  int grpc_port_ = 0;
  std::unique_ptr<grpc::Server> grpc_;
  std::string address_;
  std::unique_ptr<proto::Master::Stub> stub_;
  std::unique_ptr<MasterLink> link_;
};

TEST_F(ReservationPoolTest, AMissRefillsInTheBackgroundAndEachIsHandedOutOnce) {
  ReservationPool pool(link_.get(), "c", 8 << 20);
  EXPECT_FALSE(pool.Take(kSize)) << "nothing is reserved before the first miss";
  std::set<uint64_t> names;
  for (int i = 0; i < 6; ++i) {
    auto held = TakeSoon(pool, kSize);
    ASSERT_TRUE(held);
    EXPECT_EQ(held->replica.length(), kSize) << "exactly the size asked for";
    EXPECT_TRUE(names.insert(held->name).second) << "reservation " << held->name << " twice";
  }
  EXPECT_GE(pool.stats().taken, 6u);
  EXPECT_GE(state_.reservation_count(), 6u);
}

// Steady puts of one size: the stock deepens, so a Reserve call serves many puts (one per put
// before, when the target stayed at 2).
// TakeAll hands out one for every size or none: a batch the stock cannot cover takes nothing
// (what it took goes back, and only its miss counts), one it can gets distinct reservations.
TEST_F(ReservationPoolTest, TakeAllTakesEveryOneOrNone) {
  ReservationPool pool(link_.get(), "c", 4 * kSize);  // four 64 KiB reservations at most
  ASSERT_TRUE(TakeSoon(pool, kSize));
  const auto end = steady_clock::now() + milliseconds(3000);
  while (pool.stats().held < 2 && steady_clock::now() < end) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_GE(pool.stats().held, 2u) << "the pool never refilled";
  const ReservationPool::Stats before = pool.stats();
  const std::vector<uint64_t> five(5, kSize);
  EXPECT_FALSE(pool.TakeAll(five)) << "five from a pool of four at most";
  EXPECT_EQ(pool.stats().taken, before.taken) << "what it took went back";
  EXPECT_EQ(pool.stats().missed, before.missed + 1);
  const std::vector<uint64_t> two(2, kSize);
  auto taken = pool.TakeAll(two);
  ASSERT_TRUE(taken);
  ASSERT_EQ(taken->size(), 2u);
  EXPECT_NE((*taken)[0].name, (*taken)[1].name);
  EXPECT_EQ(pool.stats().taken, before.taken + 2);
  pool.Close();
  EXPECT_FALSE(pool.TakeAll(two)) << "closed";
}

TEST_F(ReservationPoolTest, SteadyTakesOfOneSizeRefillInBatches) {
  ReservationPool pool(link_.get(), "c", 64 << 20);
  Counter* reserves = ReserveCalls();
  std::set<uint64_t> names;
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(TakeOnce(pool, kSize, names));
    std::this_thread::sleep_for(milliseconds(1));  // a put's copy and commit
  }
  EXPECT_LE(reserves->Value(), 40u) << "Reserve calls for 200 takes";
  EXPECT_LE(pool.stats().held, uint64_t{ReservationPool::kMaxPerSize});
}

// Many sizes near each other (objects of 60-64 KiB, every one different): they share a class,
// which reserves the largest, so a Reserve call serves many puts, as for one steady size (one
// Reserve per new size before, each left unused).
TEST_F(ReservationPoolTest, NearbySizesShareReservations) {
  ReservationPool pool(link_.get(), "c", 64 << 20);
  Counter* reserves = ReserveCalls();
  std::set<uint64_t> names;
  for (uint64_t i = 0; i < 200; ++i) {
    const uint64_t size = kSize - (i * 37) % (kSize / 16);  // 200 sizes in (60 KiB, 64 KiB]
    ASSERT_EQ(ReservationPool::ClassOf(size), kSize);
    auto held = TakeOnce(pool, i == 0 ? kSize : size, names);
    ASSERT_TRUE(held);
    EXPECT_GE(held->replica.length(), i == 0 ? kSize : size);
    EXPECT_LE(held->replica.length(), size + size / 8) << "at most 1/8 above the size";
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_LE(reserves->Value(), 40u) << "Reserve calls for 200 takes of 200 sizes";
}

TEST_F(ReservationPoolTest, ClassesSpanAnEighthAndSmallSizesAreTheirOwn) {
  for (uint64_t size : {uint64_t{1}, uint64_t{15}, uint64_t{16}, uint64_t{100}, uint64_t{4096},
                        uint64_t{65537}, uint64_t{3} << 30, ~uint64_t{0} - 5}) {
    const uint64_t cls = ReservationPool::ClassOf(size);
    EXPECT_GE(cls, size);
    EXPECT_LE(cls - size, size / 8) << size;
    EXPECT_EQ(ReservationPool::ClassOf(cls), cls) << "a class is its own class";
  }
  EXPECT_EQ(ReservationPool::ClassOf(15), 15u);
  EXPECT_EQ(ReservationPool::ClassOf(65537), 73728u);
  EXPECT_EQ(ReservationPool::ClassOf(73728), 73728u);
}

// Told that the master refuses smaller objects, the pool hands out exact sizes only.
TEST_F(ReservationPoolTest, AfterExactSizesOnlyOnlyTheSizeAskedForIsHandedOut) {
  ReservationPool pool(link_.get(), "c", 64 << 20);
  ASSERT_TRUE(TakeSoon(pool, kSize));  // the class now reserves kSize
  ASSERT_TRUE(TakeSoon(pool, kSize));
  pool.ExactSizesOnly();
  for (int i = 0; i < 5; ++i) {
    auto held = TakeSoon(pool, kSize - 100);
    ASSERT_TRUE(held);
    EXPECT_EQ(held->replica.length(), kSize - 100);
  }
}

TEST_F(ReservationPoolTest, ThePoolStaysWithinItsBytes) {
  ReservationPool pool(link_.get(), "c", 4 * kSize);
  for (int i = 0; i < 50; ++i) {
    (void)pool.Take(kSize);  // misses keep raising the target
    std::this_thread::sleep_for(milliseconds(2));
  }
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_LE(pool.stats().held_bytes, 4 * kSize);
  EXPECT_EQ(pool.Take(5 * kSize), std::nullopt);
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(pool.Take(5 * kSize), std::nullopt) << "a size beyond the cap is never reserved";
}

TEST_F(ReservationPoolTest, AReservationPastHalfItsLeaseIsNeverHandedOut) {
  ReservationPool pool(link_.get(), "c", 8 << 20);
  auto first = TakeSoon(pool, kSize);
  ASSERT_TRUE(first);
  const auto taken_at = steady_clock::now();
  pool.Return(*first);  // the commit refused the key: the reservation is unused, still held
  std::this_thread::sleep_for(milliseconds(350));  // past half of the 600 ms lease
  for (int i = 0; i < 20; ++i) {
    auto held = pool.Take(kSize);
    if (!held) {
      std::this_thread::sleep_for(milliseconds(5));
      continue;
    }
    EXPECT_NE(held->name, first->name)
        << "handed out "
        << std::chrono::duration_cast<milliseconds>(steady_clock::now() - taken_at).count()
        << " ms after it was taken, past half its lease";
    pool.Return(*held);
  }
}

TEST_F(ReservationPoolTest, CloseReleasesWhatItHoldsButNotWhatItHandedOut) {
  ReservationPool pool(link_.get(), "c", 8 << 20);
  auto held = TakeSoon(pool, kSize);
  ASSERT_TRUE(held);
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_GT(state_.reservation_count(), 1u) << "the refill reserved more";
  pool.Close();
  // The one handed out may have been written (or committed): only its lease may end it.
  EXPECT_EQ(state_.reservation_count(), 1u);
  EXPECT_EQ(pool.Take(kSize), std::nullopt) << "a closed pool hands out nothing";
}

}  // namespace
}  // namespace granary::client
