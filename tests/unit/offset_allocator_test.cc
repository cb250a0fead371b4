// Unit tests of master/offset_allocator: correctness against a std::map shadow, utilisation,
// fragmentation reporting and the O(1) cost per call.

#include "master/space/offset_allocator.h"
#include "master/codec/binary_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>


namespace granary::master {
namespace {

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kTiB = uint64_t{1} << 40;
constexpr uint64_t kAlign = OffsetAllocator::kAlignment;

uint64_t RoundUp(uint64_t size) { return (size + kAlign - 1) / kAlign * kAlign; }

uint64_t Uniform(std::mt19937_64& rng, uint64_t lo, uint64_t hi) {
  return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
}

// What the allocator should look like, kept the slow obvious way: live allocations by offset.
// The free blocks are the gaps between them (the allocator always coalesces).
class Shadow {
 public:
  explicit Shadow(uint64_t capacity) : capacity_(capacity) {}

  ::testing::AssertionResult Add(const OffsetAllocator::Allocation& a, uint64_t requested) {
    if (a.offset % kAlign != 0 || a.size != RoundUp(requested)) {
      return ::testing::AssertionFailure() << "misaligned or wrong size: offset " << a.offset
                                           << " size " << a.size << " for " << requested;
    }
    if (a.offset > capacity_ || a.size > capacity_ - a.offset) {
      return ::testing::AssertionFailure() << "outside the segment: " << a.offset << "+" << a.size;
    }
    if (by_offset_.count(a.offset) != 0) {
      return ::testing::AssertionFailure() << "offset " << a.offset << " is already live";
    }
    auto next = by_offset_.lower_bound(a.offset);
    if (next != by_offset_.end() && next->first < a.offset + a.size) {
      return ::testing::AssertionFailure() << "overlaps the next allocation at " << next->first;
    }
    if (next != by_offset_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.size > a.offset) {
        return ::testing::AssertionFailure() << "overlaps the previous allocation at "
                                             << prev->first;
      }
    }
    by_offset_[a.offset] = Live{a.size};
    used_ += a.size;
    return ::testing::AssertionSuccess();
  }

  // A live allocation now of RoundUp(size) bytes at the same offset.
  void Shrink(uint64_t offset, uint64_t size) {
    auto it = by_offset_.find(offset);
    ASSERT_NE(it, by_offset_.end());
    Live& live = it->second;
    used_ -= live.size - RoundUp(size);
    live.size = RoundUp(size);
  }

  void Remove(uint64_t offset) {
    auto it = by_offset_.find(offset);
    ASSERT_NE(it, by_offset_.end());
    used_ -= it->second.size;
    by_offset_.erase(it);
  }

  std::vector<uint64_t> Gaps() const {
    std::vector<uint64_t> gaps;
    uint64_t cursor = 0;
    for (const auto& [offset, live] : by_offset_) {
      if (offset > cursor) gaps.push_back(offset - cursor);
      cursor = offset + live.size;
    }
    if (capacity_ > cursor) gaps.push_back(capacity_ - cursor);
    return gaps;
  }

  ::testing::AssertionResult Matches(const OffsetAllocator& alloc) const {
    const OffsetAllocator::Stats s = alloc.GetStats();
    const std::vector<uint64_t> gaps = Gaps();
    const uint64_t largest = gaps.empty() ? 0 : *std::max_element(gaps.begin(), gaps.end());
    if (s.capacity != capacity_ || s.used_bytes != used_ || s.free_bytes != capacity_ - used_ ||
        s.allocation_count != by_offset_.size() || s.free_block_count != gaps.size() ||
        s.largest_free_block != largest) {
      return ::testing::AssertionFailure()
             << "stats differ: used " << s.used_bytes << " vs " << used_ << ", allocations "
             << s.allocation_count << " vs " << by_offset_.size() << ", free blocks "
             << s.free_block_count << " vs " << gaps.size() << ", largest "
             << s.largest_free_block << " vs " << largest;
    }
    return ::testing::AssertionSuccess();
  }

  size_t live_count() const { return by_offset_.size(); }
  uint64_t used() const { return used_; }

 private:
  struct Live {
    uint64_t size;
  };
  uint64_t capacity_;
  uint64_t used_ = 0;
  std::map<uint64_t, Live> by_offset_;
};

TEST(OffsetAllocatorTest, CapacityIsRoundedDownToAlignment) {
  OffsetAllocator a(1000);
  EXPECT_EQ(a.capacity(), 960u);
  const OffsetAllocator::Stats s = a.GetStats();
  EXPECT_EQ(s.capacity, 960u);
  EXPECT_EQ(s.free_bytes, 960u);
  EXPECT_EQ(s.largest_free_block, 960u);
  EXPECT_EQ(s.free_block_count, 1u);

  OffsetAllocator tiny(63);  // nothing fits, nothing breaks
  EXPECT_EQ(tiny.capacity(), 0u);
  EXPECT_FALSE(tiny.Allocate(1).has_value());
  EXPECT_EQ(tiny.GetStats().free_block_count, 0u);
  EXPECT_EQ(tiny.GetStats().fragmentation(), 0.0);
}

TEST(OffsetAllocatorTest, BasicAllocateAndFree) {
  OffsetAllocator a(1 * kMiB);
  auto x = a.Allocate(100);
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->offset, 0u);
  EXPECT_EQ(x->size, 128u);  // rounded up to kAlignment, not more
  auto y = a.Allocate(64);
  ASSERT_TRUE(y.has_value());
  EXPECT_EQ(y->offset, 128u);
  EXPECT_EQ(y->size, 64u);
  EXPECT_NE(x->offset, y->offset);

