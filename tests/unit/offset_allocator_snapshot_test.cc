// OffsetAllocator's snapshot: Encode keeps its bytes (a node no longer stores its block's size,
// the snapshot still does), a decoded allocator goes on exactly as the one encoded, and Decode
// refuses what no allocator could have encoded (an offset past the node's field, blocks that do
// not tile the segment) and leaves the target as it was.
#include <xxhash.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "master/codec/binary_codec.h"
#include "master/space/offset_allocator.h"

namespace granary::master {
namespace {

constexpr uint64_t kAlign = OffsetAllocator::kAlignment;

// A node keeps its state in the offset's top two bits (24 bytes a node, one per object in the
// master): an encoded allocator whose node claims an offset that does not fit is refused, not
// silently truncated into another block's place.
TEST(OffsetAllocatorTest, DecodeRefusesAnOffsetPastTheNodesField) {
  OffsetAllocator fresh(1 << 20);
  Encoder genuine;
  fresh.Encode(genuine);
  const std::string bytes = genuine.Take();

  // A fresh allocator has one node: the whole segment, free, alone in its list and by address.
  auto node_tail = [](uint64_t offset) {
    Encoder e;
    uint64_t count = 1, size = (1 << 20) / kAlign;
    uint32_t none = 0xFFFFFFFFu;
    uint8_t state = 1;  // free
    e(count); e(offset); e(size); e(none); e(none); e(none); e(none); e(state);
    return e.Take();
  };
  const std::string tail = node_tail(0);
  ASSERT_TRUE(bytes.ends_with(tail)) << "the encoding's layout changed: update this test";
  const std::string prefix = bytes.substr(0, bytes.size() - tail.size());

  OffsetAllocator decoded(0);
  Decoder same(bytes);
  ASSERT_TRUE(decoded.Decode(same));
  EXPECT_EQ(decoded.GetStats().largest_free_block, uint64_t{1} << 20);

  for (uint64_t offset : {uint64_t{1} << 62, ~uint64_t{0}}) {
    const std::string hostile = prefix + node_tail(offset);
    OffsetAllocator target(4096);
    Decoder in(hostile);
    EXPECT_FALSE(target.Decode(in)) << offset;
    EXPECT_EQ(target.capacity(), 4096u) << "a refused decode leaves the allocator as it was";
  }
}

// A fixed churn from `seed`: allocations of many sizes, frees in a scrambled order, shrinks.
// Returns each call's result, in order, so two allocators can be compared call by call.
std::vector<uint64_t> Churn(OffsetAllocator& a, uint64_t seed, int steps) {
  std::vector<uint64_t> results;
  std::vector<uint32_t> live;
  uint64_t x = seed;
  auto next = [&x] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x >> 33;
  };
  for (int step = 0; step < steps; ++step) {
    const uint64_t r = next();
    if (r % 5 < 3 || live.empty()) {
      auto got = a.Allocate(1 + next() % 70000);
      results.push_back(got ? got->offset : ~uint64_t{0});
      if (got) live.push_back(got->handle);
    } else if (r % 5 == 3) {
      const size_t i = next() % live.size();
      a.Free(live[i]);
      live[i] = live.back();
      live.pop_back();
    } else {
      results.push_back(a.Shrink(live[next() % live.size()], 1 + next() % 4000));
    }
  }
  return results;
}

std::string Encoded(const OffsetAllocator& a) {
  Encoder out;
  a.Encode(out);
  return out.Take();
}

// A block's size is derived from its right neighbour (24 bytes a node, not 32): the snapshot
// still carries each size, byte for byte as before, and a decoded allocator goes on exactly as
// the one encoded.
TEST(OffsetAllocatorTest, TheSnapshotKeepsItsBytesAndADecodeGoesOnAsTheOriginal) {
  OffsetAllocator original(8u << 20);
  Churn(original, 12345, 3000);
  const std::string bytes = Encoded(original);
  // What a build of 0271029 (sizes kept in the nodes) encoded after the same churn.
  EXPECT_EQ(bytes.size(), 16967u);
  EXPECT_EQ(XXH3_64bits(bytes.data(), bytes.size()), 0x91f4461999e33fadull);

  OffsetAllocator decoded(0);
  Decoder in(bytes);
  ASSERT_TRUE(decoded.Decode(in));
  EXPECT_EQ(Encoded(decoded), bytes);
  EXPECT_EQ(Churn(decoded, 777, 3000), Churn(original, 777, 3000));
  EXPECT_EQ(Encoded(decoded), Encoded(original));
  const auto stats = decoded.GetStats();
  EXPECT_EQ(stats.used_bytes, original.GetStats().used_bytes);
  EXPECT_EQ(stats.largest_free_block, original.GetStats().largest_free_block);
  uint64_t free_bytes = 0;
  for (const auto& b : decoded.FreeBlocks()) free_bytes += b.size;
  EXPECT_EQ(free_bytes, stats.free_bytes) << "the free blocks' derived sizes add up";
}

TEST(OffsetAllocatorTest, DecodeRefusesBlocksThatDoNotTileTheSegment) {
  OffsetAllocator two(1 << 20);
  ASSERT_TRUE(two.Allocate(4096).has_value());  // [used 4 KiB][free the rest]
  Encoder genuine;
  two.Encode(genuine);
  const std::string bytes = genuine.Take();
  // The two nodes at the end: the used one (size 64 units), then the free one.
  auto node = [](uint64_t offset, uint64_t size, uint32_t pp, uint32_t pn, uint8_t state) {
    Encoder e;
    uint32_t none = 0xFFFFFFFFu;
    e(offset); e(size); e(none); e(none); e(pp); e(pn); e(state);
    return e.Take();
  };
  const uint64_t units = (1 << 20) / kAlign;
  const std::string tail = node(0, 64, 0xFFFFFFFFu, 1, 2) + node(64, units - 64, 0, 0xFFFFFFFFu, 1);
  ASSERT_TRUE(bytes.ends_with(tail)) << "the encoding's layout changed: update this test";
  const std::string prefix = bytes.substr(0, bytes.size() - tail.size());
  // The same total, split otherwise: each node's size disagrees with where its neighbour starts.
  const std::string hostile =
      prefix + node(0, 128, 0xFFFFFFFFu, 1, 2) + node(64, units - 128, 0, 0xFFFFFFFFu, 1);
  // Sizes that agree with the offsets, but blocks that do not tile: two blocks over the same
  // half, both ending at the segment's end (neither names the other); a block of no units; a
  // chain whose neighbours disagree.
  const std::string overlapping = prefix + node(units / 2, units / 2, 0xFFFFFFFFu, 0xFFFFFFFFu, 1) +
                                  node(units / 2, units / 2, 0xFFFFFFFFu, 0xFFFFFFFFu, 1);
  const std::string empty_block =
      prefix + node(0, 0, 0xFFFFFFFFu, 1, 2) + node(0, units, 0, 0xFFFFFFFFu, 1);
  const std::string disagreeing =
      prefix + node(0, 64, 0xFFFFFFFFu, 1, 2) + node(64, units - 64, 1, 0xFFFFFFFFu, 1);
  const std::vector<std::string> refused = {hostile, overlapping, empty_block, disagreeing};
  for (size_t i = 0; i < refused.size(); ++i) {
    OffsetAllocator target(4096);
    Decoder in(refused[i]);
    EXPECT_FALSE(target.Decode(in)) << i;
    EXPECT_EQ(target.capacity(), 4096u) << "a refused decode leaves the allocator as it was";
  }
}

}  // namespace
}  // namespace granary::master
