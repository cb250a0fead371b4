#include "transfer/mapping_warmer.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>

#include "common/copy.h"
#include "common/populate.h"

namespace granary::transfer {

MappingWarmer::~MappingWarmer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MappingWarmer::Warm(const std::shared_ptr<ShmMapping>& mapping) {
  if (!mapping || mapping->size() == 0) return;
  std::lock_guard lock(mu_);
  if (stopping_) return;
  queue_.push_back({mapping, mapping->size()});
  stats_.bytes_pending += mapping->size();
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  cv_.notify_one();
}

MappingWarmer::Stats MappingWarmer::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void MappingWarmer::Run() {
  CalibrateCopy();  // background setup work too: the copy routine of this process (common/copy.h)
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    uint64_t offset = 0;
    while (!stopping_ && offset < job.size) {
      std::shared_ptr<ShmMapping> mapping = job.mapping.lock();  // held for one step only
      if (!mapping || mapping->retired()) break;  // a retired file's pages must stay released
      const uint64_t len = std::min(kStep, job.size - offset);
      lock.unlock();
      const auto start = std::chrono::steady_clock::now();
      bool ok = madvise(mapping->data() + offset, len, MADV_POPULATE_READ) == 0;
      if (mapping->retired()) {
        // Retired during this step: give back what it faulted in (nobody's bytes).
        (void)madvise(mapping->data() + offset, len, MADV_REMOVE);
        ok = false;
      }
      const auto took = std::chrono::steady_clock::now() - start;
      mapping.reset();  // unmapped here if it was dropped meanwhile
      lock.lock();
      if (!ok) break;  // unsupported kernel, or a page that cannot be backed
      offset += len;
      stats_.bytes_warmed += len;
      stats_.bytes_pending -= len;
      stats_.warm_ns += static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(took).count());
    }
    // Whatever was not populated (stopped, dropped, failed) is no longer pending.
    stats_.bytes_pending -= std::min(stats_.bytes_pending, job.size - offset);
  }
}

}  // namespace granary::transfer
