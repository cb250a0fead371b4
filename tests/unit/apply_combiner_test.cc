// ApplyCombiner: each task runs once, never two at a time, in the order the callers queued them;
// a turn runs at most max_turn tasks and then hands over; a task's exception reaches its own
// caller; Run returns only after its task ran.
#include "master/state/apply_combiner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace granary::master {
namespace {

using namespace std::chrono_literals;

// Waits (bounded) until `combiner` has `n` tasks queued.
bool WaitQueued(const ApplyCombiner& combiner, size_t n) {
  for (int i = 0; i < 5000; ++i) {
    if (combiner.queued() == n) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

TEST(ApplyCombinerTest, ManyCallersEachTaskRunsOnceAloneAndBeforeItsRunReturns) {
  std::mutex serial;
  ApplyCombiner combiner(&serial, 8, 2);
  constexpr int kThreads = 8, kCalls = 3000;
  uint64_t counter = 0;  // plain: the combiner's mutual exclusion is what keeps it right
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0}, unlocked{0}, not_yet_ran{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) {
        bool ran = false;
        combiner.Run([&] {
          if (inside.fetch_add(1) != 0) overlaps++;
          if (serial.try_lock()) {  // the task must run with `serial` held
            serial.unlock();
            unlocked++;
          }
          counter++;
          ran = true;
          inside.fetch_sub(1);
        });
        if (!ran) not_yet_ran++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, uint64_t{kThreads} * kCalls);
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(unlocked.load(), 0);
  EXPECT_EQ(not_yet_ran.load(), 0);
  EXPECT_EQ(combiner.queued(), 0u);
}

// What callers queued one by one did: the order their tasks ran in, and per caller the thread
// that ran its task and its own thread.
struct QueuedRun {
  bool queued = true;  // each caller was seen queued in turn (bounded wait)
  std::vector<int> order;
  std::vector<std::thread::id> ran_on, caller;
};

// Holds `serial` from outside while `callers` callers queue one by one, caller i the i-th in the
// queue (the first one's turn waits for `serial`), then lets go and joins them.
QueuedRun RunQueued(ApplyCombiner& combiner, std::mutex& serial, int callers) {
  QueuedRun run;
  run.ran_on.resize(callers);
  run.caller.resize(callers);
  std::vector<std::thread> threads;
  std::unique_lock hold(serial);
  for (int id = 0; id < callers && run.queued; ++id) {
    threads.emplace_back([&, id] {
      run.caller[id] = std::this_thread::get_id();
      combiner.Run([&, id] {
        run.order.push_back(id);  // written by tasks only
        run.ran_on[id] = std::this_thread::get_id();
      });
    });
    run.queued = WaitQueued(combiner, static_cast<size_t>(id) + 1);
  }
  hold.unlock();
  for (auto& t : threads) t.join();
  return run;
}

// Five callers queue behind a turn that waits for `serial`: then one turn runs them all, in the
// order they queued.
TEST(ApplyCombinerTest, QueuedTasksRunInArrivalOrderInOneTurn) {
  std::mutex serial;
  ApplyCombiner combiner(&serial, 32, 1);
  QueuedRun run = RunQueued(combiner, serial, 5);
  ASSERT_TRUE(run.queued);
  EXPECT_EQ(run.order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(combiner.turns(), 1u);
  EXPECT_EQ(combiner.combined_tasks(), 4u);
}

// max_turn 2: the first turn runs 0 and 1 and hands the turn to 2, which runs 2 and 3 and hands
// it to 4: three turns, still in arrival order.
TEST(ApplyCombinerTest, ATurnRunsAtMostMaxTurnTasksThenHandsTheTurnToTheOldestCaller) {
  std::mutex serial;
  ApplyCombiner combiner(&serial, 2, 1);
  QueuedRun run = RunQueued(combiner, serial, 5);
  ASSERT_TRUE(run.queued);
  EXPECT_EQ(run.order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(combiner.turns(), 3u);
  EXPECT_EQ(combiner.combined_tasks(), 2u);
  EXPECT_EQ(run.ran_on[0], run.caller[0]);
  EXPECT_EQ(run.ran_on[1], run.caller[0]);
  EXPECT_EQ(run.ran_on[2], run.caller[2]);
  EXPECT_EQ(run.ran_on[3], run.caller[2]);
  EXPECT_EQ(run.ran_on[4], run.caller[4]);
}

// max_turn 1 (set after construction, as the master's --apply-turn-ops does): a FIFO lock, each
// task on its own caller's thread, still in arrival order.
TEST(ApplyCombinerTest, WithMaxTurnOneEachCallerRunsOnlyItsOwnTaskInArrivalOrder) {
  std::mutex serial;
  ApplyCombiner combiner(&serial);
  combiner.set_limits(1, 1);
  QueuedRun run = RunQueued(combiner, serial, 4);
  ASSERT_TRUE(run.queued);
  EXPECT_EQ(run.order, (std::vector<int>{0, 1, 2, 3}));
  for (int id = 0; id < 4; ++id) EXPECT_EQ(run.ran_on[id], run.caller[id]) << id;
  EXPECT_EQ(combiner.turns(), 4u);
  EXPECT_EQ(combiner.combined_tasks(), 0u);
}

// min_waiting 3: with two callers behind the turn's own, the lock passes in arrival order, each
// task on its own caller's thread; with three behind it, one turn runs them all.
TEST(ApplyCombinerTest, ATurnRunsOthersTasksOnlyWhileAtLeastMinWaitingWait) {
  for (int behind : {2, 3}) {
    SCOPED_TRACE(behind);
    std::mutex serial;
    ApplyCombiner combiner(&serial, 32, 3);
    QueuedRun run = RunQueued(combiner, serial, behind + 1);
    ASSERT_TRUE(run.queued);
    std::vector<int> expected;
    for (int id = 0; id <= behind; ++id) expected.push_back(id);
    EXPECT_EQ(run.order, expected);
    if (behind == 2) {
      for (int id = 0; id <= behind; ++id) EXPECT_EQ(run.ran_on[id], run.caller[id]) << id;
      EXPECT_EQ(combiner.turns(), 3u);
      EXPECT_EQ(combiner.combined_tasks(), 0u);
    } else {
      for (int id = 0; id <= behind; ++id) EXPECT_EQ(run.ran_on[id], run.caller[0]) << id;
      EXPECT_EQ(combiner.turns(), 1u);
      EXPECT_EQ(combiner.combined_tasks(), 3u);
    }
  }
}

// A task that throws, run by another caller's turn: its own Run rethrows it; the turn's caller
// and the tasks after it are not affected.
TEST(ApplyCombinerTest, AnExceptionReachesOnlyTheCallerWhoseTaskThrew) {
  std::mutex serial;
  ApplyCombiner combiner(&serial, 32, 1);
  std::atomic<int> ran{0};
  std::string caught;
  bool first_threw = false, third_threw = false;
  std::unique_lock hold(serial);
  std::thread first([&] {
    try {
      combiner.Run([&] { ran++; });
    } catch (...) {
      first_threw = true;
    }
  });
  ASSERT_TRUE(WaitQueued(combiner, 1));
  std::thread second([&] {
    try {
      combiner.Run([&]() { throw std::runtime_error("task two"); });
    } catch (const std::runtime_error& e) {
      caught = e.what();
    }
  });
  ASSERT_TRUE(WaitQueued(combiner, 2));
  std::thread third([&] {
    try {
      combiner.Run([&] { ran++; });
    } catch (...) {
      third_threw = true;
    }
  });
  ASSERT_TRUE(WaitQueued(combiner, 3));
  hold.unlock();
  first.join();
  second.join();
  third.join();
  EXPECT_EQ(caught, "task two");
  EXPECT_EQ(ran.load(), 2);
  EXPECT_FALSE(first_threw);
  EXPECT_FALSE(third_threw);
  EXPECT_EQ(combiner.turns(), 1u);
}

// A runner that applies every leading tagged task of a turn as one group, and spreads eight
// parts over the turn's waiting callers: part 0 waits (bounded) until another thread has run a
// part, so the parts cannot all run on the turn holder's thread.
struct TestGroupRunner final : ApplyCombiner::GroupRunner {
  struct Tag {
    int id;
    bool applied = false;
  };
  std::vector<int> order;        // ids in the order they were applied, grouped or alone
  std::vector<size_t> groups;    // each group's size
  std::atomic<int> part_runs[8] = {};
  std::mutex threads_mu;
  std::vector<std::thread::id> part_threads;
  bool part_zero_saw_a_helper = false;

  size_t RunGroup(std::span<void* const> tags, ApplyCombiner::Helpers& helpers) noexcept override {
    size_t n = 0;
    while (n < tags.size() && tags[n] != nullptr) ++n;
    if (n < 2) return 0;
    helpers.ParallelFor(8, [](void* ctx, size_t part) noexcept {
      auto& self = *static_cast<TestGroupRunner*>(ctx);
      self.part_runs[part]++;
      {
        std::lock_guard lock(self.threads_mu);
        self.part_threads.push_back(std::this_thread::get_id());
      }
      if (part != 0) return;
      for (int i = 0; i < 5000; ++i) {
        {
          std::lock_guard lock(self.threads_mu);
          for (auto id : self.part_threads) {
            if (id != std::this_thread::get_id()) self.part_zero_saw_a_helper = true;
          }
          if (self.part_zero_saw_a_helper) return;
        }
        std::this_thread::sleep_for(1ms);
      }
    }, this);
    for (size_t i = 0; i < n; ++i) {
      auto* tag = static_cast<Tag*>(tags[i]);
      order.push_back(tag->id);
      tag->applied = true;
    }
    groups.push_back(n);
    return n;
  }
};

// Five callers queue behind a held turn; the middle one's task has no tag. The runner applies
// {0, 1} as a group, 2 runs alone, {3, 4} as a group: arrival order kept, no grouped task's own
// function called, every Run returning after its task was applied, each part run exactly once,
// some on a waiting caller's thread.
TEST(ApplyCombinerTest, AGroupRunnerAppliesLeadingTaggedTasksAndBorrowsTheWaitingCallers) {
  std::mutex serial;
  ApplyCombiner combiner(&serial, 32, 1);
  TestGroupRunner runner;
  combiner.set_group_runner(&runner);
  std::vector<TestGroupRunner::Tag> tags{{0}, {1}, {2}, {3}, {4}};
  std::atomic<int> own_functions_run{0}, returned_before_applied{0};
  std::vector<std::thread> threads;
  bool queued = true;
  std::unique_lock hold(serial);
  for (int id = 0; id < 5 && queued; ++id) {
    threads.emplace_back([&, id] {
      combiner.Run(
          [&, id] {
            own_functions_run++;
            runner.order.push_back(id);  // under the turn, as the runner's writes are
            tags[id].applied = true;
          },
          id == 2 ? nullptr : &tags[id]);
      if (!tags[id].applied) returned_before_applied++;
    });
    queued = WaitQueued(combiner, static_cast<size_t>(id) + 1);
  }
  ASSERT_TRUE(queued);
  hold.unlock();
  for (auto& t : threads) t.join();
  EXPECT_EQ(runner.order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(runner.groups, (std::vector<size_t>{2, 2}));
  EXPECT_EQ(own_functions_run.load(), 1) << "only the untagged task runs its own function";
  EXPECT_EQ(returned_before_applied.load(), 0);
  EXPECT_EQ(combiner.grouped_tasks(), 4u);
  for (int part = 0; part < 8; ++part) EXPECT_EQ(runner.part_runs[part].load(), 2) << part;
  EXPECT_TRUE(runner.part_zero_saw_a_helper) << "no part ran on a waiting caller's thread";
  EXPECT_GT(combiner.helped_parts(), 0u);
}

// A runner that declines (returns 0) leaves every task to run alone, in order.
TEST(ApplyCombinerTest, ADecliningGroupRunnerLeavesEachTaskToItsOwnFunction) {
  struct Declining final : ApplyCombiner::GroupRunner {
    int offered = 0;
    size_t RunGroup(std::span<void* const>, ApplyCombiner::Helpers&) noexcept override {
      offered++;
      return 0;
    }
  } runner;
  std::mutex serial;
  ApplyCombiner combiner(&serial, 32, 1);
  combiner.set_group_runner(&runner);
  int tag = 0;
  std::vector<int> order;
  std::vector<std::thread> threads;
  bool queued = true;
  std::unique_lock hold(serial);
  for (int id = 0; id < 4 && queued; ++id) {
    threads.emplace_back([&, id] { combiner.Run([&, id] { order.push_back(id); }, &tag); });
    queued = WaitQueued(combiner, static_cast<size_t>(id) + 1);
  }
  ASSERT_TRUE(queued);
  hold.unlock();
  for (auto& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_GT(runner.offered, 0);
  EXPECT_EQ(combiner.grouped_tasks(), 0u);
}

// Alone, a caller runs its own task on its own thread and combines nothing.
TEST(ApplyCombinerTest, AnUncontendedCallRunsOnItsOwnThread) {
  std::mutex serial;
  ApplyCombiner combiner(&serial);
  std::thread::id ran_on;
  for (int i = 0; i < 3; ++i) combiner.Run([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(combiner.turns(), 3u);
  EXPECT_EQ(combiner.combined_tasks(), 0u);
}

}  // namespace
}  // namespace granary::master