  OffsetAllocator::Stats s = a.GetStats();
  EXPECT_EQ(s.used_bytes, 192u);
  EXPECT_EQ(s.free_bytes, 1 * kMiB - 192);
  EXPECT_EQ(s.allocation_count, 2u);
  EXPECT_EQ(s.free_block_count, 1u);
  EXPECT_EQ(s.largest_free_block, 1 * kMiB - 192);

  a.Free(x->offset, x->size);
  s = a.GetStats();
  EXPECT_EQ(s.used_bytes, 64u);
  EXPECT_EQ(s.allocation_count, 1u);
  EXPECT_EQ(s.free_block_count, 2u);  // [0,128) and the tail, split by y

  a.Free(y->offset, y->size);
  s = a.GetStats();
  EXPECT_EQ(s.used_bytes, 0u);
  EXPECT_EQ(s.allocation_count, 0u);
  EXPECT_EQ(s.free_block_count, 1u);
  EXPECT_EQ(s.largest_free_block, 1 * kMiB);
}

TEST(OffsetAllocatorTest, OffsetsAndSizesAreAligned) {
  OffsetAllocator a(64 * kMiB);
  Shadow shadow(a.capacity());
  std::mt19937_64 rng(7);
  for (;;) {
    const uint64_t size = Uniform(rng, 1, 100 * kKiB);
    auto r = a.Allocate(size);
    if (!r) break;
    ASSERT_EQ(r->offset % kAlign, 0u);
    ASSERT_EQ(r->size, RoundUp(size));
    ASSERT_TRUE(shadow.Add(*r, size));
  }
  EXPECT_TRUE(shadow.Matches(a));
  EXPECT_GT(shadow.live_count(), 1000u);
}

TEST(OffsetAllocatorTest, RejectsZeroAndOversizedRequestsCleanly) {
  OffsetAllocator a(1 * kTiB);
  const uint64_t cap = a.capacity();
  for (uint64_t size : {uint64_t{0}, uint64_t{1} << 63, std::numeric_limits<uint64_t>::max(),
                        std::numeric_limits<uint64_t>::max() - 62,  // round-up would wrap
                        cap + 1, cap + kAlign, uint64_t{1} << 41}) {
    EXPECT_FALSE(a.Allocate(size).has_value()) << size;
  }
  const OffsetAllocator::Stats s = a.GetStats();
  EXPECT_EQ(s.used_bytes, 0u);
  EXPECT_EQ(s.allocation_count, 0u);
  EXPECT_EQ(s.free_block_count, 1u);
  EXPECT_EQ(s.largest_free_block, cap);
}

TEST(OffsetAllocatorTest, FullCapacitySingleAllocation) {
  OffsetAllocator a(1 * kTiB + 63);  // 1 TiB after rounding down
  ASSERT_EQ(a.capacity(), 1 * kTiB);
  auto all = a.Allocate(1 * kTiB);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->offset, 0u);
  EXPECT_EQ(all->size, 1 * kTiB);
  OffsetAllocator::Stats s = a.GetStats();
  EXPECT_EQ(s.free_bytes, 0u);
  EXPECT_EQ(s.free_block_count, 0u);
  EXPECT_EQ(s.largest_free_block, 0u);
  EXPECT_EQ(s.fragmentation(), 0.0);
  EXPECT_FALSE(a.Allocate(1).has_value());

  a.Free(all->offset, all->size);
  s = a.GetStats();
  EXPECT_EQ(s.largest_free_block, 1 * kTiB);
  EXPECT_EQ(s.free_block_count, 1u);
  EXPECT_TRUE(a.Allocate(1 * kTiB).has_value());
}

TEST(OffsetAllocatorTest, LargestPossibleCapacityDoesNotOverflow) {
  OffsetAllocator a(std::numeric_limits<uint64_t>::max());
  const uint64_t cap = a.capacity();
  EXPECT_EQ(cap, std::numeric_limits<uint64_t>::max() / kAlign * kAlign);
  EXPECT_FALSE(a.Allocate(std::numeric_limits<uint64_t>::max()).has_value());
  auto half = a.Allocate(uint64_t{1} << 63);
  ASSERT_TRUE(half.has_value());
  EXPECT_EQ(half->size, uint64_t{1} << 63);
  auto rest = a.Allocate(cap - (uint64_t{1} << 63));
  ASSERT_TRUE(rest.has_value());
  EXPECT_EQ(rest->offset, uint64_t{1} << 63);
  EXPECT_EQ(a.GetStats().free_bytes, 0u);
  a.Free(half->offset, half->size);
  a.Free(rest->offset, rest->size);
  EXPECT_EQ(a.GetStats().largest_free_block, cap);
}

