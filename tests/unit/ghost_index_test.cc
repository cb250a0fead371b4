// GhostIndex keeps its header promises: it answers as std::unordered_map<uint64_t, uint64_t>
// through any mix of sets and erases (keys crowding one home slot and wrapping past the table's
// end included, where an erase must move the right entries back), ForEach visits each entry
// once, and an entry costs at most 43 bytes of table while it grows and 64 after any set.
#include "master/state/ghost_index.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <unordered_map>

namespace granary::master {
namespace {

void ExpectSame(const GhostIndex& index, const std::unordered_map<uint64_t, uint64_t>& want) {
  ASSERT_EQ(index.size(), want.size());
  std::map<uint64_t, uint64_t> seen;
  index.ForEach([&](uint64_t hash, uint64_t entry) {
    EXPECT_TRUE(seen.emplace(hash, entry).second) << "visited twice: " << hash;
  });
  const std::map<uint64_t, uint64_t> sorted(want.begin(), want.end());
  EXPECT_EQ(seen, sorted);
  for (const auto& [hash, entry] : want) EXPECT_EQ(index.Find(hash), entry) << hash;
}

TEST(GhostIndexTest, AnswersAsAnUnorderedMap) {
  // Key sets: spread out; crowded onto few low bits (one home slot for many, runs that wrap past
  // the end of a small table); and the extremes of the key space.
  std::mt19937_64 rng(5);
  const std::vector<uint64_t> spread = [&] {
    std::vector<uint64_t> k(5000);
    for (auto& x : k) x = rng();
    return k;
  }();
  const std::vector<uint64_t> crowded = [&] {
    std::vector<uint64_t> k(200);
    for (size_t i = 0; i < k.size(); ++i) k[i] = (rng() << 8) | (i % 3 == 0 ? 15 : 14 + i % 5);
    return k;
  }();
  const std::vector<uint64_t> extremes = {0, 1, ~uint64_t{0}, ~uint64_t{0} - 1, uint64_t{1} << 63};
  for (const auto* keys : {&spread, &crowded, &extremes}) {
    GhostIndex index;
    std::unordered_map<uint64_t, uint64_t> want;
    for (int step = 0; step < 60000; ++step) {
      const uint64_t hash = (*keys)[rng() % keys->size()];
      const uint64_t r = rng();
      if (r % 3 != 0) {
        const uint64_t entry = r % 4 == 0 ? ~uint64_t{0} - 1 : step;  // the largest value too
        index.Set(hash, entry);
        want[hash] = entry;
      } else {
        ASSERT_EQ(index.Erase(hash), want.erase(hash) == 1) << step;
      }
      ASSERT_EQ(index.size(), want.size()) << step;
      if (step % 997 == 0) ExpectSame(index, want);
      const auto found = want.find(hash);
      const std::optional<uint64_t> expected =
          found == want.end() ? std::nullopt : std::optional<uint64_t>(found->second);
      ASSERT_EQ(index.Find(hash), expected) << step;
    }
    ExpectSame(index, want);
    for (const auto& [hash, entry] : std::unordered_map<uint64_t, uint64_t>(want)) {
      EXPECT_TRUE(index.Erase(hash));
    }
    EXPECT_EQ(index.size(), 0u);
    EXPECT_FALSE(index.Find(keys->front()).has_value());
  }
}

TEST(GhostIndexTest, AnEntryCostsAtMostFortyThreeBytesWhileItGrowsAndSixtyFourAfterAnySet) {
  GhostIndex growing;
  for (uint64_t n = 1; n <= 300000; ++n) {
    growing.Set(n * 0x9E3779B97F4A7C15ull, n);
    if (n >= 16) {
      ASSERT_LE(growing.table_bytes() * 3, n * 128) << n;  // 16 bytes at load >= 3/8
    }
  }
  GhostIndex index;
  std::mt19937_64 rng(9);
  std::vector<uint64_t> live;
  for (int step = 0; step < 400000; ++step) {
    // Grows to ~100k entries, then shrinks to a few thousand, then grows again.
    const bool grow = step < 150000 || step > 300000 ? rng() % 4 != 0 : rng() % 4 == 0;
    if (grow || live.empty()) {
      const uint64_t hash = rng();
      index.Set(hash, step);
      live.push_back(hash);
      if (index.size() >= 16) {
        ASSERT_LE(index.table_bytes(), index.size() * 64) << step;  // 16 bytes at load >= 1/4
      }
    } else {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(index.Erase(live[i]));
      live[i] = live.back();
      live.pop_back();
    }
  }
}

}  // namespace
}  // namespace granary::master
