// common/spin_wait.h - a short, bounded busy wait for a socket's answer before sleeping on it.
//
// Why: a thread that sleeps in the kernel for an answer pays a wake-up when it comes, and where
// idle cores halt (a VM's vCPUs, deep C-states) that wake-up is a large share of a same-host round
// trip (measured on the 2-core box: 64 bytes over loopback TCP 22 us sleeping, 15 us spinning;
// bench/profiles/spin-wait-2026-12-01.txt). An answer expected within microseconds is cheaper to
// wait for awake.
//
// Promise: SpinUntilReadable returns true as soon as `fd` has bytes to read (or an error or hang-up
// to report); false once `budget_us` microseconds have passed without, or at once when the budget
// is 0, the process already has its quota of spinning threads, or a recent spin ran out (below).
// False says only "not known to be readable": the caller then sleeps in its receive as it would
// have. It never reads, so that receive finds every byte. It never blocks: each try is a
// zero-timeout poll().
// The quota: at most max(1, cores / 2) threads of the process spin at once (cores: the CPUs this
// process may run on), so waiters that spin never take every core from the threads, here or in a
// server on the same host, that would answer them. A thread that finds the quota taken sleeps as
// before. The budget bounds the CPU one wait can burn; 0 turns spinning off.
// Thread safety: any thread; the quota is one atomic counter.
#pragma once

#include <cstdint>

namespace granary::net {

// The default budget of ClientOptions::spin_wait_us: a little over one same-host round trip on the
// machines measured, so most answers from the host come while spinning, and a remote answer costs
// at most this much CPU before the thread sleeps.
inline constexpr uint32_t kDefaultSpinWaitUs = 50;

inline constexpr uint32_t kSkipAfterMiss = 8;

bool SpinUntilReadable(int fd, uint32_t budget_us);

// How many threads may spin at once in this process, and how many spin now (for tests).
uint32_t SpinQuota();
uint32_t SpinningNow();

}  // namespace granary::net