// A free block is split exactly: the rest stays free, and a request of the hole's size gets it.
TEST(OffsetAllocatorTest, ExactFitAndSplit) {
  OffsetAllocator a(1 * kMiB);
  auto x = a.Allocate(4 * kKiB);
  auto y = a.Allocate(8 * kKiB);
  auto z = a.Allocate(4 * kKiB);
  ASSERT_TRUE(x && y && z);
  a.Free(y->offset, y->size);
  EXPECT_EQ(a.GetStats().free_block_count, 2u);

  auto again = a.Allocate(8 * kKiB);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->offset, y->offset);  // the hole, not the tail
  EXPECT_EQ(a.GetStats().free_block_count, 1u);

  a.Free(again->offset, again->size);
  auto part = a.Allocate(3 * kKiB);
  ASSERT_TRUE(part.has_value());
  EXPECT_EQ(part->offset, y->offset);
  EXPECT_EQ(part->size, 3 * kKiB);
  EXPECT_EQ(a.GetStats().free_block_count, 2u);  // 5 KiB left of the hole, and the tail
  auto rest = a.Allocate(5 * kKiB);
  ASSERT_TRUE(rest.has_value());
  EXPECT_EQ(rest->offset, y->offset + 3 * kKiB);
  EXPECT_EQ(a.GetStats().free_block_count, 1u);
  EXPECT_EQ(a.GetStats().used_bytes, 16 * kKiB);
}

// 79 units free, 73 wanted: the first class that guarantees 73 starts at 80, so plain
// segregated fit fails; the allocator must look at the head of the request's own class.
TEST(OffsetAllocatorTest, UsesHeadOfOwnSizeClass) {
  OffsetAllocator a(79 * kAlign);
  auto r = a.Allocate(73 * kAlign);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->offset, 0u);
  EXPECT_EQ(a.GetStats().free_bytes, 6 * kAlign);
}

// The same property everywhere: a fresh segment serves any request up to its capacity.
TEST(OffsetAllocatorTest, FreshSegmentServesAnyRequestUpToCapacity) {
  for (uint64_t cap_units = 1; cap_units <= 300; ++cap_units) {
    for (uint64_t units = 1; units <= cap_units; ++units) {
      OffsetAllocator a(cap_units * kAlign);
      auto r = a.Allocate(units * kAlign - 1);
      ASSERT_TRUE(r.has_value()) << units << " units in " << cap_units;
      ASSERT_EQ(r->size, units * kAlign);
      ASSERT_EQ(a.GetStats().free_block_count, units == cap_units ? 0u : 1u);
    }
  }
}

TEST(OffsetAllocatorTest, FreeCoalescesWithBothNeighbours) {
  OffsetAllocator a(64 * kKiB);
  auto b0 = a.Allocate(16 * kKiB);
  auto b1 = a.Allocate(16 * kKiB);
  auto b2 = a.Allocate(16 * kKiB);
  auto b3 = a.Allocate(16 * kKiB);
  ASSERT_TRUE(b0 && b1 && b2 && b3);
  EXPECT_EQ(a.GetStats().free_block_count, 0u);

  a.Free(b0->offset, b0->size);
  a.Free(b2->offset, b2->size);
  EXPECT_EQ(a.GetStats().free_block_count, 2u);
  EXPECT_EQ(a.GetStats().largest_free_block, 16 * kKiB);

  a.Free(b1->offset, b1->size);  // joins b0 on the left and b2 on the right
  OffsetAllocator::Stats s = a.GetStats();
  EXPECT_EQ(s.free_block_count, 1u);
  EXPECT_EQ(s.largest_free_block, 48 * kKiB);
  EXPECT_EQ(s.fragmentation(), 0.0);

  a.Free(b3->offset, b3->size);
  s = a.GetStats();
  EXPECT_EQ(s.free_block_count, 1u);
  EXPECT_EQ(s.largest_free_block, 64 * kKiB);
  EXPECT_TRUE(a.Allocate(64 * kKiB).has_value());
}

TEST(OffsetAllocatorTest, FreeingEverythingInAnyOrderLeavesOneBlock) {
  OffsetAllocator a(256 * kMiB);
  Shadow shadow(a.capacity());
  std::mt19937_64 rng(11);
  std::vector<OffsetAllocator::Allocation> live;
  for (;;) {
    const uint64_t size = Uniform(rng, 1, 512 * kKiB);
    auto r = a.Allocate(size);
    if (!r) break;
    ASSERT_TRUE(shadow.Add(*r, size));
    live.push_back(*r);
  }
  std::shuffle(live.begin(), live.end(), rng);
  for (size_t i = 0; i < live.size(); ++i) {
    a.Free(live[i].offset, live[i].size);
    shadow.Remove(live[i].offset);
    if (i % 64 == 0) {
      ASSERT_TRUE(shadow.Matches(a)) << "after " << i << " frees";
    }
  }
  const OffsetAllocator::Stats s = a.GetStats();
  EXPECT_EQ(s.free_block_count, 1u);
  EXPECT_EQ(s.largest_free_block, a.capacity());
  EXPECT_EQ(s.free_bytes, a.capacity());
  EXPECT_EQ(s.allocation_count, 0u);
  EXPECT_EQ(s.fragmentation(), 0.0);
  EXPECT_TRUE(a.Allocate(a.capacity()).has_value());
}

