#include "common/units.h"

#include <array>
#include <cctype>
#include <limits>

namespace granary {

namespace {

// The input split as "<whole>.<fraction> <unit>" and held exactly: value = whole + frac /
// 10^digits. Exact decimal arithmetic (not double) so "1.1G" and 2^64-1 come out to the byte.
struct Number {
  unsigned __int128 whole = 0;
  uint64_t frac = 0;
  uint64_t frac_scale = 1;  // 10^(fraction digits)
  std::string unit;         // lower-cased, blanks between number and unit skipped
};

constexpr int kMaxFractionDigits = 18;  // 10^18 still fits in uint64

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Error text shared by both parsers: the input quoted, then why, then the expected form.
Status Invalid(std::string_view what, std::string_view text, std::string_view why,
               std::string_view expected) {
  std::string msg = "invalid ";
  msg += what;
  msg += " \"";
  msg += text;
  msg += "\": ";
  msg += why;
  msg += "; expected ";
  msg += expected;
  return Status(ErrorCode::INVALID_PARAMS, std::move(msg));
}

// Returns an empty string on success, else the reason the number part is malformed.
std::string SplitNumber(std::string_view s, Number* out) {
  if (s.empty()) return "empty value";
  if (s.front() == '-') return "negative values are not allowed";
  size_t i = 0;
  size_t whole_digits = 0;
  size_t significant = 0;  // leading zeros do not count toward the limit
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, ++whole_digits) {
    // Past 21 digits the value is out of every range; stopping here keeps whole < 10^21 < 2^70,
    // so whole * 2^50 (the P unit) cannot overflow 128 bits.
    if (out->whole != 0 && ++significant >= 21) return "number too large";
    out->whole = out->whole * 10 + static_cast<unsigned>(s[i] - '0');
  }
  size_t frac_digits = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, ++frac_digits) {
      if (frac_digits >= kMaxFractionDigits) return "too many decimal places";
      out->frac = out->frac * 10 + static_cast<unsigned>(s[i] - '0');
      out->frac_scale *= 10;
    }
    if (frac_digits == 0) return "no digits after the decimal point";
  }
  if (whole_digits == 0 && frac_digits == 0) return "not a number";
  while (i < s.size() && s[i] == ' ') ++i;
  for (; i < s.size(); ++i) {
    if (!std::isalpha(static_cast<unsigned char>(s[i]))) return "unexpected characters";
    out->unit += static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
  }
  return "";
}

constexpr std::string_view kSizeExpected =
    "a non-negative number with an optional binary unit B, K/KB/KiB, M/MB/MiB, G/GB/GiB, "
    "T/TB/TiB or P/PB/PiB (e.g. 65536, 64k, 512MB, 1.5 GiB)";
constexpr std::string_view kDurationExpected =
    "a non-negative number with an optional unit ms, s, m, h or d, in whole milliseconds; "
    "a bare number is seconds (e.g. 500ms, 10s, 1.5s, 30m)";

}  // namespace

Result<uint64_t> ParseSize(std::string_view text) {
  std::string_view s = Trim(text);
  Number n;
  if (std::string why = SplitNumber(s, &n); !why.empty()) {
    return Invalid("size", text, why, kSizeExpected);
  }
  int power = -1;
  static constexpr std::array<char, 6> kPrefixes = {'\0', 'k', 'm', 'g', 't', 'p'};
  if (n.unit.empty() || n.unit == "b") {
    power = 0;
  } else {
    for (size_t p = 1; p < kPrefixes.size(); ++p) {
      const std::string one(1, kPrefixes[p]);
      if (n.unit == one || n.unit == one + "b" || n.unit == one + "ib") power = static_cast<int>(p);
    }
  }
  if (power < 0) return Invalid("size", text, "unknown unit \"" + n.unit + "\"", kSizeExpected);
  if (power == 0 && n.frac != 0) {
    return Invalid("size", text, "a byte count must be a whole number", kSizeExpected);
  }
  const unsigned __int128 mult = static_cast<unsigned __int128>(1) << (10 * power);
  // whole < 10^21 and mult <= 2^50, so neither product overflows 128 bits.
  const unsigned __int128 bytes =
      n.whole * mult + static_cast<unsigned __int128>(n.frac) * mult / n.frac_scale;
  if (bytes > std::numeric_limits<uint64_t>::max()) {
    return Invalid("size", text, "larger than 2^64-1 bytes", kSizeExpected);
  }
  return static_cast<uint64_t>(bytes);
}

