// tests/tools/chaos_value.h - object contents of the chaos test that any reader can verify from
// the key alone, and that say whose bytes they are when they are wrong.
//
// Promise: MakeValue(key, version, length) gives the same bytes in every process. The value is
// cut into 4 KiB blocks; each block starts with a 32-byte tag {magic, hash of the key, version,
// length, block index} followed by a splitmix64 stream seeded by (key hash, version, length,
// block). VerifyValue(key, bytes) reads the version from block 0's tag and compares every byte
// with MakeValue(key, that version, bytes.size()): equal, or a Verdict that describes the wrong
// bytes (first bad offset, bad blocks, and the tags of other objects found inside them, which
// name the key hash, version and block whose bytes landed there).
// Thread safety: pure functions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace granary::chaos {

inline constexpr uint64_t kMagic = 0x314c415653414843ull;  // "CHASVAL1" little-endian
inline constexpr size_t kBlock = 4096;
inline constexpr size_t kTagBytes = 32;

struct Tag {
  uint64_t magic = 0;
  uint64_t key_hash = 0;
  uint64_t version = 0;
  uint32_t length = 0;
  uint32_t block = 0;
};
static_assert(sizeof(Tag) == kTagBytes);

// FNV-1a 64 of the key.
inline uint64_t KeyHash(std::string_view key) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : key) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

inline uint64_t Mix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Block `block` of the value (key_hash, version, length) into out (out.size() = that block's
// length: kBlock, or less for the last one).
inline void FillBlock(uint64_t key_hash, uint64_t version, uint32_t length, uint32_t block,
                      std::span<std::byte> out) {
  uint64_t state = key_hash ^ (version * 0xd6e8feb86659fd93ull) ^
                   (uint64_t{length} << 20) ^ (uint64_t{block} * 0xa0761d6478bd642full);
  size_t i = 0;
  if (out.size() >= kTagBytes) {
    Tag tag{kMagic, key_hash, version, length, block};
    std::memcpy(out.data(), &tag, kTagBytes);
    i = kTagBytes;
  }
  for (; i + 8 <= out.size(); i += 8) {
    uint64_t v = Mix(state);
    std::memcpy(out.data() + i, &v, 8);
  }
  if (i < out.size()) {
    uint64_t v = Mix(state);
    std::memcpy(out.data() + i, &v, out.size() - i);
  }
}

inline std::vector<std::byte> MakeValue(std::string_view key, uint64_t version, uint32_t length) {
  std::vector<std::byte> out(length);
  const uint64_t h = KeyHash(key);
  for (size_t off = 0, b = 0; off < length; off += kBlock, ++b) {
    size_t n = std::min<size_t>(kBlock, length - off);
    FillBlock(h, version, length, static_cast<uint32_t>(b), std::span(out).subspan(off, n));
  }
  return out;
}

inline Tag ReadTag(const std::byte* p) {
  Tag t;
  std::memcpy(&t, p, kTagBytes);
  return t;
}

struct Verdict {
  bool ok = false;
  uint64_t version = 0;  // claimed by block 0 (0 if it has no readable tag)
  std::string what;      // empty when ok
};

inline std::string Hex(const std::byte* p, size_t n) {
  std::string s;
  char buf[4];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned>(p[i]));
    s += buf;
  }
  return s;
}

inline std::string DescribeTag(const Tag& t) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "{key_hash %016llx version %llu length %u block %u}",
                static_cast<unsigned long long>(t.key_hash),
                static_cast<unsigned long long>(t.version), t.length, t.block);
  return buf;
}