// Debug builds assert; release builds ignore the call. Either way the allocator stays intact:
// a double free (alone, or merged into a free neighbour), ranges that start or end at a free
// block's edge, past the segment, misaligned, empty, or larger than all that is allocated.
TEST(OffsetAllocatorTest, DoubleFreeAndBogusRangesDoNotCorrupt) {
  OffsetAllocator a(1 * kMiB);
  auto x = a.Allocate(4 * kKiB);
  auto y = a.Allocate(4 * kKiB);
  auto z = a.Allocate(4 * kKiB);
  ASSERT_TRUE(x && y && z);
  a.Free(x->offset, x->size);  // [0, 4 KiB) is now a free block
  const OffsetAllocator::Stats before = a.GetStats();
  const char* kDeath = "not a live allocation";
  EXPECT_DEBUG_DEATH(a.Free(x->offset, x->size), kDeath);
  EXPECT_DEBUG_DEATH(a.Free(x->offset, 1), kDeath) << "starts at a free block's start";
  EXPECT_DEBUG_DEATH(a.Free(kAlign, x->size - kAlign), kDeath) << "ends at its end";
  EXPECT_DEBUG_DEATH(a.Free(z->offset + z->size, 4 * kKiB), kDeath) << "the segment's tail";
  EXPECT_DEBUG_DEATH(a.Free(y->offset + 1, 64), kDeath) << "misaligned";
  EXPECT_DEBUG_DEATH(a.Free(y->offset, 0), kDeath) << "empty";
  EXPECT_DEBUG_DEATH(a.Free(1 * kMiB - kAlign, 2 * kAlign), kDeath) << "past the segment";
  EXPECT_DEBUG_DEATH(a.Free(0, std::numeric_limits<uint64_t>::max()), kDeath);
  EXPECT_DEBUG_DEATH(a.Free(y->offset, 64 * kKiB), kDeath) << "more than is allocated";
  OffsetAllocator::Stats after = a.GetStats();
  EXPECT_EQ(after.used_bytes, before.used_bytes);
  EXPECT_EQ(after.free_block_count, before.free_block_count);
  EXPECT_EQ(after.allocation_count, before.allocation_count);
  EXPECT_EQ(after.largest_free_block, before.largest_free_block);

  a.Free(y->offset, y->size);  // merges with x's block: [0, 8 KiB) free
  EXPECT_DEBUG_DEATH(a.Free(y->offset, y->size), kDeath) << "ends at the merged block's end";
  a.Free(z->offset, z->size);  // everything is one free block
  EXPECT_DEBUG_DEATH(a.Free(z->offset, z->size), kDeath) << "no allocation is left";
  after = a.GetStats();
  EXPECT_EQ(after.used_bytes, 0u);
  EXPECT_EQ(after.free_block_count, 1u);
  EXPECT_EQ(after.allocation_count, 0u);
  EXPECT_TRUE(a.Allocate(1 * kMiB).has_value());
}

// The double free O(1) cannot see: x, z and then y freed merge into one free block, so a second
// free of y touches neither of its edges. Unchecked, the allocator takes it (and would then hand
// out space twice); checked, as the tests and the processes they start run, it is refused.
TEST(OffsetAllocatorTest, CheckedFreesRefuseADoubleFreeInsideAMergedBlock) {
  for (bool checked : {false, true}) {
    OffsetAllocator a(1 * kMiB, checked);
    EXPECT_EQ(a.checked(), checked);
    auto x = a.Allocate(4 * kKiB);
    auto y = a.Allocate(4 * kKiB);
    auto z = a.Allocate(4 * kKiB);
    auto w = a.Allocate(4 * kKiB);
    ASSERT_TRUE(x && y && z && w);
    ASSERT_TRUE(a.Free(x->offset, x->size));
    ASSERT_TRUE(a.Free(z->offset, z->size));
    ASSERT_TRUE(a.Free(y->offset, y->size));  // [0, 12 KiB) is one free block
    if (!checked) {
      EXPECT_TRUE(a.Free(y->offset, y->size)) << "what O(1) cannot tell (see Free)";
      continue;
    }
    EXPECT_DEBUG_DEATH(EXPECT_FALSE(a.Free(y->offset, y->size)), "not a live allocation");
    EXPECT_DEBUG_DEATH(EXPECT_FALSE(a.Free(y->offset + kAlign, kAlign)), "not a live allocation");
    EXPECT_DEBUG_DEATH(EXPECT_FALSE(a.Free(z->offset, z->size + kAlign)), "not a live allocation")
        << "overlaps the free block and w";
    EXPECT_FALSE(a.Shrink(y->offset, y->size, kAlign));
    const OffsetAllocator::Stats s = a.GetStats();
    EXPECT_EQ(s.used_bytes, 4 * kKiB) << "w alone";
    EXPECT_EQ(s.allocation_count, 1u);
    EXPECT_EQ(s.free_block_count, 2u);
    // A decoded copy keeps checking.
    Encoder out;
    a.Encode(out);
    const std::string bytes = out.Take();
    OffsetAllocator copy(0, true);
    Decoder in(bytes);
    ASSERT_TRUE(copy.Decode(in));
    EXPECT_TRUE(copy.checked());
    EXPECT_DEBUG_DEATH(EXPECT_FALSE(copy.Free(y->offset, y->size)), "not a live allocation");
    EXPECT_TRUE(copy.Free(w->offset, w->size));
    EXPECT_EQ(copy.GetStats().free_block_count, 1u);
  }
}

