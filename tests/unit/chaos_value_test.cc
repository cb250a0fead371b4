// The chaos test's value format (tests/tools/chaos_value.h): the checker the chaos test trusts
// must itself catch wrong bytes and say whose bytes they are.
#include <gtest/gtest.h>

#include <cstring>

#include "../tools/chaos_value.h"

namespace granary::chaos {
namespace {

TEST(ChaosValueTest, EveryVersionVerifiesAsItself) {
  for (uint32_t length : {32u, 100u, 4096u, 4097u, 3u * 4096u + 31u, 1u << 20}) {
    auto v = MakeValue("chaos/w0/k1", 7, length);
    ASSERT_EQ(v.size(), length);
    Verdict verdict = VerifyValue("chaos/w0/k1", v);
    EXPECT_TRUE(verdict.ok) << length << ": " << verdict.what;
    EXPECT_EQ(verdict.version, 7u);
    EXPECT_EQ(MakeValue("chaos/w0/k1", 7, length), v) << "not deterministic";
  }
  EXPECT_NE(MakeValue("chaos/w0/k1", 7, 8192), MakeValue("chaos/w0/k1", 8, 8192));
  EXPECT_NE(MakeValue("chaos/w0/k1", 7, 8192), MakeValue("chaos/w0/k2", 7, 8192));
}

TEST(ChaosValueTest, AnotherKeysValueIsWrong) {
  auto v = MakeValue("chaos/w0/k2", 1, 10000);
  Verdict verdict = VerifyValue("chaos/w0/k1", v);
  EXPECT_FALSE(verdict.ok);
  EXPECT_NE(verdict.what.find("not this key's"), std::string::npos) << verdict.what;
}

TEST(ChaosValueTest, LengthMustMatchTheTag) {
  auto v = MakeValue("k", 1, 10000);
  v.resize(9000);
  EXPECT_FALSE(VerifyValue("k", v).ok);
  EXPECT_FALSE(VerifyValue("k", std::span<const std::byte>(v.data(), 16)).ok);
}

// A block of another object written over this one (a late write into reused space) is found,
// and the foreign tag names the object the bytes came from.
TEST(ChaosValueTest, ForeignBlockIsFoundAndNamed) {
  auto v = MakeValue("chaos/w0/k1", 3, 5 * 4096);
  auto other = MakeValue("chaos/w2/k9", 11, 64 * 1024);
  // At an offset that is not a multiple of 4 KiB: the foreign tag sits inside our block.
  std::memcpy(v.data() + 2 * 4096 + 1024, other.data() + 4096, 4096);
  Verdict verdict = VerifyValue("chaos/w0/k1", v);
  EXPECT_FALSE(verdict.ok);
  EXPECT_EQ(verdict.version, 3u);
  const std::string hash = [] {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(KeyHash("chaos/w2/k9")));
    return std::string(buf);
  }();
  EXPECT_NE(verdict.what.find("key_hash " + hash + " version 11"), std::string::npos)
      << verdict.what;
  EXPECT_NE(verdict.what.find("first wrong byte at 9216"), std::string::npos) << verdict.what;
}

TEST(ChaosValueTest, TwoVersionsMixedAreWrong) {
  auto v = MakeValue("k", 4, 4 * 4096);
  auto older = MakeValue("k", 3, 4 * 4096);
  std::memcpy(v.data() + 3 * 4096, older.data() + 3 * 4096, 4096);
  Verdict verdict = VerifyValue("k", v);
  EXPECT_FALSE(verdict.ok);
  EXPECT_NE(verdict.what.find("version 3"), std::string::npos) << verdict.what;
}

TEST(ChaosValueTest, ZerosAndSingleBitFlipsAreWrong) {
  auto v = MakeValue("k", 1, 3 * 4096);
  auto zeroed = v;
  std::memset(zeroed.data() + 4096, 0, 4096);
  Verdict z = VerifyValue("k", zeroed);
  EXPECT_FALSE(z.ok);
  EXPECT_NE(z.what.find("all zeros"), std::string::npos) << z.what;
  auto flipped = v;
  flipped.back() ^= std::byte{1};
  EXPECT_FALSE(VerifyValue("k", flipped).ok);
}

}  // namespace
}  // namespace granary::chaos
