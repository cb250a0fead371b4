// ObjectTable keeps its header promises: it answers as std::unordered_map<ObjectKey, ObjectMeta>
// through any mix of inserts and erases (past 2^16 slots too); an entry's ObjectMeta and key
// bytes never move while it lives, whatever is inserted; an erase during an iteration neither
// skips nor repeats an entry; a made entry that meets its key is left to the caller; and an
// object costs one block (the ObjectMeta and the key's bytes) and an 8-byte slot.
#include "master/state/object_table.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <map>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "master/state/key_ref_set.h"

namespace granary::master {
namespace {

std::string KeyOf(size_t i) {
  // 55 bytes, as the scale bench's (a model name and 32 hex digits).
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016zx%016zx", i * 2654435761u, i);
  return "meta-llama/Llama-3.1-8B-Instruct/kv/" + std::string(hex).substr(0, 19);
}

std::unordered_map<std::string, uint64_t> Contents(const ObjectTable& table) {
  std::unordered_map<std::string, uint64_t> seen;
  for (const auto& [key, meta] : table) {
    EXPECT_TRUE(seen.emplace(key.str(), meta.queue_stamp).second) << "repeated: " << key.view();
  }
  return seen;
}

TEST(ObjectTableTest, AnswersAsAnUnorderedMap) {
  // 120,000 keys: a shard's table passes 2^16 slots, where a rehash hashes the keys again.
  std::vector<std::string> keys;
  for (size_t i = 0; i < 120000; ++i) keys.push_back(KeyOf(i));
  ObjectTable table;
  std::unordered_map<std::string, uint64_t> want;
  std::mt19937_64 rng(5);
  uint64_t stamp = 0;
  for (int step = 0; step < 500000; ++step) {
    const std::string& key = keys[rng() % keys.size()];
    const int what = static_cast<int>(rng() % 6);
    if (what < 3 || (step < 250000 && what == 3)) {  // inserts lead until the table is large
      ObjectMeta meta;
      meta.queue_stamp = static_cast<int64_t>(++stamp);
      auto [it, inserted] = table.try_emplace(key, std::move(meta));
      auto [w, w_inserted] = want.try_emplace(key, stamp);
      ASSERT_EQ(inserted, w_inserted) << step;
      ASSERT_EQ(it->first.view(), key);
      ASSERT_EQ(static_cast<uint64_t>(it->second.queue_stamp), w->second) << step;
    } else if (what == 4) {
      auto handle = ObjectTable::MakeEntry(key);
      handle->second.queue_stamp = static_cast<int64_t>(++stamp);
      auto [it, inserted] = table.insert(handle);
      auto [w, w_inserted] = want.try_emplace(key, stamp);
      ASSERT_EQ(inserted, w_inserted) << step;
      ASSERT_EQ(handle == nullptr, inserted) << "taken only when inserted";
      ASSERT_EQ(static_cast<uint64_t>(it->second.queue_stamp), w->second) << step;
    } else {
      const std::string copy = key;  // bytes from another buffer find the entry
      auto it = table.find(copy);
      ASSERT_EQ(it != table.end(), want.count(copy) == 1) << step;
      if (it != table.end()) {
        table.erase(it);
        want.erase(copy);
      }
    }
    ASSERT_EQ(table.size(), want.size());
  }
  EXPECT_GT(table.size(), 50000u);
  EXPECT_GT(table.table_bytes(), (size_t{1} << 16) * sizeof(uint64_t));
  for (const std::string& key : keys) {
    const ObjectTable& read_only = table;
    auto it = read_only.find(key);
    ASSERT_EQ(it != read_only.end(), want.count(key) == 1);
    EXPECT_EQ(read_only.find(key, ObjectTable::Hash(key)), it);
    if (it != read_only.end()) {
      EXPECT_EQ(static_cast<uint64_t>(it->second.queue_stamp), want[key]);
    }
  }
  EXPECT_EQ(Contents(table), want);
}

TEST(ObjectTableTest, AnEntryNeverMovesWhileItLives) {
  ObjectTable table;
  struct Seen {
    const ObjectMeta* meta;
    const char* key;
  };
  std::map<std::string, Seen> first_seen;
  for (size_t i = 0; i < 3000; ++i) {
    auto [it, inserted] = table.try_emplace(KeyOf(i));
    first_seen[KeyOf(i)] = {&it->second, it->first.data()};
  }
  // Rehashes up and down (erase a third, insert past 100,000): the survivors stay put.
  for (size_t i = 0; i < 3000; i += 3) table.erase(table.find(KeyOf(i)));
  for (size_t i = 3000; i < 100000; ++i) table.try_emplace(KeyOf(i));
  for (size_t i = 3000; i < 100000; ++i) table.erase(table.find(KeyOf(i)));
  for (size_t i = 0; i < 3000; ++i) {
    auto it = table.find(KeyOf(i));
    ASSERT_EQ(it != table.end(), i % 3 != 0) << i;
    if (it == table.end()) continue;
    EXPECT_EQ(&it->second, first_seen[KeyOf(i)].meta) << i;
    EXPECT_EQ(it->first.data(), first_seen[KeyOf(i)].key) << i;
    EXPECT_EQ(it->first.view(), KeyOf(i));
  }
}

TEST(ObjectTableTest, AnEraseDuringAnIterationNeitherSkipsNorRepeats) {
  for (int keep_every : {1, 2, 3, 1000000}) {  // erase none, half, two in three, all
    ObjectTable table;
    for (size_t i = 0; i < 5000; ++i) table.try_emplace(KeyOf(i));
    for (size_t i = 0; i < 5000; i += 7) table.erase(table.find(KeyOf(i)));  // erased slots
    const auto before = Contents(table);
    std::unordered_set<std::string> visited;
    std::unordered_set<std::string> kept;
    int n = 0;
    for (auto it = table.begin(); it != table.end();) {
      ASSERT_TRUE(visited.emplace(it->first.str()).second) << "twice: " << it->first.view();
      if (n++ % keep_every == 0 && keep_every != 1) {
        // Both forms the master uses: erase(it) and erase of a copy taken before it++.
        if (n % 2 == 0) {
          it = table.erase(it);
        } else {
          auto current = it++;
          table.erase(current);
        }
      } else {
        kept.emplace(it->first.str());
        ++it;
      }
    }
    EXPECT_EQ(visited.size(), before.size()) << keep_every;
    for (const auto& [key, stamp] : before) EXPECT_TRUE(visited.count(key)) << key;
    auto after = Contents(table);
    EXPECT_EQ(after.size(), kept.size());
    for (const std::string& key : kept) EXPECT_TRUE(after.count(key)) << key;
  }
}

TEST(ObjectTableTest, AKeyRefSetListsAnEntrysKeyByItsBlock) {
  ObjectTable table;
  auto it = table.try_emplace("sglang/page/0001").first;
  EXPECT_EQ(static_cast<const void*>(&it->first), static_cast<const void*>(&*it))
      << "the key sits at the entry's start, its bytes right after the entry";
  KeyRefSet set;
  EXPECT_TRUE(set.insert(it->first));
  EXPECT_FALSE(set.insert(ObjectKey("sglang/page/0001")));
  EXPECT_EQ((*set.begin()).data(), it->first.data());
  EXPECT_TRUE(set.contains("sglang/page/0001"));
  EXPECT_EQ(set.erase("sglang/page/0001"), 1u);
  table.erase(it);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(table.begin(), table.end());
}

// The point (issue 23): one block of the ObjectMeta and the key, and a slot. A 55-byte key's
// entry fits a 160-byte malloc chunk, where the map node (128) and the key's block (64) took 192.
TEST(ObjectTableTest, AnObjectIsOneBlockAndASlot) {
  static_assert(sizeof(ObjectEntry) == sizeof(ObjectMeta));
  const std::string key = KeyOf(1);
  ASSERT_EQ(key.size(), 55u);
  auto entry = ObjectTable::MakeEntry(key);
  EXPECT_EQ(entry->first.view(), key);
  EXPECT_LE(malloc_usable_size(entry.get()), 160u - 8u);
  ObjectTable table;
  for (size_t i = 0; i < 10000; ++i) table.try_emplace(KeyOf(i));
  EXPECT_LE(table.table_bytes(), table.size() * 8 * 8 / 3) << "load at least 3/8";
}

}  // namespace
}  // namespace granary::master