// The allocator's memory follows its free blocks, not its allocations: 100,000 allocations
// packed end to end need one node (the segment's free tail); freeing every other one makes a
// node per hole, and refilling the holes gives the nodes back for reuse.
TEST(OffsetAllocatorTest, LiveAllocationsCostNoNode) {
  OffsetAllocator a(1 * kGiB);
  std::vector<OffsetAllocator::Allocation> live;
  for (int i = 0; i < 100000; ++i) {
    auto r = a.Allocate(4 * kKiB);
    ASSERT_TRUE(r.has_value());
    live.push_back(*r);
  }
  EXPECT_EQ(a.GetStats().allocation_count, 100000u);
  EXPECT_LE(a.node_count(), 1u);
  for (size_t i = 0; i < live.size(); i += 2) a.Free(live[i].offset, live[i].size);
  EXPECT_EQ(a.GetStats().free_block_count, 50001u);
  EXPECT_EQ(a.node_count(), 50001u);
  for (int i = 0; i < 50000; ++i) ASSERT_TRUE(a.Allocate(4 * kKiB).has_value());
  EXPECT_EQ(a.GetStats().free_block_count, 1u);
  EXPECT_EQ(a.node_count(), 50001u) << "the table keeps its slots for reuse";
  for (size_t i = 0; i < live.size(); i += 2) a.Free(live[i].offset, live[i].size);
  EXPECT_EQ(a.node_count(), 50001u) << "the holes took the freed slots, no new ones";
}

// 200k random operations against the shadow: no overlap, nothing outside the segment, exact
// stats, node slots reused, and a failure only when no block is big enough (or every block that
// is lies in the request's own size class, within 1/8 of it).
TEST(OffsetAllocatorTest, RandomChurnNeverOverlapsAndStatsAreExact) {
  OffsetAllocator a(256 * kMiB + 4 * kKiB);
  Shadow shadow(a.capacity());
  std::mt19937_64 rng(20240601);
  std::vector<OffsetAllocator::Allocation> live;
  uint64_t peak_free_blocks = 0;
  uint64_t failures = 0;
  for (int op = 0; op < 200000; ++op) {
    // Alternate phases that fill the segment and phases that drain it.
    const double alloc_share = (op / 10000) % 2 == 0 ? 0.7 : 0.35;
    if (live.empty() || std::uniform_real_distribution<double>(0, 1)(rng) < alloc_share) {
      const uint64_t size = Uniform(rng, 0, 3) == 0 ? Uniform(rng, 1, 64 * kKiB)
                                                    : Uniform(rng, 64 * kKiB, 4 * kMiB);
      auto r = a.Allocate(size);
      if (r) {
        ASSERT_TRUE(shadow.Add(*r, size)) << "op " << op;
        live.push_back(*r);
      } else {
        ++failures;
        for (uint64_t gap : shadow.Gaps()) {
          ASSERT_LT(gap, RoundUp(size) / 8 * 9 + kAlign)
              << "op " << op << ": " << size << " failed with a free block of " << gap;
        }
      }
    } else {
      const size_t i = Uniform(rng, 0, live.size() - 1);
      a.Free(live[i].offset, live[i].size);
      shadow.Remove(live[i].offset);
      live[i] = live.back();
      live.pop_back();
    }
    peak_free_blocks = std::max(peak_free_blocks, a.GetStats().free_block_count);
    ASSERT_EQ(a.GetStats().used_bytes, shadow.used()) << "op " << op;
    ASSERT_EQ(a.GetStats().allocation_count, live.size()) << "op " << op;
    if (op % 1000 == 0) {
      ASSERT_TRUE(shadow.Matches(a)) << "op " << op;
    }
  }
  EXPECT_TRUE(shadow.Matches(a));
  EXPECT_GT(failures, 1000u);  // the segment really was full many times
  // Nodes are free blocks only, and their slots are recycled: never more than the peak of them.
  EXPECT_LE(a.node_count(), peak_free_blocks);
}

