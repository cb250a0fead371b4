// KeyRefSet keeps its header promises: it answers as std::unordered_set<std::string_view> of the
// keys' bytes through any mix of inserts and erases (past 2^16 slots too, where a rehash reads
// the keys again), an erase during an iteration neither skips nor repeats an entry, and an entry
// costs at most ~21 bytes of table while the set grows and 32 after any insert.
#include "master/state/key_ref_set.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace granary::master {
namespace {

std::deque<ObjectKey> MakeKeys(size_t n, const std::string& prefix = "model/layer/") {
  std::deque<ObjectKey> keys;  // a deque: the keys never move while it grows
  for (size_t i = 0; i < n; ++i) keys.emplace_back(prefix + std::to_string(i * 2654435761u));
  return keys;
}

std::unordered_set<std::string> Contents(const KeyRefSet& set) {
  std::unordered_set<std::string> seen;
  for (std::string_view key : set) EXPECT_TRUE(seen.emplace(key).second) << "repeated: " << key;
  return seen;
}

TEST(KeyRefSetTest, AnswersAsAnUnorderedSetOfTheKeysBytes) {
  // 120,000 keys: the table passes 2^16 slots, where a rehash hashes the keys again.
  const std::deque<ObjectKey> keys = MakeKeys(120000);
  KeyRefSet set;
  std::unordered_set<std::string_view> want;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 600000; ++step) {
    const ObjectKey& key = keys[rng() % keys.size()];
    // Inserts win two to one until the set is large, then the mix evens out.
    const bool insert = step < 300000 ? rng() % 3 != 0 : rng() % 2 == 0;
    if (insert) {
      ASSERT_EQ(set.insert(key), want.insert(key.view()).second) << step;
    } else {
      const std::string copy(key.view());  // bytes from another buffer find the entry
      ASSERT_EQ(set.erase(copy), want.erase(copy)) << step;
    }
    ASSERT_EQ(set.size(), want.size());
  }
  EXPECT_GT(set.size(), 50000u);
  EXPECT_GT(set.table_bytes(), (size_t{1} << 16) * sizeof(uint64_t));
  for (const ObjectKey& key : keys) {
    EXPECT_EQ(set.contains(key.view()), want.count(key.view()) == 1);
  }
  const auto seen = Contents(set);
  EXPECT_EQ(seen.size(), want.size());
  for (std::string_view key : want) EXPECT_TRUE(seen.count(std::string(key))) << key;
}

TEST(KeyRefSetTest, AnotherKeyWithTheSameBytesIsTheSameEntry) {
  ObjectKey a("sglang/page/0001");
  ObjectKey b("sglang/page/0001");
  KeyRefSet set;
  EXPECT_TRUE(set.insert(a));
  EXPECT_FALSE(set.insert(b));
  EXPECT_EQ(set.size(), 1u);
  EXPECT_EQ((*set.begin()).data(), a.data()) << "the entry refers to the first key's bytes";
  EXPECT_TRUE(set.contains("sglang/page/0001"));
  EXPECT_FALSE(set.contains("sglang/page/000"));
  EXPECT_EQ(set.erase(b.view()), 1u);
  EXPECT_TRUE(set.empty());
  EXPECT_EQ(set.begin(), set.end());
}

TEST(KeyRefSetTest, AnEraseDuringAnIterationNeitherSkipsNorRepeats) {
  const std::deque<ObjectKey> keys = MakeKeys(5000);
  for (int keep_every : {1, 2, 3, 1000000}) {  // erase none of every 1, half, two in three, all
    KeyRefSet set;
    for (const ObjectKey& key : keys) set.insert(key);
    for (size_t i = 0; i < keys.size(); i += 7) set.erase(keys[i].view());  // erased slots too
    const auto before = Contents(set);
    std::unordered_set<std::string> visited;
    std::unordered_set<std::string> kept;
    int n = 0;
    for (auto it = set.begin(); it != set.end();) {
      ASSERT_TRUE(visited.emplace(*it).second) << "visited twice: " << *it;
      if (n++ % keep_every == 0 && keep_every != 1) {
        it = set.erase(it);
      } else {
        kept.emplace(*it);
        ++it;
      }
    }
    EXPECT_EQ(visited, before) << keep_every;
    EXPECT_EQ(Contents(set), kept) << keep_every;
    EXPECT_EQ(set.size(), kept.size());
  }
}

TEST(KeyRefSetTest, AnEntryCostsAtMostTwentyOneBytesWhileItGrowsAndThirtyTwoAfterAnyInsert) {
  const std::deque<ObjectKey> keys = MakeKeys(200000);
  KeyRefSet set;
  for (size_t n = 0; n < keys.size(); ++n) {
    set.insert(keys[n]);
    if (n + 1 >= 16) {
      ASSERT_LE(set.table_bytes() * 3, (n + 1) * 64) << n + 1;  // 8 bytes at load >= 3/8
    }
  }
  // Churn at about half the size: erased slots are reused or swept by a rehash, never piled up,
  // and the table follows the set down.
  std::mt19937_64 rng(11);
  const size_t peak = set.table_bytes();
  for (int round = 0; round < 400000; ++round) {
    const ObjectKey& key = keys[rng() % keys.size()];
    if (set.insert(key)) {
      ASSERT_LE(set.table_bytes(), set.size() * 32) << round;
    } else {
      set.erase(key.view());
    }
  }
  EXPECT_LT(set.table_bytes(), peak);
  // Emptied by erases, it still finds nothing and takes entries again.
  for (const ObjectKey& key : keys) set.erase(key.view());
  EXPECT_TRUE(set.empty());
  EXPECT_EQ(set.begin(), set.end());
  EXPECT_FALSE(set.contains(keys[0].view()));
  EXPECT_TRUE(set.insert(keys[0]));
  EXPECT_TRUE(set.contains(keys[0].view()));
  set.clear();
  EXPECT_EQ(set.table_bytes(), 0u);
}

}  // namespace
}  // namespace granary::master
