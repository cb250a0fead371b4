// common/spin_wait.h against its promises: true as soon as the socket is readable (bytes or a
// hang-up), never reading them; false once the budget passes, at once with a zero budget, with
// the quota of spinning threads taken, and for the kSkipAfterMiss waits after a spin ran out.
#include "common/spin_wait.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <thread>
#include <vector>

namespace granary::net {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

class SpinWaitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (SpinQuota() == 0) GTEST_SKIP() << "one CPU: this process never spins";
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0);
    DrainSkips();
  }
  void TearDown() override {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
    DrainSkips();
  }
  // A miss in an earlier test leaves waits that sleep at once.
  void DrainSkips() { ResetSpinSkipForTest(); }
  static double MsSince(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  }
  int fds_[2] = {-1, -1};  // [0] writes, [1] is waited on
};

TEST_F(SpinWaitTest, ReadableAtOnceIsTrueAndNothingIsRead) {
  ASSERT_EQ(::write(fds_[0], "abc", 3), 3);
  const auto start = Clock::now();
  EXPECT_TRUE(SpinUntilReadable(fds_[1], 2'000'000));
  EXPECT_LT(MsSince(start), 1000.0);
  char got[4] = {};
  ASSERT_EQ(::recv(fds_[1], got, sizeof(got), MSG_DONTWAIT), 3);  // all three still there
  EXPECT_STREQ(got, "abc");
}

TEST_F(SpinWaitTest, BytesArrivingDuringTheSpinEndItEarly) {
  std::thread writer([&] {
    std::this_thread::sleep_for(20ms);
    ASSERT_EQ(::write(fds_[0], "y", 1), 1);
  });
  const auto start = Clock::now();
  EXPECT_TRUE(SpinUntilReadable(fds_[1], 5'000'000));  // 5 s budget
  const double ms = MsSince(start);
  writer.join();
  EXPECT_GE(ms, 15.0);
  EXPECT_LT(ms, 4000.0);
}

TEST_F(SpinWaitTest, AHangUpCountsAsReadable) {
  ::close(fds_[0]);
  fds_[0] = -1;
  EXPECT_TRUE(SpinUntilReadable(fds_[1], 2'000'000));
}

TEST_F(SpinWaitTest, SilenceReturnsFalseOnceTheBudgetHasPassed) {
  const auto start = Clock::now();
  EXPECT_FALSE(SpinUntilReadable(fds_[1], 30'000));  // 30 ms
  const double ms = MsSince(start);
  EXPECT_GE(ms, 30.0);
  EXPECT_LT(ms, 3000.0);  // bounded: it never blocks past its budget (slack for a loaded box)
}

TEST_F(SpinWaitTest, AZeroBudgetNeverSpins) {
  ASSERT_EQ(::write(fds_[0], "z", 1), 1);
  EXPECT_FALSE(SpinUntilReadable(fds_[1], 0));  // off: even a readable socket is not polled
}

TEST_F(SpinWaitTest, AfterASpinRunsOutTheNextWaitsSleepAtOnce) {
  ASSERT_FALSE(SpinUntilReadable(fds_[1], 2'000));  // a miss
  ASSERT_EQ(::write(fds_[0], "w", 1), 1);
  for (uint32_t i = 0; i < kSkipAfterMiss; ++i) {
    const auto start = Clock::now();
    EXPECT_FALSE(SpinUntilReadable(fds_[1], 2'000'000)) << "wait " << i << " spun";
    EXPECT_LT(MsSince(start), 1000.0);
  }
  EXPECT_TRUE(SpinUntilReadable(fds_[1], 2'000'000));  // the skips are used up: it spins again
}

TEST_F(SpinWaitTest, NoMoreThanTheQuotaSpinAtOnce) {
  const uint32_t quota = SpinQuota();
  ASSERT_EQ(::write(fds_[0], "q", 1), 1);
  // The quota's worth of threads spin on silent sockets, each until told to stop (a write).
  std::vector<std::array<int, 2>> silent(quota);
  for (auto& p : silent) ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p.data()), 0);
  std::vector<std::thread> spinners;
  for (auto& p : silent) {
    spinners.emplace_back([fd = p[1]] { EXPECT_TRUE(SpinUntilReadable(fd, 20'000'000)); });
  }
  const auto until = Clock::now() + 10s;
  while (SpinningNow() < quota && Clock::now() < until) std::this_thread::sleep_for(1ms);
  const bool all_spinning = SpinningNow() == quota;
  EXPECT_TRUE(all_spinning) << SpinningNow() << " of " << quota << " spinning";
  if (all_spinning) {
    // One more waiter, on a socket that is readable: the quota is taken, so it does not spin.
    EXPECT_FALSE(SpinUntilReadable(fds_[1], 2'000'000));
    EXPECT_EQ(SpinningNow(), quota);
  }
  for (auto& p : silent) EXPECT_EQ(::write(p[0], "s", 1), 1);
  for (auto& t : spinners) t.join();
  EXPECT_EQ(SpinningNow(), 0u);
  EXPECT_TRUE(SpinUntilReadable(fds_[1], 2'000'000));  // a free slot again
  for (auto& p : silent) {
    ::close(p[0]);
    ::close(p[1]);
  }
}

// ClientOptions::spin_wait_us: a value >= 0 as given (cut to a second), -1 the environment's
// whole number, else the default.
TEST(SpinWaitOptionTest, ResolvesTheOptionThenTheEnvironmentThenTheDefault) {
  ::unsetenv("GRANARY_SPIN_WAIT_US");
  EXPECT_EQ(ResolveSpinWaitUs(0), 0u);
  EXPECT_EQ(ResolveSpinWaitUs(120), 120u);
  EXPECT_EQ(ResolveSpinWaitUs(2'000'000'000), kMaxSpinWaitUs);
  EXPECT_EQ(ResolveSpinWaitUs(-1), kDefaultSpinWaitUs);
  ::setenv("GRANARY_SPIN_WAIT_US", "0", 1);
  EXPECT_EQ(ResolveSpinWaitUs(-1), 0u);
  EXPECT_EQ(ResolveSpinWaitUs(30), 30u);  // an explicit option wins over the environment
  ::setenv("GRANARY_SPIN_WAIT_US", "75", 1);
  EXPECT_EQ(ResolveSpinWaitUs(-1), 75u);
  for (const char* bad : {"", "abc", "12us", "-5"}) {
    ::setenv("GRANARY_SPIN_WAIT_US", bad, 1);
    EXPECT_EQ(ResolveSpinWaitUs(-1), kDefaultSpinWaitUs) << "'" << bad << "'";
  }
  ::unsetenv("GRANARY_SPIN_WAIT_US");
}

}  // namespace
}  // namespace granary::net