// Shrink: same offset, the tail free at once and usable, merged with a free right
// neighbour (no two free blocks ever adjacent), and refusals that change nothing.
TEST(OffsetAllocatorTest, ShrinkGivesBackTheTailAtOnce) {
  OffsetAllocator a(256 * kKiB);
  auto b0 = a.Allocate(64 * kKiB);
  auto b1 = a.Allocate(64 * kKiB);
  ASSERT_TRUE(b0 && b1);
  // Used right neighbour: the tail becomes a free block of its own.
  ASSERT_TRUE(a.Shrink(b0->offset, b0->size, 40 * kKiB + 1));
  OffsetAllocator::Stats s = a.GetStats();
  EXPECT_EQ(s.used_bytes, RoundUp(40 * kKiB + 1) + 64 * kKiB);
  EXPECT_EQ(s.free_block_count, 2u);  // the tail, and the segment's end
  auto in_tail = a.Allocate(24 * kKiB - kAlign);
  ASSERT_TRUE(in_tail);
  EXPECT_EQ(in_tail->offset, b0->offset + RoundUp(40 * kKiB + 1)) << "the tail is what was freed";
  // Free right neighbour: it grows over the tail, one free block.
  a.Free(in_tail->offset, in_tail->size);
  a.Free(b1->offset, b1->size);
  EXPECT_EQ(a.GetStats().free_block_count, 1u);
  ASSERT_TRUE(a.Shrink(b0->offset, 40 * kKiB + 1, 8 * kKiB)) << "named by its size now";
  s = a.GetStats();
  EXPECT_EQ(s.free_block_count, 1u);
  EXPECT_EQ(s.used_bytes, 8 * kKiB);
  EXPECT_EQ(s.largest_free_block, 248 * kKiB);
  // Freeing the shrunk allocation frees what it holds now: the whole segment is one block.
  EXPECT_DEBUG_DEATH(a.Free(b0->offset, b0->size), "not a live allocation")
      << "its size before the shrink: more than is allocated";
  a.Free(b0->offset, 8 * kKiB);
  EXPECT_EQ(a.GetStats().free_block_count, 1u);
  EXPECT_TRUE(a.Allocate(256 * kKiB).has_value());
}

TEST(OffsetAllocatorTest, ShrinkRefusesWhatItCannotDoAndChangesNothing) {
  OffsetAllocator a(1 * kMiB);
  auto b = a.Allocate(64 * kKiB);
  ASSERT_TRUE(b);
  const OffsetAllocator::Stats before = a.GetStats();
  const uint64_t at = b->offset, size = b->size;
  EXPECT_FALSE(a.Shrink(at, size, 0));
  EXPECT_FALSE(a.Shrink(at, size, 64 * kKiB + 1)) << "larger than the allocation";
  EXPECT_FALSE(a.Shrink(at, size, std::numeric_limits<uint64_t>::max()));
  EXPECT_FALSE(a.Shrink(at + size, 4 * kKiB, kAlign)) << "not a live allocation (a free block)";
  EXPECT_FALSE(a.Shrink(at, 2 * kMiB, 4 * kKiB)) << "past the segment";
  EXPECT_FALSE(a.Shrink(at + 1, size, 4 * kKiB)) << "misaligned";
  EXPECT_TRUE(a.Shrink(at, size, 64 * kKiB - kAlign + 1)) << "within the last unit: a no-op";
  const OffsetAllocator::Stats after = a.GetStats();
  EXPECT_EQ(after.used_bytes, before.used_bytes);
  EXPECT_EQ(after.free_block_count, before.free_block_count);
  a.Free(at, size);
  EXPECT_FALSE(a.Shrink(at, size, 4 * kKiB)) << "freed";
  EXPECT_EQ(a.GetStats().used_bytes, 0u);
}

// Churn with shrinks of live allocations mixed in, against the shadow.
TEST(OffsetAllocatorTest, RandomChurnWithShrinksNeverOverlapsAndStatsAreExact) {
  OffsetAllocator a(64 * kMiB);
  Shadow shadow(a.capacity());
  std::mt19937_64 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> live;  // offset, current size
  for (int op = 0; op < 100000; ++op) {
    const uint64_t pick = Uniform(rng, 0, 9);
    if (live.empty() || pick < 5) {
      const uint64_t size = Uniform(rng, 1, 512 * kKiB);
      if (auto r = a.Allocate(size)) {
        ASSERT_TRUE(shadow.Add(*r, size)) << "op " << op;
        live.emplace_back(r->offset, size);
      }
    } else if (pick < 7) {
      auto& [offset, size] = live[Uniform(rng, 0, live.size() - 1)];
      const uint64_t smaller = Uniform(rng, 1, size);
      ASSERT_TRUE(a.Shrink(offset, size, smaller)) << "op " << op;
      shadow.Shrink(offset, smaller);
      size = smaller;
    } else {
      const size_t i = Uniform(rng, 0, live.size() - 1);
      a.Free(live[i].first, live[i].second);
      shadow.Remove(live[i].first);
      live[i] = live.back();
      live.pop_back();
    }
    ASSERT_EQ(a.GetStats().used_bytes, shadow.used()) << "op " << op;
    if (op % 500 == 0) {
      ASSERT_TRUE(shadow.Matches(a)) << "op " << op;
    }
  }
  EXPECT_TRUE(shadow.Matches(a));
}

struct Mix {
  const char* name;
  uint64_t capacity, lo, hi;
  bool log_uniform;  // sizes spread evenly over log(size): many small objects, few large ones
};

