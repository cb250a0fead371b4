#include "common/copy.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>

namespace granary {
namespace {

// GB/s of the best of `trials` passes of `copy` over `total` bytes in `block`-byte blocks.
template <typename Copy>
double BestGBps(Copy copy, std::byte* dst, const std::byte* src, size_t total, size_t block) {
  const auto start = std::chrono::steady_clock::now();
  for (size_t off = 0; off + block <= total; off += block) copy(dst + off, src + off, block);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s > 0 ? total / s / 1e9 : 0;
}

// Evicts [p, p + n) from every cache level, so the next stores to it meet cold lines.
void Flush(const std::byte* p, size_t n) {
#if defined(__SSE2__)
  for (size_t off = 0; off < n; off += 64) _mm_clflush(p + off);
  _mm_mfence();
#else
  (void)p;
  (void)n;
#endif
}

// GB/s of one copy of `n` bytes into a destination flushed first (a put's new extent).
template <typename Copy>
double ColdGBps(Copy copy, std::byte* dst, const std::byte* src, size_t n) {
  Flush(dst, n);
  return BestGBps(copy, dst, src, n, n);
}

CopyChoice Measure() {
  CopyChoice c;
  if (const char* forced = std::getenv("GRANARY_COPY")) {
    const std::string f = forced;
    if (f == "memcpy" || f == "vector" || f == "stream") {
      c.forced = f;
      c.memcpy_small = c.memcpy_large = f == "memcpy";
      c.stream_large_shared = f == "stream";
      return c;
    }
  }
  // 16 MiB each way: more than most L2s, so the copies stream as the data path's do.
  constexpr size_t kTotal = 16 << 20;
  constexpr int kTrials = 5;
  auto src = std::make_unique<std::byte[]>(kTotal);
  auto dst = std::make_unique<std::byte[]>(kTotal);
  std::memset(src.get(), 0x5a, kTotal);
  std::memset(dst.get(), 0xa5, kTotal);  // faults the pages in before timing
  auto libc = [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); };
  auto vec = [](void* d, const void* s, size_t n) { CopyBytesVector(d, s, n); };
  for (int t = 0; t < kTrials; ++t) {  // interleaved, so a noisy moment hits both
    c.small_memcpy_gbps = std::max(c.small_memcpy_gbps, BestGBps(libc, dst.get(), src.get(), kTotal, 64 << 10));
    c.small_vector_gbps = std::max(c.small_vector_gbps, BestGBps(vec, dst.get(), src.get(), kTotal, 64 << 10));
    c.large_memcpy_gbps = std::max(c.large_memcpy_gbps, BestGBps(libc, dst.get(), src.get(), kTotal, 4 << 20));
    c.large_vector_gbps = std::max(c.large_vector_gbps, BestGBps(vec, dst.get(), src.get(), kTotal, 4 << 20));
  }
  c.memcpy_small = c.small_memcpy_gbps > c.small_vector_gbps;
  c.memcpy_large = c.large_memcpy_gbps > c.large_vector_gbps;
  // Into cold memory: the large routine just chosen against streaming stores.
  auto plain = [large = c.memcpy_large](void* d, const void* s, size_t n) {
    if (large) {
      std::memcpy(d, s, n);
    } else {
      CopyBytesVector(d, s, n);
    }
  };
  auto stream = [](void* d, const void* s, size_t n) { StreamBytes(d, s, n); };
  constexpr size_t kCold = 4 << 20;
  for (int t = 0; t < kTrials; ++t) {  // alternating which goes first (the source's cache state)
    for (int k = 0; k < 2; ++k) {
      if ((t + k) % 2 == 0) {
        c.cold_plain_gbps =
            std::max(c.cold_plain_gbps, ColdGBps(plain, dst.get(), src.get(), kCold));
      } else {
        c.cold_stream_gbps =
            std::max(c.cold_stream_gbps, ColdGBps(stream, dst.get(), src.get(), kCold));
      }
    }
  }
  c.stream_large_shared = c.cold_stream_gbps > c.cold_plain_gbps;
  return c;
}

}  // namespace

const CopyChoice& CalibrateCopy() {
  static const CopyChoice choice = [] {
    CopyChoice c = Measure();
    copy_internal::use_memcpy_small.store(c.memcpy_small, std::memory_order_relaxed);
    copy_internal::use_memcpy_large.store(c.memcpy_large, std::memory_order_relaxed);
    copy_internal::stream_large_shared.store(c.stream_large_shared, std::memory_order_relaxed);
    return c;
  }();
  return choice;
}

}  // namespace granary
