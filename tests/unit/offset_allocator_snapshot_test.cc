// OffsetAllocator's snapshot: a decoded allocator goes on exactly as the one encoded, and Decode
// refuses what no allocator could have encoded (nodes past the segment, free blocks that overlap,
// touch, sit in the wrong size class's list or in none, lists that disagree with themselves,
// counters that disagree with the blocks) and leaves the target as it was.
#include <xxhash.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "master/codec/binary_codec.h"
#include "master/space/offset_allocator.h"

namespace granary::master {
namespace {

constexpr uint64_t kAlign = OffsetAllocator::kAlignment;
constexpr uint32_t kNone = 0xFFFFFFFFu;

// A fixed churn from `seed`: allocations of many sizes, frees in a scrambled order, shrinks.
// Returns each call's result, in order, so two allocators can be compared call by call.
std::vector<uint64_t> Churn(OffsetAllocator& a, uint64_t seed, int steps) {
  std::vector<uint64_t> results;
  std::vector<std::pair<uint64_t, uint64_t>> live;  // offset, size
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
      if (got) live.emplace_back(got->offset, got->size);
    } else if (r % 5 == 3) {
      const size_t i = next() % live.size();
      a.Free(live[i].first, live[i].second);
      live[i] = live.back();
      live.pop_back();
    } else {
      auto& [offset, size] = live[next() % live.size()];
      const uint64_t smaller = 1 + next() % 4000;
      const bool shrunk = a.Shrink(offset, size, smaller);
      if (shrunk && smaller < size) size = smaller;
      results.push_back(shrunk);
    }
  }
  return results;
}

std::string Encoded(const OffsetAllocator& a) {
  Encoder out;
  a.Encode(out);
  return out.Take();
}

// A decoded allocator goes on exactly as the one encoded, and encodes to the same bytes.
TEST(OffsetAllocatorTest, ADecodeGoesOnAsTheOriginal) {
  OffsetAllocator original(8u << 20);
  Churn(original, 12345, 3000);
  const std::string bytes = Encoded(original);
  // Format 9 (allocations without nodes) after this churn, as this build wrote it: a change of
  // the encoding or of the allocator's choices shows here.
  EXPECT_EQ(bytes.size(), 4601u);
  EXPECT_EQ(XXH3_64bits(bytes.data(), bytes.size()), 0x50457112681c1206ull);

  OffsetAllocator decoded(0);
  Decoder in(bytes);
  ASSERT_TRUE(decoded.Decode(in));
  EXPECT_EQ(Encoded(decoded), bytes);
  EXPECT_EQ(Churn(decoded, 777, 3000), Churn(original, 777, 3000));
  EXPECT_EQ(Encoded(decoded), Encoded(original));
  const auto stats = decoded.GetStats();
  EXPECT_EQ(stats.used_bytes, original.GetStats().used_bytes);
  EXPECT_EQ(stats.largest_free_block, original.GetStats().largest_free_block);
  EXPECT_EQ(stats.free_block_count, original.GetStats().free_block_count);
  uint64_t free_bytes = 0;
  for (const auto& b : decoded.FreeBlocks()) free_bytes += b.size;
  EXPECT_EQ(free_bytes, stats.free_bytes);
}

// The encoding's layout, as the hostile cases below forge it.
struct Forged {
  uint64_t capacity = 0, group_mask = 0, used = 0, free_blocks = 0, allocations = 0;
  uint32_t unused_head = kNone;
  std::vector<std::pair<uint32_t, uint32_t>> heads;  // bin, node
  struct Node {
    uint64_t offset, size;
    uint32_t prev, next;
  };
  std::vector<Node> nodes;

  std::string Bytes() const {
    uint8_t bin_mask[64] = {};
    uint32_t bin_head[512];
    std::fill(std::begin(bin_head), std::end(bin_head), kNone);
    uint64_t groups = group_mask;
    for (auto [bin, node] : heads) {
      bin_head[bin] = node;
      bin_mask[bin / 8] |= static_cast<uint8_t>(1u << (bin % 8));
      if (group_mask == 0) groups |= uint64_t{1} << (bin / 8);
    }
    Encoder e;
    uint64_t c = capacity, g = groups, u = used, f = free_blocks, a = allocations;
    uint32_t uh = unused_head;
    e(c); e(g); e(u); e(f); e(a); e(uh);
    for (uint8_t m : bin_mask) e(m);
    for (uint32_t h : bin_head) e(h);
    uint64_t count = nodes.size();
    e(count);
    for (Node n : nodes) {
      e(n.offset); e(n.size); e(n.prev); e(n.next);
    }
    return e.Take();
  }
};

