// common/units.h - parse and print byte sizes and durations as operators write them.
//
// Promise: sizes are binary (K = 1024) whatever the spelling ("64k", "512MB", "4 GiB", "1.5G");
// durations are whole milliseconds ("500ms", "10s", "30m", "1h", "1.5s"; a bare number is seconds).
// Every rejection is INVALID_PARAMS with a message quoting the input and the expected form, so the
// config layer can pass it on unchanged. The Format* functions print what the Parse* functions
// read.
//
// Ownership: pure functions on values.
// Thread safety: safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "granary/status.h"

namespace granary {

// "<number>[ ][unit]"; unit (case-insensitive) is B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB or
// P/PB/PiB, all powers of 1024 because segment and object sizes are page-sized, never decimal.
// A fraction needs a unit and is rounded down to a whole byte ("0.1K" = 102). Leading and trailing
// blanks are ignored. Negative numbers, garbage, empty input and values above 2^64-1 are rejected.
Result<uint64_t> ParseSize(std::string_view text);

// "<number>[ ][unit]"; unit is ms, s, m (minutes), h or d; no unit means seconds. Units below a
// millisecond (us, ns) and fractions that do not come to a whole millisecond ("1.5ms", "0.0001s")
// are rejected rather than rounded: a timeout silently made 4x longer is worse than an error.
// Negative values, garbage and values above INT64_MAX milliseconds are rejected.
Result<int64_t> ParseDurationMs(std::string_view text);

// Largest unit that keeps the value >= 1, at most two decimals, trailing zeros dropped:
// 512 -> "512 B", 1536 -> "1.5 KiB", 4 << 30 -> "4 GiB". Exact when the value is a whole multiple
// of the unit's hundredth; otherwise rounded to nearest (ParseSize of it is then approximate).
std::string FormatSize(uint64_t bytes);

// Largest unit that divides the value exactly, so ParseDurationMs reads back the same number:
// 500 -> "500ms", 10000 -> "10s", 1800000 -> "30m", 90000 -> "90s", 0 -> "0ms". Negative values get
// a leading '-' (they are not parseable, but logs may show them).
std::string FormatDurationMs(int64_t ms);

}  // namespace granary
