#include "node/segment_populator.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>

#include "common/logging.h"
#include "common/populate.h"

namespace granary::node {

void SegmentPopulator::Start(void* memory, uint64_t size) {
  thread_ = std::thread([this, base = static_cast<char*>(memory), size] {
    const auto start = std::chrono::steady_clock::now();
    uint64_t offset = 0;
    while (offset < size && !stopping_.load(std::memory_order_relaxed)) {
      const uint64_t len = std::min(kStep, size - offset);
      if (madvise(base + offset, len, MADV_POPULATE_WRITE) != 0) break;
      offset += len;
      populated_.store(offset, std::memory_order_relaxed);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    GLOG_INFO("segment pages populated: {} of {} bytes in {:.2f} s", offset, size, seconds);
    done_.store(true, std::memory_order_release);
  });
}

void SegmentPopulator::Stop() {
  stopping_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

}  // namespace granary::node