Result<int64_t> ParseDurationMs(std::string_view text) {
  std::string_view s = Trim(text);
  Number n;
  if (std::string why = SplitNumber(s, &n); !why.empty()) {
    return Invalid("duration", text, why, kDurationExpected);
  }
  uint64_t ms_per_unit = 0;
  if (n.unit == "ms") {
    ms_per_unit = 1;
  } else if (n.unit.empty() || n.unit == "s") {
    ms_per_unit = 1000;
  } else if (n.unit == "m") {
    ms_per_unit = 60 * 1000;
  } else if (n.unit == "h") {
    ms_per_unit = 3600 * 1000;
  } else if (n.unit == "d") {
    ms_per_unit = 24 * 3600 * 1000;
  } else if (n.unit == "us" || n.unit == "ns") {
    return Invalid("duration", text, "durations have millisecond resolution", kDurationExpected);
  } else {
    return Invalid("duration", text, "unknown unit \"" + n.unit + "\"", kDurationExpected);
  }
  const unsigned __int128 frac_ms = static_cast<unsigned __int128>(n.frac) * ms_per_unit;
  if (frac_ms % n.frac_scale != 0) {
    return Invalid("duration", text, "not a whole number of milliseconds", kDurationExpected);
  }
  const unsigned __int128 ms = n.whole * ms_per_unit + frac_ms / n.frac_scale;
  if (ms > static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max())) {
    return Invalid("duration", text, "too large", kDurationExpected);
  }
  return static_cast<int64_t>(ms);
}

std::string FormatSize(uint64_t bytes) {
  static constexpr std::array<std::string_view, 7> kUnits = {"B",   "KiB", "MiB", "GiB",
                                                             "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  size_t u = 0;
  while (u + 1 < kUnits.size() && bytes >= (uint64_t{1} << (10 * (u + 1)))) ++u;
  const unsigned __int128 unit = static_cast<unsigned __int128>(1) << (10 * u);
  // Hundredths of the unit, rounded to nearest; 1023.999 KiB rounds up into the next unit.
  auto hundredths =
      static_cast<uint64_t>((static_cast<unsigned __int128>(bytes) * 100 + unit / 2) / unit);
  if (hundredths >= 1024 * 100 && u + 1 < kUnits.size()) {
    ++u;
    hundredths = (hundredths + 512) / 1024;
  }
  std::string out = std::to_string(hundredths / 100);
  const uint64_t frac = hundredths % 100;
  if (frac != 0) {
    out += '.';
    out += static_cast<char>('0' + frac / 10);
    if (frac % 10 != 0) out += static_cast<char>('0' + frac % 10);
  }
  out += ' ';
  out += kUnits[u];
  return out;
}

std::string FormatDurationMs(int64_t ms) {
  if (ms < 0) {
    // -(INT64_MIN) overflows; go through uint64 to keep the magnitude.
    const uint64_t mag = ~static_cast<uint64_t>(ms) + 1;
    if (mag > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return "-" + std::to_string(mag) + "ms";
    }
    return "-" + FormatDurationMs(static_cast<int64_t>(mag));
  }
  if (ms == 0) return "0ms";
  struct Unit {
    int64_t ms;
    const char* name;
  };
  static constexpr Unit kUnits[] = {
      {24LL * 3600 * 1000, "d"}, {3600 * 1000, "h"}, {60 * 1000, "m"}, {1000, "s"}};
  for (const Unit& u : kUnits) {
    if (ms % u.ms == 0) return std::to_string(ms / u.ms) + u.name;
  }
  return std::to_string(ms) + "ms";
}

}  // namespace granary
