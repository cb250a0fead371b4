// ObjectKey keeps its header promises: any length and any bytes round-trip, copies are deep,
// moves hand the block over without moving the bytes, and it costs one pointer.
#include "master/state/object_key.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <unordered_map>

namespace granary::master {
namespace {

TEST(ObjectKeyTest, AnyLengthAndAnyBytesRoundTrip) {
  static_assert(sizeof(ObjectKey) == sizeof(void*));
  EXPECT_EQ(ObjectKey().view(), "");
  EXPECT_EQ(ObjectKey(std::string_view()).size(), 0u);
  for (size_t n : {1, 15, 16, 55, 127, 128, 129, 300, 4096, 16383, 16384, 70000}) {
    std::string key(n, '\0');
    for (size_t i = 0; i < n; ++i) key[i] = static_cast<char>((i * 131 + n) & 0xFF);  // NULs too
    ObjectKey k(key);
    EXPECT_EQ(k.size(), n);
    EXPECT_EQ(k.view(), key) << n;
    EXPECT_EQ(std::string_view(k), key);
    EXPECT_EQ(k.str(), key);
    EXPECT_TRUE(k == std::string_view(key));
    EXPECT_FALSE(k == std::string_view(key).substr(1));
  }
}

TEST(ObjectKeyTest, CopiesAreDeepMovesHandTheBytesOver) {
  ObjectKey a("model/0123456789abcdef");
  ObjectKey b = a;
  EXPECT_TRUE(a == b);
  EXPECT_NE(a.data(), b.data()) << "a copy has its own bytes";
  const char* bytes = a.data();
  ObjectKey c = std::move(a);
  EXPECT_EQ(c.data(), bytes) << "a move does not move the bytes: views stay valid";
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): the promise under test
  ObjectKey d("other");
  d = std::move(c);
  EXPECT_EQ(d.data(), bytes);
  d = d;  // self-assignment keeps the bytes
  EXPECT_EQ(d.view(), "model/0123456789abcdef");
  ObjectKey e("x");
  e = b;
  EXPECT_TRUE(e == b);
  EXPECT_TRUE(ObjectKey("a") < ObjectKey("b"));
}

// As the master's maps use it: found by a string_view, without building a key.
TEST(ObjectKeyTest, MapsFindItByView) {
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view k) const { return std::hash<std::string_view>{}(k); }
  };
  std::unordered_map<ObjectKey, int, Hash, std::equal_to<>> map;
  for (int i = 0; i < 1000; ++i) map.try_emplace(ObjectKey("key-" + std::to_string(i)), i);
  for (int i = 0; i < 1000; ++i) {
    auto it = map.find(std::string_view("key-" + std::to_string(i)));
    ASSERT_NE(it, map.end());
    EXPECT_EQ(it->second, i);
  }
  EXPECT_EQ(map.find(std::string_view("key-1000")), map.end());
}

}  // namespace
}  // namespace granary::master
