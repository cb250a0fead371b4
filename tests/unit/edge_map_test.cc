// EdgeMap (master/space/edge_map.h, an IntMap of common/int_map.h): the allocator's free blocks
// by their edges. Checked against std::unordered_map under random churn (an erase's back-shift
// must keep every other key findable, whatever run it sat in), and its memory follows its count,
// not its peak.
#include "master/space/edge_map.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <unordered_map>
#include <vector>

namespace granary::master {
namespace {

TEST(EdgeMapTest, RandomChurnAgreesWithAnUnorderedMap) {
  EdgeMap map;
  std::unordered_map<uint64_t, uint32_t> shadow;
  std::mt19937_64 rng(42);
  std::vector<uint64_t> keys;
  for (int op = 0; op < 300000; ++op) {
    const uint64_t pick = rng() % 10;
    if (pick < 5 || keys.empty()) {
      // Dense keys (unit offsets close together) and sparse ones, so runs form and break.
      const uint64_t key = pick < 3 ? rng() % 4096 : rng() >> 6;
      const uint32_t value = static_cast<uint32_t>(rng());
      if (!shadow.count(key)) keys.push_back(key);
      shadow[key] = value;
      map.Set(key, value);
    } else if (pick < 8) {
      const size_t i = rng() % keys.size();
      map.Erase(keys[i]);
      shadow.erase(keys[i]);
      keys[i] = keys.back();
      keys.pop_back();
    } else {
      map.Erase(rng() >> 6);  // almost surely absent: a no-op
      const uint64_t absent = (rng() >> 6) | (uint64_t{1} << 57);
      ASSERT_EQ(map.Find(absent), shadow.count(absent) ? std::optional<uint32_t>(shadow[absent])
                                                       : std::nullopt);
    }
    ASSERT_EQ(map.size(), shadow.size()) << "op " << op;
    if (op % 5000 == 0) {
      for (const auto& [key, value] : shadow) ASSERT_EQ(map.Find(key), value) << "op " << op;
    }
  }
  for (const auto& [key, value] : shadow) EXPECT_EQ(map.Find(key), value);
}

// Keys that share two home slots of a 16-slot table (picked with the map's Fibonacci hash) make
// one long run: erasing from anywhere in it leaves every other key found.
TEST(EdgeMapTest, AnEraseInsideARunKeepsTheRunFindable) {
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; keys.size() < 12; ++k) {
    const uint64_t home = (k * 0x9E3779B97F4A7C15ull) >> 60;
    if (home == 14 || home == 15) keys.push_back(k);  // the run wraps past the table's end
  }
  for (uint64_t first = 0; first < 12; ++first) {
    EdgeMap map;
    for (uint64_t k = 0; k < 12; ++k) map.Set(keys[k], static_cast<uint32_t>(k));
    ASSERT_EQ(map.slot_count(), 16u) << "12 keys in 16 slots";
    std::vector<bool> gone(12, false);
    for (uint64_t step = 0; step < 12; ++step) {
      const uint64_t victim = (first + step * 5) % 12;  // 5 is coprime with 12: each once
      map.Erase(keys[victim]);
      gone[victim] = true;
      for (uint64_t k = 0; k < 12; ++k) {
        ASSERT_EQ(map.Find(keys[k]), gone[k] ? std::nullopt : std::optional<uint32_t>(k))
            << "erased " << victim;
      }
    }
    EXPECT_EQ(map.size(), 0u);
  }
}

TEST(EdgeMapTest, ItsMemoryFollowsItsCountNotItsPeak) {
  EdgeMap map;
  for (uint64_t k = 0; k < 100000; ++k) map.Set(k * 64, 1);
  EXPECT_LE(map.size() * 4, map.slot_count() * 3) << "at most 3/4 full";
  const size_t peak_slots = map.slot_count();
  for (uint64_t k = 0; k < 99990; ++k) map.Erase(k * 64);
  EXPECT_EQ(map.size(), 10u);
  EXPECT_LE(map.slot_count(), 128u) << "shrunk from " << peak_slots;
  for (uint64_t k = 99990; k < 100000; ++k) EXPECT_EQ(map.Find(k * 64), 1u);
}

}  // namespace
}  // namespace granary::master