const Mix kMixes[] = {
    {"4KiB_4MiB_uniform_in_1GiB", 1 * kGiB, 4 * kKiB, 4 * kMiB, false},
    {"64KiB_64MiB_uniform_in_16GiB", 16 * kGiB, 64 * kKiB, 64 * kMiB, false},
    {"64KiB_64MiB_loguniform_in_16GiB", 16 * kGiB, 64 * kKiB, 64 * kMiB, true},
    // One 64 MiB request is 6% of this segment, so no allocator can promise 95% here.
    {"64KiB_64MiB_uniform_in_1GiB", 1 * kGiB, 64 * kKiB, 64 * kMiB, false},
};

uint64_t Draw(std::mt19937_64& rng, const Mix& m) {
  if (!m.log_uniform) return Uniform(rng, m.lo, m.hi);
  const double e = std::uniform_real_distribution<double>(std::log2(m.lo), std::log2(m.hi))(rng);
  return std::clamp(static_cast<uint64_t>(std::exp2(e)), m.lo, m.hi);
}

struct FillResult {
  uint64_t requested = 0;  // bytes asked for by the successful requests
  uint64_t failed_request = 0;
};

FillResult FillUntilFirstFailure(OffsetAllocator& a, std::mt19937_64& rng, const Mix& m,
                                 std::vector<std::pair<uint64_t, uint64_t>>* live) {
  FillResult f;
  for (;;) {
    const uint64_t size = Draw(rng, m);
    auto r = a.Allocate(size);
    if (!r) {
      f.failed_request = size;
      return f;
    }
    f.requested += size;
    live->emplace_back(r->offset, size);
  }
}

// Utilisation counts requested bytes, so the alignment round-up counts as waste.
TEST(OffsetAllocatorTest, FreshSegmentFillsToAtLeast95Percent) {
  for (size_t mix = 0; mix < std::size(kMixes); ++mix) {
    const Mix& m = kMixes[mix];
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      OffsetAllocator a(m.capacity);
      std::mt19937_64 rng(mix * 100 + seed);
      std::vector<std::pair<uint64_t, uint64_t>> live;
      const FillResult f = FillUntilFirstFailure(a, rng, m, &live);
      const double utilisation = static_cast<double>(f.requested) / m.capacity;
      // The exact property: the first failure comes only when what is left is too small.
      EXPECT_LT(a.GetStats().free_bytes, RoundUp(f.failed_request)) << m.name << " seed " << seed;
      if (m.capacity / m.hi >= 256) {
        EXPECT_GE(utilisation, 0.95) << m.name << " seed " << seed;
      }
      std::cout << "fresh fill " << m.name << " seed " << seed << ": " << utilisation * 100
                << "% in use at the first failure\n";
      RecordProperty(std::string("fresh_util_") + m.name + "_seed" + std::to_string(seed),
                     std::to_string(utilisation));
    }
  }
}

// Steady state: free a random half, refill until the first failure, 20 times. Measured with
// these seeds (min / mean): 4KiB_4MiB_uniform_in_1GiB 97.0 / 97.7%; 64KiB_64MiB_uniform_in_16GiB
// 96.6 / 97.6%; loguniform 98.0 / 99.2%. An exact best fit (std::map, O(log n)) reached about
// 98.2% mean on the uniform mixes, plain segregated fit (own class tried last) about 1% less than
// ours. The bounds leave room for other seeds yet catch a broken policy. In 1 GiB the 64 MiB mix
// holds ~30 objects, so holes are coarse for any allocator (best fit too: mean ~90%, single
// rounds down to 67%): only its mean is bounded.
TEST(OffsetAllocatorTest, SteadyStateUtilisationAfterChurn) {
  const double kMinBound[] = {0.93, 0.93, 0.93, 0.0};
  const double kMeanBound[] = {0.96, 0.96, 0.96, 0.80};
  constexpr int kRounds = 20;
  for (size_t mix = 0; mix < std::size(kMixes); ++mix) {
    const Mix& m = kMixes[mix];
    OffsetAllocator a(m.capacity);
    std::mt19937_64 rng(99 + mix);
    std::vector<std::pair<uint64_t, uint64_t>> live;
    FillUntilFirstFailure(a, rng, m, &live);
    double min_util = 1.0, sum = 0.0;
    for (int round = 0; round < kRounds; ++round) {
      std::shuffle(live.begin(), live.end(), rng);
      const size_t keep = live.size() / 2;
      for (size_t i = keep; i < live.size(); ++i) a.Free(live[i].first, live[i].second);
      live.resize(keep);
      FillUntilFirstFailure(a, rng, m, &live);
      uint64_t requested = 0;
      for (const auto& [offset, size] : live) requested += size;
      const double utilisation = static_cast<double>(requested) / m.capacity;
      min_util = std::min(min_util, utilisation);
      sum += utilisation;
    }
    const double mean = sum / kRounds;
    std::cout << "after churn " << m.name << ": min " << min_util * 100 << "% mean "
              << mean * 100 << "% over " << kRounds << " refills\n";
    RecordProperty(std::string("churn_util_min_") + m.name, std::to_string(min_util));
    RecordProperty(std::string("churn_util_mean_") + m.name, std::to_string(mean));
    EXPECT_GE(min_util, kMinBound[mix]) << m.name;
    EXPECT_GE(mean, kMeanBound[mix]) << m.name;
  }
}

