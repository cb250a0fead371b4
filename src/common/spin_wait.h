// common/spin_wait.h - a short, bounded busy wait for a socket's answer before sleeping on it.
//
// Why: a thread that sleeps in the kernel for an answer pays a wake-up when it comes, and where
// idle cores halt (a VM's vCPUs, deep C-states) that wake-up is a large share of a same-host round
// trip (measured on the 2-core box: 64 bytes over loopback TCP 31 us p50 sleeping, 22 us polling;
// bench/results/spin-wait-2026-12-01/pingpong.txt). An answer expected within microseconds is
// cheaper to wait for awake.
//
// Promise: SpinUntilReadable returns true as soon as `fd` has bytes to read (or an error or hang-up
// to report); false once `budget_us` microseconds have passed without, or at once when the budget
// is 0, the process already has its quota of spinning threads, or the process's last spin ran
// out not long ago (the skip below). False says only "not known to be readable": the caller then
// sleeps in its receive as it would have. It never reads, so that receive finds every byte. It
// never blocks: each try is a zero-timeout poll().
// The quota: at most cores / 2 threads of the process spin at once (cores: the CPUs this process
// may run on; a process on one CPU never spins), so waiters that spin never take every core from
// the threads, here or in a server on the same host, that would answer them. It is per process:
// several client processes on one host may together spin on every core, and CPU limits set by a
// cgroup are not seen. A thread that finds the quota taken sleeps as before.
// The skip: a spin that runs out (the answer was slower than the budget: a remote or busy peer)
// sends the process's next kSkipAfterMiss waits, on any socket, straight to sleep, so spinning
// that does not pay burns its budget on about one wait in kSkipAfterMiss + 1.
// Thread safety: any thread; the quota and the skip are atomic counters.
#pragma once

#include <cstdint>

namespace granary::net {

// The default budget of ClientOptions::spin_wait_us: a little over one same-host round trip on the
// machines measured, so most answers from the host come while spinning, and a remote answer costs
// at most this much CPU before the thread sleeps.
inline constexpr uint32_t kDefaultSpinWaitUs = 50;
// The longest budget an option may ask: a spin is meant to be short.
inline constexpr uint32_t kMaxSpinWaitUs = 1'000'000;
// Waits sent straight to sleep after a spin ran out.
inline constexpr uint32_t kSkipAfterMiss = 8;

bool SpinUntilReadable(int fd, uint32_t budget_us);

// ClientOptions::spin_wait_us resolved: a value >= 0 as given; -1 (any negative) takes
// $GRANARY_SPIN_WAIT_US when it is a whole number >= 0, else kDefaultSpinWaitUs. Cut to
// kMaxSpinWaitUs.
uint32_t ResolveSpinWaitUs(int option_us);

// How many threads may spin at once in this process, and how many spin now (for tests).
uint32_t SpinQuota();
uint32_t SpinningNow();
// Forgets a recent miss, so the next wait may spin (tests only: they start from a known state).
void ResetSpinSkipForTest();

}  // namespace granary::net
