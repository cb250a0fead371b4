// master/state/apply_combiner.h - runs callers' tasks one at a time under one mutex, each on
// whichever caller holds the turn (flat combining), so that under contention the state the tasks
// change stays in one core's cache and the mutex changes hands once per turn, not once per task.
//
// Promise: Run(task) returns after `task` ran exactly once, under *serial, with no other Run's
// task running at the same time. Tasks run in the order their Run calls queued them. A task may
// run on another thread than its caller's: it must not use the caller's thread-local state (the
// caller reads back what it needs after Run returns; Run's return happens-after the task). An
// exception a task throws is rethrown by its own Run, on its caller's thread.
// A turn runs its own caller's task first. It runs others' only while at least min_waiting
// callers wait: with fewer, the apply lock is not the bottleneck, and a caller that runs others'
// tasks delays its own work after Apply (its reply) for nothing; the turn then passes to the
// oldest waiter (a FIFO lock). A turn runs at most max_turn tasks and then hands the turn to the
// oldest waiting caller, so a combiner's own caller waits for no more than that many tasks.
// Threads: any. `serial` is also taken directly by code that must exclude tasks (queries,
// Replay); tasks must not call Run (the turn is not re-entrant, like the mutex it holds).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <type_traits>
#include <vector>

namespace granary::master {

class ApplyCombiner {
 public:
  explicit ApplyCombiner(std::mutex* serial, size_t max_turn = 32, size_t min_waiting = 4)
      : serial_(serial), max_turn_(max_turn == 0 ? 1 : max_turn),
        min_waiting_(min_waiting == 0 ? 1 : min_waiting) {}
  // max_turn 1: each caller runs only its own task, in arrival order (a FIFO lock). Set before
  // the combiner is shared, or between calls: a turn under way keeps the values it began with.
  void set_limits(size_t max_turn, size_t min_waiting) {
    max_turn_.store(max_turn == 0 ? 1 : max_turn, std::memory_order_relaxed);
    min_waiting_.store(min_waiting == 0 ? 1 : min_waiting, std::memory_order_relaxed);
  }
  ApplyCombiner(const ApplyCombiner&) = delete;
  ApplyCombiner& operator=(const ApplyCombiner&) = delete;

  template <typename Task>
  void Run(Task&& task) {
    using T = std::remove_reference_t<Task>;
    Waiter w;
    w.fn = [](void* t) { (*static_cast<T*>(t))(); };
    w.task = &task;
    RunWaiter(w);
  }

  // Tasks that ran on a thread other than their caller's (combined), and turns taken: a turn
  // that ran only its own caller's task combined nothing. For tests and metrics.
  uint64_t combined_tasks() const { return combined_.load(std::memory_order_relaxed); }
  uint64_t turns() const { return turns_.load(std::memory_order_relaxed); }
  // Tasks queued and not yet taken by a turn (tests use it to order their callers).
  size_t queued() const;

 private:
  enum : uint32_t { kQueued = 0, kDone = 1, kYourTurn = 2 };
  struct Waiter {
    void (*fn)(void*) = nullptr;
    void* task = nullptr;
    std::atomic<uint32_t> state{kQueued};
    std::exception_ptr error;
  };

  void RunWaiter(Waiter& w);
  // Holds the turn: runs queued tasks under *serial until none is left or max_turn ran.
  void Combine(const Waiter& own);
  static void Wake(std::atomic<uint32_t>& state, uint32_t value);
  static void WaitWhileQueued(std::atomic<uint32_t>& state);

  std::mutex* const serial_;
  std::atomic<size_t> max_turn_;
  std::atomic<size_t> min_waiting_;
  mutable std::mutex queue_mu_;  // a leaf: held only to queue, take a batch, or pass the turn
  std::deque<Waiter*> queue_;    // under queue_mu_, oldest first
  bool turn_taken_ = false;       // under queue_mu_: some caller is combining or about to
  std::vector<Waiter*> batch_;    // the combiner's, under the turn
  std::atomic<uint64_t> combined_{0};
  std::atomic<uint64_t> turns_{0};
};

}  // namespace granary::master
