// common/clock.h - the time source of every TTL and timeout in Granary.
//
// Promise: NowMs() is milliseconds. SystemClock reads steady_clock (monotonic, but its epoch is
// per machine boot: for local durations only). WallClock reads the system clock (Unix epoch):
// the master's time base, because its operations' times must mean the same on every master that
// replays them (the master keeps its own order monotonic on top). ManualClock only moves when a
// test advances it, so TTL behaviour is tested without sleeping.
// Thread safety: both are safe to call from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace granary {

using Millis = std::chrono::milliseconds;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMs() const = 0;
};

class SystemClock final : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  static SystemClock* Instance() {
    static SystemClock clock;
    return &clock;
  }
};

class WallClock final : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<Millis>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  static WallClock* Instance() {
    static WallClock clock;
    return &clock;
  }
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_ms = 1'000'000) : now_(start_ms) {}
  int64_t NowMs() const override { return now_.load(std::memory_order_relaxed); }
  void Advance(Millis d) { now_.fetch_add(d.count(), std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace granary
