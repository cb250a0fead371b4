// common/thread_pool.h - a fixed set of worker threads for running the transfers of one batch in
// parallel.
//
// Promise: ParallelFor(n, fn) calls fn(0..n-1) each exactly once, on the workers and the calling
// thread, and returns when all have returned. Calls from several threads share the workers.
// Ownership: owns its threads; the destructor joins them (pending work is finished first).
// Thread safety: ParallelFor may be called from any thread, including concurrently.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace granary {

class ThreadPool {
 public:
  explicit ThreadPool(size_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);
  size_t threads() const { return workers_.size(); }  // the workers, not counting callers

 private:
  void WorkerLoop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace granary
