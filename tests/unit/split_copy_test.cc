// Tests of client/split_copy.h: a copy shared with a pool worker lands the same bytes and leaves
// the same checksum state as one thread's copy-and-hash, and its hash reads only the private side.
#include "client/split_copy.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

#include "common/tsan.h"
#include "../tools/test_pattern.h"

namespace granary::client {
namespace {

using testdata::Pattern;

uint64_t Digest(const std::vector<std::byte>& prefix, const std::vector<std::byte>& bytes) {
  return Checksum(std::vector<std::span<const std::byte>>{prefix, bytes});
}

// Sizes around the split threshold and the 64 KiB cut, each after an earlier part (the stream
// continues an object's hash), with a pool, a pool of no workers and none.
// Large copies into the segment both streamed and not (CopyIntoShared's two routines).
TEST(SplitCopyTest, LandsTheBytesAndTheDigestOfOneThreadsCopy) {
  ThreadPool two(2), none(0);
  const auto earlier = Pattern("earlier", 1000);
  // Restored however the test ends (an ASSERT returns early).
  struct Restore {
    bool was = copy_internal::stream_large_shared.load();
    ~Restore() { copy_internal::stream_large_shared.store(was); }
  } restore;
  for (int run = 0; run < 6; ++run) {
    const bool stream = run >= 3;
    ThreadPool* pool = std::array<ThreadPool*, 3>{&two, &none, nullptr}[run % 3];
    copy_internal::stream_large_shared.store(stream);
    for (size_t n : {kSplitCopyBytes - 1, kSplitCopyBytes, kSplitCopyBytes + 1,
                     kSplitCopyBytes + (64 << 10), size_t{4} << 20, (size_t{4} << 20) + 13,
                     (size_t{5} << 20) + 1}) {
      const auto src = Pattern("src", n, n);
      std::vector<std::byte> segment(n), out(n);
      ChecksumStream put, get;
      put.Update(earlier.data(), earlier.size());
      get.Update(earlier.data(), earlier.size());
      SplitCopyToSegment(pool, put, segment.data(), src.data(), n);
      SplitCopyFromSegment(pool, get, out.data(), segment.data(), n);
      ASSERT_EQ(segment, src) << n;
      ASSERT_EQ(out, src) << n;
      EXPECT_EQ(put.Digest(), Digest(earlier, src)) << n << (stream ? " streamed" : "");
      EXPECT_EQ(get.Digest(), Digest(earlier, src)) << n << (stream ? " streamed" : "");
    }
  }
}

// A batch's transfers already run on the pool's workers when each splits its copy on the same
// pool: every call still returns (the caller works too), each with its own object's digest.
TEST(SplitCopyTest, SplitsFromInsideTheSamePoolsBatchFinishCorrectly) {
  ThreadPool pool(2);
  constexpr size_t kObjects = 8;
  constexpr size_t kSize = (size_t{2} << 20) + 4096;
  std::vector<std::vector<std::byte>> src, segment(kObjects), out(kObjects);
  for (size_t i = 0; i < kObjects; ++i) {
    src.push_back(Pattern("object", kSize, i));
    segment[i].resize(kSize);
    out[i].resize(kSize);
  }
  std::vector<uint64_t> put(kObjects), get(kObjects);
  pool.ParallelFor(kObjects, [&](size_t i) {
    ChecksumStream p, g;
    SplitCopyToSegment(&pool, p, segment[i].data(), src[i].data(), kSize);
    SplitCopyFromSegment(&pool, g, out[i].data(), segment[i].data(), kSize);
    put[i] = p.Digest();
    get[i] = g.Digest();
  });
  for (size_t i = 0; i < kObjects; ++i) {
    const uint64_t expected = Checksum(std::span<const std::byte>(src[i]));
    EXPECT_EQ(out[i], src[i]) << i;
    EXPECT_EQ(put[i], expected) << i;
    EXPECT_EQ(get[i], expected) << i;
  }
}

// Plays another process writing the segment: touches a byte in every 1 KiB, pass after pass,
// until stopped (a race by design, common/tsan.h). Waits at most 5 s for its first pass.
class Scribbler {
 public:
  explicit Scribbler(std::vector<std::byte>& bytes) : thread_([this, &bytes] {
    ScopedSegmentWrite foreign;
    uint8_t v = 1;
    while (!stop_.load(std::memory_order_relaxed)) {
      for (size_t off = 0; off < bytes.size(); off += 1024) {
        reinterpret_cast<volatile uint8_t*>(bytes.data())[off] = v;
      }
      ++v;
      passes_.fetch_add(1, std::memory_order_relaxed);
    }
  }) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (passes_.load() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  }
  ~Scribbler() { Stop(); }
  uint64_t Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return passes_.load();
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> passes_{0};
  std::thread thread_;
};

// Copies for about a second (at least 3 times, at most 200), counting digests that are not
// `expected(i)`.
template <typename Copy, typename Expected>
int CountWrongDigests(Copy copy, Expected expected) {
  int copies = 0, wrong = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
  while (copies < 3 || (std::chrono::steady_clock::now() < deadline && copies < 200)) {
    ChecksumStream sum;
    copy(sum);
    if (sum.Digest() != expected()) ++wrong;
    ++copies;
  }
  return wrong;
}

// A put's digest is that of the caller's bytes, whatever a foreign writer puts into the segment
// while both threads copy (issue 13's rule, common/checksum.h).
TEST(SplitCopyTest, PutDigestIsTheSourcesWhileTheSegmentIsScribbledOn) {
  ThreadPool pool(2);
  constexpr size_t kSize = size_t{8} << 20;
  const auto src = Pattern("put", kSize);
  const uint64_t expected = Checksum(std::span<const std::byte>(src));
  std::vector<std::byte> segment(kSize);
  Scribbler scribbler(segment);
  const int wrong = CountWrongDigests(
      [&](ChecksumStream& sum) { SplitCopyToSegment(&pool, sum, segment.data(), src.data(), kSize); },
      [&] { return expected; });
  ASSERT_GT(scribbler.Stop(), 0u) << "the scribbler never ran";
  EXPECT_EQ(wrong, 0) << wrong << " digests certified bytes another writer put into the segment";
}

// A get's digest is that of the bytes handed to the caller, never a second look at the segment:
// with the segment scribbled on during the copy, the digest still matches what was delivered (a
// hash of the segment would differ from it whenever a write fell between the copy and the hash).
TEST(SplitCopyTest, GetDigestIsThatOfTheBytesDeliveredWhileTheSegmentIsScribbledOn) {
  ThreadPool pool(2);
  constexpr size_t kSize = size_t{8} << 20;
  auto segment = Pattern("get", kSize);
  std::vector<std::byte> out(kSize);
  Scribbler scribbler(segment);
  const int wrong = CountWrongDigests(
      [&](ChecksumStream& sum) {
        SplitCopyFromSegment(&pool, sum, out.data(), segment.data(), kSize);
      },
      [&] { return Checksum(std::span<const std::byte>(out)); });
  ASSERT_GT(scribbler.Stop(), 0u) << "the scribbler never ran";
  EXPECT_EQ(wrong, 0) << wrong << " digests were not those of the bytes delivered";
}

}  // namespace
}  // namespace granary::client