// The bin of a block of `units` (offset_allocator.cc's FloorBin), for forging lists.
uint32_t BinOf(uint64_t units) {
  const uint32_t top = 63 - __builtin_clzll(units);
  const uint32_t shift = top > 3 ? top - 3 : 0;
  return (shift << 3) + static_cast<uint32_t>(units >> shift);
}

TEST(OffsetAllocatorTest, DecodeRefusesWhatNoAllocatorEncodes) {
  constexpr uint64_t kUnits = (1 << 20) / kAlign;  // 16384
  // [used 64 units][free 64][used 64][free, the rest]: the genuine bytes, forged the same way.
  OffsetAllocator real(1 << 20);
  auto a = real.Allocate(64 * kAlign);
  auto b = real.Allocate(64 * kAlign);
  auto c = real.Allocate(64 * kAlign);
  ASSERT_TRUE(a && b && c);
  real.Free(b->offset, b->size);
  Forged good;
  good.capacity = 1 << 20;
  good.used = 128;
  good.free_blocks = 2;
  good.allocations = 2;
  good.nodes = {{192, kUnits - 192, kNone, kNone}, {64, 64, kNone, kNone}};
  good.heads = {{BinOf(kUnits - 192), 0}, {BinOf(64), 1}};
  ASSERT_EQ(good.Bytes(), Encoded(real)) << "the encoding's layout changed: update Forged";
  {
    OffsetAllocator decoded(0);
    const std::string bytes = good.Bytes();  // the decoder reads it in place
    Decoder in(bytes);
    ASSERT_TRUE(decoded.Decode(in));
    EXPECT_EQ(decoded.GetStats().free_block_count, 2u);
  }

  std::vector<std::pair<const char*, Forged>> refused;
  auto with = [&](const char* why, auto change) {
    Forged f = good;
    change(f);
    refused.emplace_back(why, f);
  };
  with("a block past the segment", [](Forged& f) { f.nodes[0].size += 1; f.used -= 1; });
  with("an offset past any segment", [](Forged& f) { f.nodes[1].offset = ~uint64_t{0}; });
  with("blocks that overlap", [](Forged& f) { f.nodes[1].offset = 180; f.nodes[1].size = 64; });
  with("blocks that touch (not merged)", [](Forged& f) {
    f.nodes[1].offset = 128;
    f.used = 128;
  });
  with("a block in another class's list", [](Forged& f) {
    f.heads = {{BinOf(kUnits - 192), 0}, {BinOf(64) + 1, 1}};
  });
  with("a free block in no list", [](Forged& f) { f.heads = {{BinOf(kUnits - 192), 0}}; });
  // Two free blocks of one class share a list: 0 -> 1, and 1 must name 0 before it.
  Forged one_list = good;
  one_list.used = kUnits - 128;
  one_list.nodes = {{0, 64, kNone, 1}, {128, 64, 0, kNone}};
  one_list.heads = {{BinOf(64), 0}};
  {
    OffsetAllocator decoded(0);
    const std::string bytes = one_list.Bytes();
    Decoder in(bytes);
    ASSERT_TRUE(decoded.Decode(in)) << "two blocks in one list, linked both ways";
    EXPECT_EQ(decoded.Allocate(64 * kAlign)->offset, 0u) << "the list's head goes first";
  }
  {
    Forged f = one_list;
    f.nodes[1].prev = kNone;
    refused.emplace_back("a list with a wrong back link", f);
  }
  with("a list that loops", [](Forged& f) { f.nodes[1].next = 1; });
  with("a block of no units in a list", [](Forged& f) { f.nodes[1].size = 0; });
  with("free bytes that disagree with the used count", [](Forged& f) { f.used = 64; });
  with("more allocations than units", [](Forged& f) { f.allocations = 129; });
  with("a free block counted wrong", [](Forged& f) { f.free_blocks = 3; });
  with("an unused slot that is a free block", [](Forged& f) { f.unused_head = 1; });
  with("a node in neither a list nor the unused chain", [](Forged& f) {
    f.nodes.push_back({0, 0, kNone, kNone});
  });
  with("a group bit without its bins", [](Forged& f) { f.group_mask = ~uint64_t{0}; });
  with("a capacity off the alignment", [](Forged& f) { f.capacity += 1; });
  for (const auto& [why, forged] : refused) {
    OffsetAllocator target(4096);
    const std::string bytes = forged.Bytes();
    Decoder in(bytes);
    EXPECT_FALSE(target.Decode(in)) << why;
    EXPECT_EQ(target.capacity(), 4096u) << "a refused decode leaves the allocator as it was";
  }
}

}  // namespace
}  // namespace granary::master
