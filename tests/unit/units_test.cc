#include "common/units.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace granary {
namespace {

uint64_t SizeOk(std::string_view text) {
  auto r = ParseSize(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? *r : 0;
}

void SizeBad(std::string_view text, std::string_view why) {
  auto r = ParseSize(text);
  ASSERT_FALSE(r.ok()) << text << " parsed as " << *r;
  EXPECT_EQ(r.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(r.status().message().find(std::string(text)), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find(std::string(why)), std::string::npos) << r.status().message();
}

int64_t DurOk(std::string_view text) {
  auto r = ParseDurationMs(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? *r : -1;
}

void DurBad(std::string_view text, std::string_view why) {
  auto r = ParseDurationMs(text);
  ASSERT_FALSE(r.ok()) << text << " parsed as " << *r;
  EXPECT_EQ(r.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(r.status().message().find(std::string(why)), std::string::npos) << r.status().message();
}

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * 1024;
constexpr uint64_t kGiB = kMiB * 1024;
constexpr uint64_t kTiB = kGiB * 1024;

TEST(ParseSizeTest, AcceptsTheSpellingsOperatorsUse) {
  EXPECT_EQ(SizeOk("1048576"), 1048576u);
  EXPECT_EQ(SizeOk("0"), 0u);
  EXPECT_EQ(SizeOk("512B"), 512u);
  EXPECT_EQ(SizeOk("64k"), 64 * kKiB);
  EXPECT_EQ(SizeOk("64KB"), 64 * kKiB);
  EXPECT_EQ(SizeOk("64KiB"), 64 * kKiB);
  EXPECT_EQ(SizeOk("512MB"), 512 * kMiB);
  EXPECT_EQ(SizeOk("16mb"), 16 * kMiB);
  EXPECT_EQ(SizeOk("4GiB"), 4 * kGiB);
  EXPECT_EQ(SizeOk("1 GB"), kGiB);
  EXPECT_EQ(SizeOk("  2 g  "), 2 * kGiB);
  EXPECT_EQ(SizeOk("3TiB"), 3 * kTiB);
  EXPECT_EQ(SizeOk("1tb"), kTiB);
  EXPECT_EQ(SizeOk("2P"), 2 * kTiB * 1024);
}

TEST(ParseSizeTest, FractionsNeedAUnitAndRoundDown) {
  EXPECT_EQ(SizeOk("1.5GB"), kGiB + kGiB / 2);
  EXPECT_EQ(SizeOk("0.5k"), 512u);
  EXPECT_EQ(SizeOk(".5M"), kMiB / 2);
  EXPECT_EQ(SizeOk("0.1K"), 102u);         // 102.4 rounded down to a whole byte
  EXPECT_EQ(SizeOk("1.1G"), 1181116006u);  // exact decimal arithmetic, not double
  SizeBad("1.5", "whole number");
  SizeBad("1.5B", "whole number");
  SizeBad("1.G", "decimal point");
}

TEST(ParseSizeTest, RejectsGarbageNegativesAndOverflow) {
  SizeBad("", "empty");
  SizeBad("   ", "empty");
  SizeBad("-1", "negative");
  SizeBad("-4GB", "negative");
  SizeBad("abc", "not a number");
  SizeBad("GB", "not a number");
  SizeBad("12XB", "unknown unit");
  SizeBad("12 bytes", "unknown unit");
  SizeBad("1e9", "unexpected characters");
  SizeBad("1,000", "unexpected characters");
  SizeBad("+5", "not a number");
  SizeBad("0x10", "unexpected characters");
  SizeBad("5 G B", "unexpected characters");
  SizeBad("18446744073709551616", "2^64");  // 2^64
  SizeBad("16384P", "2^64");                // 2^64 again, via a unit
  SizeBad("99999999999999999999999999", "too large");
  EXPECT_EQ(SizeOk("18446744073709551615"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(SizeOk("000000000000000000000000000001k"), kKiB);  // leading zeros are not magnitude
}

TEST(ParseSizeTest, ErrorMessageSaysWhatIsExpected) {
  auto r = ParseSize("lots");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("\"lots\""), std::string::npos);
  EXPECT_NE(r.status().message().find("GiB"), std::string::npos);
}

TEST(ParseDurationTest, AcceptsUnitsAndBareSeconds) {
  EXPECT_EQ(DurOk("500ms"), 500);
  EXPECT_EQ(DurOk("10s"), 10000);
  EXPECT_EQ(DurOk("10"), 10000);  // bare number is seconds
  EXPECT_EQ(DurOk("0"), 0);
  EXPECT_EQ(DurOk("30m"), 30 * 60 * 1000);
  EXPECT_EQ(DurOk("1h"), 3600 * 1000);
  EXPECT_EQ(DurOk("2d"), 2LL * 24 * 3600 * 1000);
  EXPECT_EQ(DurOk("1.5s"), 1500);
  EXPECT_EQ(DurOk("0.25h"), 15 * 60 * 1000);
  EXPECT_EQ(DurOk(" 5 S "), 5000);
  EXPECT_EQ(DurOk("0.001s"), 1);
}

TEST(ParseDurationTest, RejectsSubMillisecondInsteadOfRounding) {
  DurBad("250us", "millisecond resolution");
  DurBad("10ns", "millisecond resolution");
  DurBad("1.5ms", "whole number of milliseconds");
  DurBad("0.0001s", "whole number of milliseconds");
}

TEST(ParseDurationTest, RejectsGarbageNegativesAndOverflow) {
  DurBad("", "empty");
  DurBad("-5s", "negative");
  DurBad("soon", "not a number");
  DurBad("5 minutes", "unknown unit");
  DurBad("1h30m", "unexpected characters");
  DurBad("5w", "unknown unit");
  DurBad("9223372036854776s", "too large");
  EXPECT_EQ(DurOk("9223372036854775807ms"), std::numeric_limits<int64_t>::max());
  DurBad("9223372036854775808ms", "too large");
}

TEST(FormatSizeTest, PicksTheLargestUnitAndTrimsZeros) {
  EXPECT_EQ(FormatSize(0), "0 B");
  EXPECT_EQ(FormatSize(512), "512 B");
  EXPECT_EQ(FormatSize(1023), "1023 B");
  EXPECT_EQ(FormatSize(1024), "1 KiB");
  EXPECT_EQ(FormatSize(1536), "1.5 KiB");
  EXPECT_EQ(FormatSize(kGiB + kGiB / 2), "1.5 GiB");
  EXPECT_EQ(FormatSize(4 * kGiB), "4 GiB");
  EXPECT_EQ(FormatSize(kGiB + kGiB / 4), "1.25 GiB");
  EXPECT_EQ(FormatSize(kMiB + 1), "1 MiB");  // rounded to two decimals
  EXPECT_EQ(FormatSize(kMiB - 1), "1 MiB");  // 1023.999 KiB rolls over to the next unit
  EXPECT_EQ(FormatSize(1428745175), "1.33 GiB");
  EXPECT_EQ(FormatSize(std::numeric_limits<uint64_t>::max()), "16 EiB");
}

TEST(FormatSizeTest, ExactValuesRoundTrip) {
  for (uint64_t v : {uint64_t{0}, uint64_t{512}, 64 * kKiB, 3 * kMiB / 2, 4 * kGiB, 7 * kTiB}) {
    EXPECT_EQ(SizeOk(FormatSize(v)), v) << FormatSize(v);
  }
}

TEST(FormatDurationTest, LargestExactUnitSoItRoundTrips) {
  EXPECT_EQ(FormatDurationMs(0), "0ms");
  EXPECT_EQ(FormatDurationMs(500), "500ms");
  EXPECT_EQ(FormatDurationMs(1500), "1500ms");
  EXPECT_EQ(FormatDurationMs(10000), "10s");
  EXPECT_EQ(FormatDurationMs(90000), "90s");
  EXPECT_EQ(FormatDurationMs(30 * 60 * 1000), "30m");
  EXPECT_EQ(FormatDurationMs(3600 * 1000), "1h");
  EXPECT_EQ(FormatDurationMs(86400 * 1000), "1d");
  EXPECT_EQ(FormatDurationMs(-2000), "-2s");
  EXPECT_EQ(FormatDurationMs(std::numeric_limits<int64_t>::min()), "-9223372036854775808ms");
  for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{1500}, int64_t{90000}, int64_t{7200000},
                    std::numeric_limits<int64_t>::max()}) {
    EXPECT_EQ(DurOk(FormatDurationMs(v)), v) << FormatDurationMs(v);
  }
}

}  // namespace
}  // namespace granary
