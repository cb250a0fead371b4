#include "common/spin_wait.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace granary::net {

namespace {

std::atomic<uint32_t> g_spinning{0};
// Waits that go straight to sleep because a recent spin ran out (kSkipAfterMiss per miss).
std::atomic<uint32_t> g_skip{0};

uint32_t ComputeQuota() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return static_cast<uint32_t>(std::max(0, cores / 2));
}

inline void Relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

}  // namespace

uint32_t SpinQuota() {
  static const uint32_t quota = ComputeQuota();
  return quota;
}

uint32_t SpinningNow() { return g_spinning.load(std::memory_order_relaxed); }

void ResetSpinSkipForTest() { g_skip.store(0, std::memory_order_relaxed); }

uint32_t ResolveSpinWaitUs(int option_us) {
  long long us = option_us;
  if (us < 0) {
    const char* env = std::getenv("GRANARY_SPIN_WAIT_US");
    char* end = nullptr;
    us = env != nullptr && *env != '\0' ? std::strtoll(env, &end, 10) : -1;
    if (us < 0 || end == nullptr || *end != '\0') us = kDefaultSpinWaitUs;
  }
  return static_cast<uint32_t>(std::min<long long>(us, kMaxSpinWaitUs));
}

bool SpinUntilReadable(int fd, uint32_t budget_us) {
  if (budget_us == 0) return false;
  uint32_t skip = g_skip.load(std::memory_order_relaxed);
  while (skip > 0) {  // bounded: each failed exchange means another waiter took one
    if (g_skip.compare_exchange_weak(skip, skip - 1, std::memory_order_relaxed)) return false;
  }
  const uint32_t quota = SpinQuota();
  uint32_t now_spinning = g_spinning.load(std::memory_order_relaxed);
  do {
    if (now_spinning >= quota) return false;
  } while (!g_spinning.compare_exchange_weak(now_spinning, now_spinning + 1,
                                             std::memory_order_relaxed));
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(budget_us);
  bool ready = false;
  // Bounded by the budget: each pass is one zero-timeout poll and a clock read.
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) {
      ready = true;
      break;
    }
    if (std::chrono::steady_clock::now() >= until) break;
    Relax();
  }
  g_spinning.fetch_sub(1, std::memory_order_relaxed);
  // Answers slower than the budget (a remote or busy peer): the next waits sleep at once, so a
  // spin that does not pay costs at most one in kSkipAfterMiss + 1 waits the budget in CPU.
  if (!ready) g_skip.store(kSkipAfterMiss, std::memory_order_relaxed);
  return ready;
}

}  // namespace granary::net
