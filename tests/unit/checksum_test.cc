// Tests of common/checksum.h: which side of a copy the object checksum certifies.
#include "common/checksum.h"
#include "common/tsan.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

namespace granary {
namespace {

std::vector<std::byte> Pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return v;
}

TEST(ChecksumTest, CopyAndUpdateVariantsCopyAndHashTheSameWhenNothingInterferes) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{65536}, size_t{65537},
                   size_t{3} << 20}) {
    auto src = Pattern(n, 7);
    std::vector<std::byte> a(n), b(n);
    ChecksumStream hash_dst, hash_src;
    hash_dst.CopyAndUpdate(a.data(), src.data(), n);
    hash_src.CopyAndUpdateSource(b.data(), src.data(), n);
    EXPECT_EQ(a, src) << n;
    EXPECT_EQ(b, src) << n;
    EXPECT_EQ(hash_dst.Digest(), Checksum(std::span<const std::byte>(src))) << n;
    EXPECT_EQ(hash_src.Digest(), Checksum(std::span<const std::byte>(src))) << n;
  }
}

// Issue 13: a same-host put copies into shared memory that another process may write at the same
// moment. The digest sent to the master must be that of the caller's bytes, so a reader's
// checksum catches the foreign write instead of the put certifying it.
TEST(ChecksumTest, PutDigestIsTheSourcesWhileTheDestinationIsScribbledOn) {
  constexpr size_t kSize = size_t{32} << 20;
  const auto src = Pattern(kSize, 42);
  const uint64_t expected = Checksum(std::span<const std::byte>(src));
  std::vector<std::byte> shared(kSize);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> passes{0};
  std::thread scribbler([&] {
    // It plays another process writing shared memory: a race by design (common/tsan.h).
    ScopedSegmentWrite foreign;
    uint8_t v = 1;
    while (!stop.load(std::memory_order_relaxed)) {
      // A foreign writer: touches a byte in every 1 KiB of the destination, pass after pass.
      for (size_t off = 0; off < kSize; off += 1024) {
        reinterpret_cast<volatile uint8_t*>(shared.data())[off] = v;
      }
      ++v;
      passes.fetch_add(1, std::memory_order_relaxed);
    }
  });
  // Bounded: waits for the scribbler at most 5 s, then copies for about 1.5 s.
  const auto start_wait = std::chrono::steady_clock::now();
  while (passes.load() == 0 && std::chrono::steady_clock::now() - start_wait < std::chrono::seconds(5)) {
    std::this_thread::yield();
  }
  int copies = 0;
  int wrong = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (copies < 3 || (std::chrono::steady_clock::now() < deadline && copies < 200)) {
    ChecksumStream digest;
    {
      ScopedSegmentWrite payload;  // as ReplicaIo::Write does for its copy into a segment
      digest.CopyAndUpdateSource(shared.data(), src.data(), kSize);
    }
    if (digest.Digest() != expected) ++wrong;
    ++copies;
  }
  stop = true;
  scribbler.join();
  ASSERT_GT(passes.load(), 0u) << "the scribbler never ran";
  EXPECT_EQ(wrong, 0) << wrong << " of " << copies
                      << " digests certified bytes another writer put into the destination";
}

}  // namespace
}  // namespace granary
