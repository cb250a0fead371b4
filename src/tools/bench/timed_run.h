// tools/bench/timed_run.h - runs one benchmark case: a call on several threads for a bounded time.
//
// RunTimed(threads, seconds, max_calls, op) calls op(thread, i) with i = 0, 1, ... shared across
// the threads until `seconds` pass or `max_calls` calls were issued. Latency percentiles are over
// the calls that succeeded; failures are counted and the first is kept for the report.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "granary/status.h"
#include "tools/bench/bench.h"

namespace granary::bench {

struct Measured {
  uint64_t calls = 0;   // completed without error
  uint64_t issued = 0;  // including errors: how many keys a put case may have written
  uint64_t errors = 0;
  double seconds = 0;
  double p50_us = 0, p99_us = 0, p999_us = 0;
  std::string first_error;
};

// op(thread, i) on `threads` threads until `seconds` pass or `max_calls` calls were issued.
template <typename Op>
Measured RunTimed(int threads, double seconds, uint64_t max_calls, Op op) {
  std::atomic<uint64_t> issued{0};
  std::vector<std::vector<double>> lat(threads);
  std::vector<uint64_t> errors(threads, 0);
  std::vector<std::string> first_error(threads);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
        const uint64_t i = issued.fetch_add(1);
        if (i >= max_calls) break;
        const auto t0 = std::chrono::steady_clock::now();
        Status s = op(t, i);
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        if (s.ok()) {
          lat[t].push_back(us);
        } else if (errors[t]++ == 0) {
          first_error[t] = s.ToString();
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  Measured m;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.issued = std::min(issued.load(), max_calls);
  std::vector<double> all;
  for (int t = 0; t < threads; ++t) {
    all.insert(all.end(), lat[t].begin(), lat[t].end());
    m.errors += errors[t];
    if (m.first_error.empty()) m.first_error = first_error[t];
  }
  std::sort(all.begin(), all.end());
  m.calls = all.size();
  m.p50_us = Percentile(all, 50);
  m.p99_us = Percentile(all, 99);
  m.p999_us = Percentile(all, 99.9);
  return m;
}

}  // namespace granary::bench
