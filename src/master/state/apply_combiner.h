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
// Groups (set_group_runner): a Run may carry a tag; the turn holder offers a runner the tags of
// the tasks it took, from the next one on, and the runner may apply a leading run of them as one
// group (their task functions are then not called) and say how many. A group may borrow the
// threads of the turn's other callers, which only wait meanwhile (Helpers::ParallelFor): each
// part runs exactly once, on the turn holder or a waiting caller, and ParallelFor returns after
// all ran; a caller lent as a helper is back to waiting before ParallelFor returns, and its Run
// returns only once its own task or group is done.
// Threads: any. `serial` is also taken directly by code that must exclude tasks (queries,
// Replay); tasks must not call Run (the turn is not re-entrant, like the mutex it holds).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <span>
#include <type_traits>
#include <vector>

namespace granary::master {

class ApplyCombiner {
  struct Waiter;

 public:
  // The callers of a turn that may help its holder: borrowed only inside ParallelFor.
  class Helpers {
   public:
    // Callers that may lend their thread (not counting the turn holder's).
    size_t available() const { return waiters_.size(); }
    // Runs fn(ctx, part) once for every part in [0, parts), on this thread and on up to
    // parts - 1 waiting callers; returns after every part ran. fn must not throw.
    void ParallelFor(size_t parts, void (*fn)(void* ctx, size_t part) noexcept, void* ctx);

   private:
    friend class ApplyCombiner;
    Helpers(ApplyCombiner* owner, std::span<Waiter* const> waiters)
        : owner_(owner), waiters_(waiters) {}
    ApplyCombiner* owner_;
    std::span<Waiter* const> waiters_;
  };
  // Applies a leading run of a turn's tagged tasks as one group, under *serial, on the turn
  // holder's thread. tags: the tags of the turn's tasks not yet run, in order (null for a task
  // run alone). Returns how many of them it applied (0: none; the first then runs alone). It
  // must not throw: a group half applied cannot be handed back to its callers.
  class GroupRunner {
   public:
    virtual size_t RunGroup(std::span<void* const> tags, Helpers& helpers) noexcept = 0;

   protected:
    ~GroupRunner() = default;
  };

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

  // Set before the combiner is shared; null: every task runs alone.
  void set_group_runner(GroupRunner* runner) { runner_ = runner; }

  // tag: what a GroupRunner is shown of this task (null: it always runs alone).
  template <typename Task>
  void Run(Task&& task, void* tag = nullptr) {
    using T = std::remove_reference_t<Task>;
    Waiter w;
    w.fn = [](void* t) { (*static_cast<T*>(t))(); };
    w.task = &task;
    w.tag = tag;
    RunWaiter(w);
  }

  // Tasks that ran on a thread other than their caller's (combined), and turns taken: a turn
  // that ran only its own caller's task combined nothing. For tests and metrics.
  uint64_t combined_tasks() const { return combined_.load(std::memory_order_relaxed); }
  uint64_t turns() const { return turns_.load(std::memory_order_relaxed); }
  // Tasks a GroupRunner applied, and parts of ParallelFor that ran on a lent caller's thread.
  uint64_t grouped_tasks() const { return grouped_.load(std::memory_order_relaxed); }
  uint64_t helped_parts() const { return helped_.load(std::memory_order_relaxed); }
  // Tasks queued and not yet taken by a turn (tests use it to order their callers).
  size_t queued() const;

 private:
  // kHelp: the turn holder lends this caller's thread to `job`; the caller moves it to kHelping
  // when it starts (or the holder takes it back to kQueued if it never did), and back to kQueued
  // when it has finished.
  enum : uint32_t { kQueued = 0, kDone = 1, kYourTurn = 2, kHelp = 3, kHelping = 4 };
  struct HelpJob {
    void (*fn)(void*, size_t) noexcept = nullptr;
    void* ctx = nullptr;
    size_t parts = 0;
    std::atomic<size_t> next{0};  // the next part to claim
  };
  struct Waiter {
    void (*fn)(void*) = nullptr;
    void* task = nullptr;
    void* tag = nullptr;
    HelpJob* job = nullptr;  // written before the kHelp store, read after it
    std::atomic<uint32_t> state{kQueued};
    std::exception_ptr error;
  };

  void RunWaiter(Waiter& w);
  // Holds the turn: runs queued tasks under *serial until none is left or max_turn ran.
  void Combine(const Waiter& own);
  // Runs batch_[from]'s task alone, or a group from it; returns how many tasks ran.
  size_t RunNext(size_t from, const Waiter& own);
  static void Wake(std::atomic<uint32_t>& state, uint32_t value);
  // Waits until w is done or handed the turn, lending its thread to jobs meanwhile.
  void WaitWhileQueued(Waiter& w);
  static size_t RunParts(HelpJob& job);

  std::mutex* const serial_;
  std::atomic<size_t> max_turn_;
  std::atomic<size_t> min_waiting_;
  mutable std::mutex queue_mu_;  // a leaf: held only to queue, take a batch, or pass the turn
  std::deque<Waiter*> queue_;    // under queue_mu_, oldest first
  bool turn_taken_ = false;       // under queue_mu_: some caller is combining or about to
  std::vector<Waiter*> batch_;    // the combiner's, under the turn
  std::vector<void*> tags_;       // the combiner's, under the turn: batch_'s tags
  std::vector<Waiter*> lendable_;  // the combiner's, under the turn: batch_ less its own
  GroupRunner* runner_ = nullptr;
  std::atomic<uint64_t> combined_{0};
  std::atomic<uint64_t> turns_{0};
  std::atomic<uint64_t> grouped_{0};
  std::atomic<uint64_t> helped_{0};
};

}  // namespace granary::master
