// transfer/mapping_warmer.h - maps the pages of a client's new segment mappings in the background.
//
// Why: a process's first write to each 4 KiB page of a shared-memory mapping takes a page fault
// of its own, and on a VM those faults held a fresh client's puts to 1-2% of memcpy. Populating
// the mapping for reading maps every page writable at once (a shared tmpfs mapping needs no
// dirty tracking) at about 0.1 s per GiB, after which writes run at memcpy speed
// (`granary-bench limits`, "shm write after warm-up").
//
// Promise: Warm(mapping) queues it; one background thread populates it front to back (the low
// offsets a fresh master hands out first) in steps of kStep with MADV_POPULATE_READ. It holds a
// mapping only for one step, so a dropped mapping is unmapped at most one step later and its
// warm-up stops; so does that of a file a remount retired (node/shm_segment.h), whose pages a step
// under way gives back (MADV_REMOVE: nobody's bytes). It never writes a byte of a live segment
// and never raises SIGBUS: where a page cannot be backed (a full /dev/shm under a node that did
// not prefault) madvise fails and that mapping's warm-up ends. A kernel without MADV_POPULATE_READ (before 5.14) warms nothing. Populating allocates the
// pages of a segment its node did not prefault, as the client's own writes would.
// The thread first calibrates the process's copy routine (common/copy.h, a few milliseconds).
// Thread safety: Warm and stats from any thread; the destructor stops the thread and joins it
// (within one step, or the calibration if it is under way).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "transfer/shm_mapping.h"

namespace granary::transfer {

class MappingWarmer {
 public:
  static constexpr uint64_t kStep = uint64_t{64} << 20;

  struct Stats {
    uint64_t bytes_warmed = 0;   // populated so far
    uint64_t bytes_pending = 0;  // queued or in progress, not yet populated
    uint64_t warm_ns = 0;        // time spent populating
  };

  MappingWarmer() = default;
  ~MappingWarmer();
  MappingWarmer(const MappingWarmer&) = delete;
  MappingWarmer& operator=(const MappingWarmer&) = delete;

  void Warm(const std::shared_ptr<ShmMapping>& mapping);
  Stats stats() const;

 private:
  void Run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    std::weak_ptr<ShmMapping> mapping;
    uint64_t size = 0;
  };
  std::deque<Job> queue_;                        // guarded by mu_
  Stats stats_;                                  // guarded by mu_
  bool stopping_ = false;                        // guarded by mu_
  std::thread thread_;                           // started by the first Warm
};

}  // namespace granary::transfer