// The cost of a call, counted in free-list nodes examined, is the same at 1k and 100k live blocks
// and at most 2: Allocate looks at one bin head and maybe one more, Free at its two neighbours.
TEST(OffsetAllocatorTest, CostPerCallDoesNotGrowWithLiveBlocks) {
  double ns_per_op[2] = {0, 0};
  uint64_t probes[2] = {0, 0};
  const size_t kLive[2] = {1000, 100000};
  constexpr int kOps = 20000;
  for (int k = 0; k < 2; ++k) {
    OffsetAllocator a(1 * kTiB);
    std::mt19937_64 rng(5);
    std::vector<OffsetAllocator::Allocation> live;
    for (size_t i = 0; i < 2 * kLive[k]; ++i) {
      auto r = a.Allocate(Uniform(rng, 4 * kKiB, 4 * kMiB));
      ASSERT_TRUE(r.has_value());
      live.push_back(*r);
    }
    // Free every other block: many free blocks, long lists in every bin.
    for (size_t i = 0; i < live.size(); i += 2) a.Free(live[i].offset, live[i].size);
    std::vector<OffsetAllocator::Allocation> kept;
    for (size_t i = 1; i < live.size(); i += 2) kept.push_back(live[i]);
    live.swap(kept);
    ASSERT_GE(a.GetStats().free_block_count, kLive[k]);

    uint64_t max_probes = 0;
    const uint64_t start_probes = a.probe_count();
    const auto start = std::chrono::steady_clock::now();
    for (int op = 0; op < kOps; ++op) {
      const uint64_t before = a.probe_count();
      if (op % 2 == 0) {
        auto r = a.Allocate(Uniform(rng, 4 * kKiB, 4 * kMiB));
        if (r) live.push_back(*r);
      } else {
        const size_t i = Uniform(rng, 0, live.size() - 1);
        a.Free(live[i].offset, live[i].size);
        live[i] = live.back();
        live.pop_back();
      }
      max_probes = std::max(max_probes, a.probe_count() - before);
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    ns_per_op[k] = std::chrono::duration<double, std::nano>(elapsed).count() / kOps;
    probes[k] = a.probe_count() - start_probes;
    EXPECT_LE(max_probes, 2u) << kLive[k] << " live";
  }
  // Same work per call at both sizes (to within the random mix of hits and merges).
  const double ratio = static_cast<double>(probes[1]) / static_cast<double>(probes[0]);
  EXPECT_GT(ratio, 0.8);
  EXPECT_LT(ratio, 1.25);
  // Wall time is only reported: the machine is shared, and cache misses grow with the table.
  std::cout << "ns per op: " << ns_per_op[0] << " at 1k live, " << ns_per_op[1]
            << " at 100k live; probes " << probes[0] << " vs " << probes[1] << "\n";
  RecordProperty("ns_per_op_1k", std::to_string(ns_per_op[0]));
  RecordProperty("ns_per_op_100k", std::to_string(ns_per_op[1]));
}

TEST(OffsetAllocatorTest, FragmentationOfCheckerboard) {
  constexpr uint64_t kBlock = 64 * kKiB;
  constexpr int kBlocks = 64;
  OffsetAllocator a(kBlocks * kBlock);
  std::vector<OffsetAllocator::Allocation> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    auto r = a.Allocate(kBlock);
    ASSERT_TRUE(r.has_value());
    blocks.push_back(*r);
  }
  EXPECT_EQ(a.GetStats().fragmentation(), 0.0);  // nothing free
  for (int i = 0; i < kBlocks; i += 2) a.Free(blocks[i].offset, blocks[i].size);

  OffsetAllocator::Stats s = a.GetStats();
  EXPECT_EQ(s.free_bytes, kBlocks / 2 * kBlock);
  EXPECT_EQ(s.free_block_count, static_cast<uint64_t>(kBlocks / 2));
  EXPECT_EQ(s.largest_free_block, kBlock);
  EXPECT_DOUBLE_EQ(s.fragmentation(), 1.0 - 1.0 / (kBlocks / 2));
  EXPECT_FALSE(a.Allocate(kBlock + 1).has_value());  // half the segment free, no room for it

  a.Free(blocks[1].offset, blocks[1].size);  // joins blocks 0, 1, 2
  s = a.GetStats();
  EXPECT_EQ(s.free_block_count, static_cast<uint64_t>(kBlocks / 2 - 1));
  EXPECT_EQ(s.largest_free_block, 3 * kBlock);
  EXPECT_DOUBLE_EQ(s.fragmentation(), 1.0 - 3.0 / (kBlocks / 2 + 1));
  EXPECT_TRUE(a.Allocate(3 * kBlock).has_value());
}

TEST(OffsetAllocatorTest, FragmentationFormula) {
  OffsetAllocator::Stats s;
  EXPECT_EQ(s.fragmentation(), 0.0);  // nothing free
  s.free_bytes = 1000;
  s.largest_free_block = 1000;
  EXPECT_EQ(s.fragmentation(), 0.0);
  s.largest_free_block = 250;
  EXPECT_DOUBLE_EQ(s.fragmentation(), 0.75);
}

}  // namespace
}  // namespace granary::master
