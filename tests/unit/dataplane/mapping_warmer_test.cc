// Tests of transfer::MappingWarmer: a warmed mapping has its pages mapped in this process (its
// Rss in /proc/self/smaps), its bytes untouched; a dropped mapping is let go; a segment whose
// pages cannot be backed ends the warm-up instead of raising SIGBUS; the destructor is prompt.
#include "transfer/mapping_warmer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "common/copy.h"
#include "node/shm_segment.h"
#include "../../tools/smaps.h"

namespace granary {
namespace {

using transfer::MappingWarmer;
using transfer::ShmMapping;

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string UniqueName(const std::string& tag) {
  static std::atomic<int> counter{0};
  return "granary-test-warm-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" +
         tag;
}

// Waits (at most 20 s) until the warmer has nothing pending.
bool WaitIdle(const MappingWarmer& warmer) {
  for (int i = 0; i < 2000 && warmer.stats().bytes_pending > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return warmer.stats().bytes_pending == 0;
}

TEST(MappingWarmerTest, WarmedMappingHasEveryPageMappedAndItsBytesUnchanged) {
  const std::string name = UniqueName("full");
  const uint64_t size = 96 * kMiB;  // one full step and a partial one
  auto segment = node::ShmSegment::Create(name, size);
  ASSERT_TRUE(segment.ok()) << segment.status().ToString();
  for (uint64_t off = 0; off < size; off += 4096) (*segment)->data()[off] = uint8_t(off >> 12);

  auto attached = ShmMapping::Attach(name, size);
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  std::shared_ptr<ShmMapping> mapping = std::move(*attached);
  ASSERT_LT(testdata::MappedResidentBytes(mapping->data()), size / 2) << "a new mapping starts mostly unmapped";

  MappingWarmer warmer;
  warmer.Warm(mapping);
  ASSERT_TRUE(WaitIdle(warmer));
  EXPECT_EQ(warmer.stats().bytes_warmed, size);
  EXPECT_GT(warmer.stats().warm_ns, 0u);
  EXPECT_GE(testdata::MappedResidentBytes(mapping->data()), size) << "the warm-up left pages unmapped";
  for (uint64_t off = 0; off < size; off += 4096) {
    ASSERT_EQ(static_cast<uint8_t>(mapping->data()[off]), uint8_t(off >> 12)) << "at " << off;
  }
}

TEST(MappingWarmerTest, DroppedMappingIsReleasedAndNoLongerPending) {
  const std::string name = UniqueName("dropped");
  const uint64_t size = 256 * kMiB;
  auto segment = node::ShmSegment::Create(name, size);
  ASSERT_TRUE(segment.ok()) << segment.status().ToString();
  std::weak_ptr<ShmMapping> weak;
  MappingWarmer warmer;
  {
    auto attached = ShmMapping::Attach(name, size);
    ASSERT_TRUE(attached.ok());
    std::shared_ptr<ShmMapping> mapping = std::move(*attached);
    weak = mapping;
    warmer.Warm(mapping);
  }  // the client dropped its last reference: the warmer holds none beyond its current step
  ASSERT_TRUE(WaitIdle(warmer));
  EXPECT_TRUE(weak.expired()) << "the warmer kept a dropped mapping alive";
  EXPECT_LE(warmer.stats().bytes_warmed, size);
}

TEST(MappingWarmerTest, PagesThatCannotBeBackedEndTheWarmUpWithoutSigbus) {
  const std::string name = UniqueName("shrunk");
  const uint64_t size = 64 * kMiB;
  auto segment = node::ShmSegment::Create(name, size);
  ASSERT_TRUE(segment.ok()) << segment.status().ToString();
  auto attached = ShmMapping::Attach(name, size);
  ASSERT_TRUE(attached.ok());
  std::shared_ptr<ShmMapping> mapping = std::move(*attached);
  // The file shrinks under the mapping (a broken or hostile node): touching the data area would
  // now raise SIGBUS; populating it must fail instead.
  ASSERT_EQ(::truncate(("/dev/shm/" + name).c_str(), 4096), 0);
  MappingWarmer warmer;
  warmer.Warm(mapping);
  ASSERT_TRUE(WaitIdle(warmer));
  EXPECT_EQ(warmer.stats().bytes_warmed, 0u);
}

TEST(MappingWarmerTest, DestructorReturnsPromptlyWithWorkQueued) {
  const std::string name = UniqueName("queued");
  const uint64_t size = 512 * kMiB;
  auto segment = node::ShmSegment::Create(name, size);
  ASSERT_TRUE(segment.ok()) << segment.status().ToString();
  std::vector<std::shared_ptr<ShmMapping>> mappings;
  // The warmer's thread calibrates the copy routine first (once a process): done here, so the
  // clock below times the stop with 2 GiB queued, not ThreadSanitizer's slow calibration.
  CalibrateCopy();
  auto warmer = std::make_unique<MappingWarmer>();
  for (int i = 0; i < 4; ++i) {
    auto attached = ShmMapping::Attach(name, size);
    ASSERT_TRUE(attached.ok());
    mappings.push_back(std::move(*attached));
    warmer->Warm(mappings.back());
  }
  const auto start = std::chrono::steady_clock::now();
  warmer.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2))
      << "stopping waited for 2 GiB of warm-up";
}

// Every routine, streamed ones included: shifts put the destination off 16-byte alignment
// (streaming stores need it: the head is copied plainly) and sizes leave tails of 1-63 bytes.
TEST(CopyTest, EveryRoutineCopiesEverySizeAndOffsetExactly) {
  std::vector<uint8_t> src(3 * kMiB + 129), dst;
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 131 + 7);
  const bool calibrated = copy_internal::stream_large_shared.load();
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{63}, size_t{64}, size_t{65},
                   size_t{4096 + 3}, size_t{64 << 10}, size_t{1 << 20}, size_t{3 * kMiB + 1}}) {
    for (size_t shift : {size_t{0}, size_t{1}, size_t{7}, size_t{15}}) {
      for (int routine = 0; routine < 6; ++routine) {
        dst.assign(n + 16, 0xEE);
        if (routine == 0) CopyBytesVector(dst.data() + shift, src.data() + shift, n);
        if (routine == 1) std::memcpy(dst.data() + shift, src.data() + shift, n);
        if (routine == 2) CopyBytes(dst.data() + shift, src.data() + shift, n);
        if (routine == 3) StreamBytes(dst.data() + shift, src.data() + shift, n);
        if (routine >= 4) {  // CopyIntoShared, with streaming off and on
          copy_internal::stream_large_shared.store(routine == 5);
          CopyIntoShared(dst.data() + shift, src.data() + shift, n);
          copy_internal::stream_large_shared.store(calibrated);
        }
        ASSERT_EQ(std::memcmp(dst.data() + shift, src.data() + shift, n), 0) << n << " " << routine;
        for (size_t i = 0; i < shift; ++i) ASSERT_EQ(dst[i], 0xEE) << "wrote before the range";
        for (size_t i = shift + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE) << "wrote past it";
      }
    }
  }
}

TEST(CopyTest, CalibrationMeasuresBothRoutinesAndKeepsTheFaster) {
  const CopyChoice& c = CalibrateCopy();
  if (!c.forced.empty()) GTEST_SKIP() << "GRANARY_COPY=" << c.forced << " forces the routine";
  EXPECT_GT(c.small_memcpy_gbps, 0);
  EXPECT_GT(c.small_vector_gbps, 0);
  EXPECT_GT(c.large_memcpy_gbps, 0);
  EXPECT_GT(c.large_vector_gbps, 0);
  EXPECT_EQ(c.memcpy_small, c.small_memcpy_gbps > c.small_vector_gbps);
  EXPECT_EQ(c.memcpy_large, c.large_memcpy_gbps > c.large_vector_gbps);
  EXPECT_GT(c.cold_plain_gbps, 0);
  EXPECT_GT(c.cold_stream_gbps, 0);
  EXPECT_EQ(c.stream_large_shared, c.cold_stream_gbps > c.cold_plain_gbps);
  EXPECT_EQ(copy_internal::stream_large_shared.load(), c.stream_large_shared);
  EXPECT_EQ(&CalibrateCopy(), &c) << "calibration ran twice";
}

}  // namespace
}  // namespace granary
