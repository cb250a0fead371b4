// tests/tools/test_pattern.h - deterministic object contents shared by the integration tests and
// granary-test-worker, so a reader can check bytes it did not write itself.
//
// Promise: FillPattern(seed, buf) writes the same bytes for the same (seed, size) in every
// process; different seeds give different bytes (a splitmix64 stream per seed). SeedOf(key)
// derives the seed from a key, so an object's expected contents follow from its key and size.
// Thread safety: pure functions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

namespace granary::testdata {

inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// FNV-1a of the key: a stable seed.
inline uint64_t SeedOf(std::string_view key) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : key) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

inline void FillPattern(uint64_t seed, std::span<std::byte> buf) {
  uint64_t state = seed;
  size_t i = 0;
  for (; i + 8 <= buf.size(); i += 8) {
    uint64_t v = SplitMix64(state);
    std::memcpy(buf.data() + i, &v, 8);
  }
  if (i < buf.size()) {
    uint64_t v = SplitMix64(state);
    std::memcpy(buf.data() + i, &v, buf.size() - i);
  }
}

inline std::vector<std::byte> Pattern(std::string_view key, size_t size, uint64_t salt = 0) {
  std::vector<std::byte> out(size);
  FillPattern(SeedOf(key) ^ salt, out);
  return out;
}

// Index of the first byte where a and b differ, or -1 when they are equal (sizes included).
inline int64_t FirstDifference(std::span<const std::byte> a, std::span<const std::byte> b) {
  size_t n = std::min(a.size(), b.size());
  if (a.size() == b.size() && (n == 0 || std::memcmp(a.data(), b.data(), n) == 0)) return -1;
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  if (a.size() != b.size()) return static_cast<int64_t>(n);
  return -1;
}

}  // namespace granary::testdata
