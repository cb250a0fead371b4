// GhostIndex keeps its header promises: it answers as std::unordered_map<uint32_t, uint32_t>
// through any mix of sets and erases (keys crowding one home slot and wrapping past the table's
// end included, where an erase must move the right entries back), ForEach visits each entry
// once, and an entry costs at most 21 bytes of table while it grows and 32 after any set.
#include "master/state/ghost_index.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <unordered_map>

namespace granary::master {
namespace {

void ExpectSame(const GhostIndex& index, const std::unordered_map<uint32_t, uint32_t>& want) {
  ASSERT_EQ(index.size(), want.size());
  std::map<uint32_t, uint32_t> seen;
  index.ForEach([&](uint32_t fp, uint32_t entry) {
    EXPECT_TRUE(seen.emplace(fp, entry).second) << "visited twice: " << fp;
  });
  const std::map<uint32_t, uint32_t> sorted(want.begin(), want.end());
  EXPECT_EQ(seen, sorted);
  for (const auto& [hash, entry] : want) EXPECT_EQ(index.Find(hash), entry) << hash;
}

// A fingerprint is the 32 hash bits below the stripe's four (bits 28-59), and never 0, the
// index's empty slot: a hash whose bits there are all 0 reads as 1.
TEST(GhostIndexTest, AFingerprintIsTheBitsBelowTheStripeAndNeverZero) {
  EXPECT_EQ(GhostFingerprint(uint64_t{5} << 28), 5u);
  EXPECT_EQ(GhostFingerprint(uint64_t{0xFFFFFFFF} << 28), 0xFFFFFFFFu);
  EXPECT_EQ(GhostFingerprint(0xF000000000000000ull | 0x0FFFFFFFull), 1u) << "other bits only";
  EXPECT_EQ(GhostFingerprint(0), 1u);
}

TEST(GhostIndexTest, AnswersAsAnUnorderedMap) {
  // Key sets: spread out; sharing their low bits (which no longer share a home: IntMap hashes
  // keys; EdgeMapTest.AnEraseInsideARunKeepsTheRunFindable crowds one run on purpose); and the
  // extremes of the key space (0 is no key: never made).
  std::mt19937_64 rng(5);
  const std::vector<uint32_t> spread = [&] {
    std::vector<uint32_t> k(5000);
    for (auto& x : k) x = GhostFingerprint(rng());
    return k;
  }();
  const std::vector<uint32_t> crowded = [&] {
    std::vector<uint32_t> k(200);
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<uint32_t>(rng() << 8) | (i % 3 == 0 ? 15 : 14 + i % 5);
    }
    return k;
  }();
  const std::vector<uint32_t> extremes = {1, 2, 0xFFFFFFFFu, 0xFFFFFFFEu, 0x80000000u};
  for (const auto* keys : {&spread, &crowded, &extremes}) {
    GhostIndex index;
    std::unordered_map<uint32_t, uint32_t> want;
    for (int step = 0; step < 60000; ++step) {
      const uint32_t hash = (*keys)[rng() % keys->size()];
      const uint64_t r = rng();
      if (r % 3 != 0) {
        // The largest value and 0 too.
        const uint32_t entry = r % 4 == 0 ? 0xFFFFFFFFu : r % 4 == 1 ? 0 : step;
        index.Set(hash, entry);
        want[hash] = entry;
      } else {
        ASSERT_EQ(index.Erase(hash), want.erase(hash) == 1) << step;
      }
      ASSERT_EQ(index.size(), want.size()) << step;
      if (step % 997 == 0) ExpectSame(index, want);
      const auto found = want.find(hash);
      const std::optional<uint32_t> expected =
          found == want.end() ? std::nullopt : std::optional<uint32_t>(found->second);
      ASSERT_EQ(index.Find(hash), expected) << step;
    }
    ExpectSame(index, want);
    for (const auto& [hash, entry] : std::unordered_map<uint32_t, uint32_t>(want)) {
      EXPECT_TRUE(index.Erase(hash));
    }
    EXPECT_EQ(index.size(), 0u);
    EXPECT_FALSE(index.Find(keys->front()).has_value());
  }
}

TEST(GhostIndexTest, AnEntryCostsAtMostTwentyOneBytesWhileItGrowsAndThirtyTwoAfterAnySet) {
  GhostIndex growing;
  for (uint64_t n = 1; n <= 300000; ++n) {  // a few pairs share a fingerprint: size() counts
    growing.Set(GhostFingerprint(n * 0x9E3779B97F4A7C15ull), static_cast<uint32_t>(n));
    if (n >= 16) {
      ASSERT_LE(growing.table_bytes() * 3, growing.size() * 64) << n;  // 8 bytes at load >= 3/8
    }
  }
  GhostIndex index;
  std::mt19937_64 rng(9);
  std::vector<uint32_t> live;
  for (int step = 0; step < 400000; ++step) {
    // Grows to ~100k entries, then shrinks to a few thousand, then grows again.
    const bool grow = step < 150000 || step > 300000 ? rng() % 4 != 0 : rng() % 4 == 0;
    if (grow || live.empty()) {
      const uint32_t fp = GhostFingerprint(rng());
      if (index.Find(fp)) continue;
      index.Set(fp, step);
      live.push_back(fp);
      if (index.size() >= 16) {
        ASSERT_LE(index.table_bytes(), index.size() * 32) << step;  // 8 bytes at load >= 1/4
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