// Checks bytes read for `key`. On failure `what` says where the bytes go wrong, what the tags
// inside the wrong region claim (whose object they belong to), and whether they are zeros.
inline Verdict VerifyValue(std::string_view key, std::span<const std::byte> bytes) {
  Verdict v;
  const uint64_t h = KeyHash(key);
  char buf[512];
  if (bytes.size() < kTagBytes) {
    v.what = "value of " + std::to_string(bytes.size()) + " bytes is shorter than a tag";
    return v;
  }
  Tag head = ReadTag(bytes.data());
  if (head.magic != kMagic || head.key_hash != h || head.length != bytes.size() ||
      head.block != 0) {
    std::snprintf(buf, sizeof buf,
                  "block 0 tag is not this key's (key_hash %016llx, %zu bytes): %s%s; first 32 "
                  "bytes %s",
                  static_cast<unsigned long long>(h), bytes.size(),
                  head.magic == kMagic ? "" : "no magic, raw ", DescribeTag(head).c_str(),
                  Hex(bytes.data(), std::min<size_t>(32, bytes.size())).c_str());
    v.version = head.magic == kMagic && head.key_hash == h ? head.version : 0;
    v.what = buf;
    // Whose bytes these are: the first tags at any 8-byte alignment (offset in what was read).
    int tags = 0;
    for (size_t i = 8; i + kTagBytes <= bytes.size() && tags < 4; i += 8) {
      Tag t = ReadTag(bytes.data() + i);
      if (t.magic != kMagic) continue;
      ++tags;
      std::snprintf(buf, sizeof buf, "; tag at %zu: %s", i, DescribeTag(t).c_str());
      v.what += buf;
    }
    if (tags == 0) v.what += "; no tag anywhere in the bytes";
    return v;
  }
  v.version = head.version;
  std::vector<std::byte> expect(kBlock);
  size_t bad_blocks = 0, bad_bytes = 0;
  int64_t first_bad = -1, last_bad = -1;
  std::string details;
  int described = 0;
  const size_t length = bytes.size();
  for (size_t off = 0, b = 0; off < length; off += kBlock, ++b) {
    size_t n = std::min(kBlock, length - off);
    FillBlock(h, head.version, head.length, static_cast<uint32_t>(b),
              std::span(expect).subspan(0, n));
    const std::byte* got = bytes.data() + off;
    if (std::memcmp(got, expect.data(), n) == 0) continue;
    ++bad_blocks;
    size_t lo = n, hi = 0, diff = 0;
    bool zeros = true;
    for (size_t i = 0; i < n; ++i) {
      if (got[i] != expect[i]) {
        lo = std::min(lo, i);
        hi = i;
        ++diff;
      }
      if (got[i] != std::byte{0}) zeros = false;
    }
    bad_bytes += diff;
    if (first_bad < 0) first_bad = static_cast<int64_t>(off + lo);
    last_bad = static_cast<int64_t>(off + hi);
    if (described < 6) {
      ++described;
      std::snprintf(buf, sizeof buf, "\n    block %zu: %zu bytes differ in [%zu, %zu]%s", b, diff,
                    off + lo, off + hi, zeros ? ", block is all zeros" : "");
      details += buf;
      // Tags of other objects inside this block, at any 8-byte alignment: whose bytes these are.
      int tags = 0;
      for (size_t i = 0; i + kTagBytes <= n && tags < 2; i += 8) {
        Tag t = ReadTag(got + i);
        if (t.magic != kMagic) continue;
        if (i == 0 && t.key_hash == h && t.version == head.version && t.block == b) continue;
        ++tags;
        std::snprintf(buf, sizeof buf, "; tag at +%zu: %s", i, DescribeTag(t).c_str());
        details += buf;
      }
      if (tags == 0 && !zeros) {
        details += "; no tag inside; got " + Hex(got + lo, std::min<size_t>(16, n - lo)) +
                   " expected " + Hex(expect.data() + lo, std::min<size_t>(16, n - lo));
      }
    }
  }
  if (bad_blocks == 0) {
    v.ok = true;
    return v;
  }
  std::snprintf(buf, sizeof buf,
                "%zu bytes read, block 0 claims version %llu; %zu of %zu blocks wrong (%zu bytes), "
                "first wrong byte at %lld, last at %lld:",
                length, static_cast<unsigned long long>(head.version), bad_blocks,
                (length + kBlock - 1) / kBlock, bad_bytes, static_cast<long long>(first_bad),
                static_cast<long long>(last_bad));
  v.what = buf + details;
  return v;
}

}  // namespace granary::chaos
