#include "common/thread_pool.h"

#include <atomic>
#include <memory>

namespace granary {

ThreadPool::ThreadPool(size_t threads) {
  for (size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (n == 1 || workers_.empty()) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // Work is claimed by index, so whoever is free takes the next item; the caller works too,
  // which also makes nested or concurrent calls progress even when every worker is busy.
  struct Shared {
    std::atomic<size_t> next{0};
    std::atomic<size_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto shared = std::make_shared<Shared>();
  auto run = [shared, n, &fn] {
    size_t i;
    while ((i = shared->next.fetch_add(1)) < n) {
      fn(i);
      if (shared->done.fetch_add(1) + 1 == n) {
        std::lock_guard lock(shared->mu);
        shared->cv.notify_all();
      }
    }
  };
  size_t helpers = std::min(workers_.size(), n - 1);
  {
    std::lock_guard lock(mu_);
    for (size_t h = 0; h < helpers; ++h) queue_.push_back(run);
  }
  // One worker per task: waking them all would have the idle ones fight for the lock on the
  // cores this call's own work needs.
  for (size_t h = 0; h < helpers; ++h) cv_.notify_one();
  run();
  std::unique_lock lock(shared->mu);
  shared->cv.wait(lock, [&] { return shared->done.load() == n; });
}

}  // namespace granary
