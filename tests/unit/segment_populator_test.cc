// Tests of node::SegmentPopulator: a prefaulted segment's pages end up mapped in the node (its
// Rss covers the segment) without a byte changed, and Stop ends the run early.
#include "node/segment_populator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "node/shm_segment.h"
#include "../tools/smaps.h"

namespace granary {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string UniqueName(const std::string& tag) {
  return "granary-test-" + std::to_string(getpid()) + "-populate-" + tag;
}

bool WaitDone(const node::SegmentPopulator& p) {
  for (int i = 0; i < 3000 && !p.done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return p.done();
}

TEST(SegmentPopulatorTest, MapsEveryPageOfAPrefaultedSegmentAndChangesNoByte) {
  const uint64_t size = 200 * kMiB + 12345;  // not a multiple of the step
  auto seg = node::ShmSegment::Create(UniqueName("all"), size, /*prefault=*/true);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  uint8_t* data = (*seg)->data();
  const uint64_t marks[] = {0, 70 * kMiB + 3, size - 1};
  for (uint64_t at : marks) data[at] = static_cast<uint8_t>(0xA5 ^ at);
  EXPECT_LT(testdata::MappedResidentBytes(data), 16 * kMiB) << "the segment was mapped before populating";

  node::SegmentPopulator populator;
  populator.Start(data, size);
  ASSERT_TRUE(WaitDone(populator));
  EXPECT_EQ(populator.bytes_populated(), size);
  EXPECT_GE(testdata::MappedResidentBytes(data), size - 4096);
  for (uint64_t at : marks) EXPECT_EQ(data[at], static_cast<uint8_t>(0xA5 ^ at)) << at;
  for (uint64_t at = 1; at < size - 1; at += 4093) {
    if (at != marks[1]) {
      ASSERT_EQ(data[at], 0) << "byte " << at << " changed";
    }
  }
}

TEST(SegmentPopulatorTest, StopEndsTheRunAtAStepBoundary) {
  const uint64_t size = 512 * kMiB;
  auto seg = node::ShmSegment::Create(UniqueName("stop"), size, /*prefault=*/true);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  node::SegmentPopulator populator;
  populator.Start((*seg)->data(), size);
  populator.Stop();
  EXPECT_TRUE(populator.done());
  const uint64_t populated = populator.bytes_populated();
  EXPECT_TRUE(populated == size || populated % node::SegmentPopulator::kStep == 0) << populated;
  populator.Stop();  // a second Stop is harmless
}

}  // namespace
}  // namespace granary
