// node/segment_populator.h - zeroes a prefaulted segment's pages in the background, once, at start.
//
// Why: fallocate reserves a tmpfs page but leaves it to be zeroed by whoever touches it first, so
// on a fresh node the first client paid ~0.4 s per GiB of zeroing in its warm-up or its first puts
// (2.0 s against 0.33 s for a later client's warm-up of a 4 GiB segment, docs/benchmarks.md).
// Populating the node's own mapping right after the segment is created moves that cost to the
// node's start, before clients come.
//
// Promise: Start(base, size) populates [base, base+size) front to back in steps of kStep with
// MADV_POPULATE_WRITE on one background thread. It never changes a byte (a write fault on a page
// already written maps it; on a reserved page it zeroes what no one has written), so it may run
// while clients put. It must only be given memory whose pages are reserved (a prefaulted
// segment): populating an unreserved tmpfs range would allocate it all. A failing madvise (a
// kernel before 5.14, a full tmpfs) ends the run quietly. Stop() (and the destructor) returns
// within one step; the memory must stay mapped until then.
// Thread safety: Start once, from the owner's thread; done()/bytes_populated() from any thread;
// Stop from the owner's thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>

namespace granary::node {

class SegmentPopulator {
 public:
  static constexpr uint64_t kStep = uint64_t{64} << 20;

  SegmentPopulator() = default;
  ~SegmentPopulator() { Stop(); }
  SegmentPopulator(const SegmentPopulator&) = delete;
  SegmentPopulator& operator=(const SegmentPopulator&) = delete;

  void Start(void* base, uint64_t size);
  void Stop();
  // True once the thread ended: every page populated, stopped, or madvise failed.
  bool done() const { return done_.load(std::memory_order_acquire); }
  uint64_t bytes_populated() const { return populated_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> stopping_{false};
  std::atomic<bool> done_{false};
  std::atomic<uint64_t> populated_{0};
  std::thread thread_;
};

}  // namespace granary::node
