// tests/integration/store_objects.h - the objects the store tests put and the checks they read
// them back with: every value derived from its key (tests/tools/test_pattern.h), so every read
// is checked byte for byte. Used by store_test.cc, store_failure_test.cc, store_deploy_test.cc.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../tools/test_pattern.h"
#include "store_fixture.h"

namespace granary::it {

using Bytes = std::vector<std::byte>;
using SteadyClock = std::chrono::steady_clock;

struct Obj {
  std::string key;
  Bytes value;
};

// `count` sizes between 1 KiB and 32 MiB: mostly small (1 KiB .. 129 KiB, odd sizes included),
// one in a hundred large (1 .. 32 MiB, the last exactly 32 MiB). About 170 MiB in all for 1000.
inline std::vector<uint64_t> MixedSizes(size_t count, uint64_t seed) {
  static constexpr uint64_t kLarge[] = {1 * MiB,  2 * MiB + 3,  3 * MiB,      4 * MiB + 1,
                                        6 * MiB,  8 * MiB - 5,  12 * MiB,     16 * MiB + 7,
                                        24 * MiB, 32 * MiB};
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> sizes;
  size_t large = 0;
  for (size_t i = 0; i < count; ++i) {
    if (i % 100 == 50 && large < std::size(kLarge)) {
      sizes.push_back(kLarge[large++]);
    } else {
      sizes.push_back(1 * KiB + rng() % (128 * KiB));
    }
  }
  return sizes;
}

inline std::vector<Obj> MakeObjects(const std::string& prefix, const std::vector<uint64_t>& sizes) {
  std::vector<Obj> out;
  out.reserve(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    Obj o;
    o.key = prefix + std::to_string(i);
    o.value = testdata::Pattern(o.key, sizes[i]);
    out.push_back(std::move(o));
  }
  return out;
}

inline ByteSpan Span(const Bytes& b) { return ByteSpan(b.data(), b.size()); }

// Counts and reports (the first few) objects whose bytes differ from what was stored.
class ByteChecker {
 public:
  bool Check(const std::string& what, std::span<const std::byte> got,
             std::span<const std::byte> want) {
    int64_t diff = testdata::FirstDifference(got, want);
    if (diff < 0) return true;
    if (++mismatches_ <= 5) {
      ADD_FAILURE() << what << ": wrong bytes (got " << got.size() << " bytes, want "
                    << want.size() << "; first difference at offset " << diff << ")";
    }
    return false;
  }
  int mismatches() const { return mismatches_; }

 private:
  int mismatches_ = 0;
};

// Exist answered, and answered true.
inline bool IsTrue(const Result<bool>& r) { return r.ok() && *r; }

// Puts `objects`: the first half with BatchPut in batches of 50, the rest one by one with Put.
inline void PutAll(Client& client, const std::vector<Obj>& objects, uint32_t replicas) {
  ReplicateConfig config;
  config.replica_num = replicas;
  const size_t half = objects.size() / 2;
  int failures = 0;
  for (size_t begin = 0; begin < half; begin += 50) {
    size_t end = std::min(half, begin + 50);
    std::vector<std::string> keys;
    std::vector<ByteSpan> values;
    for (size_t i = begin; i < end; ++i) {
      keys.push_back(objects[i].key);
      values.push_back(Span(objects[i].value));
    }
    auto results = client.BatchPut(keys, values, config);
    ASSERT_EQ(results.size(), keys.size());
    for (size_t k = 0; k < keys.size(); ++k) {
      if (!results[k].ok() && ++failures <= 5) {
        ADD_FAILURE() << "BatchPut " << keys[k] << " (" << values[k].size()
                      << " bytes, replicas " << replicas << "): " << results[k].ToString();
      }
    }
  }
  for (size_t i = half; i < objects.size(); ++i) {
    Status s = client.Put(objects[i].key, Span(objects[i].value), config);
    if (!s.ok() && ++failures <= 5) {
      ADD_FAILURE() << "Put " << objects[i].key << " (" << objects[i].value.size()
                    << " bytes, replicas " << replicas << "): " << s.ToString();
    }
  }
  EXPECT_EQ(failures, 0) << "puts failed with replica_num " << replicas;
}

// Every object, read back with Get, GetInto, BatchGetInto and BatchGetIntoParts.
inline void ReadAllEveryWay(Client& client, const std::vector<Obj>& objects, ByteChecker& check) {
  int errors = 0;
  auto error = [&](const std::string& what, const Status& s) {
    if (++errors <= 5) ADD_FAILURE() << what << ": " << s.ToString();
  };
  // Get.
  for (const auto& o : objects) {
    auto got = client.Get(o.key);
    if (!got.ok()) {
      error("Get " + o.key, got.status());
      continue;
    }
    check.Check("Get " + o.key, *got, o.value);
  }
  // GetInto a buffer exactly the object's size.
  for (const auto& o : objects) {
    Bytes buf(o.value.size(), std::byte{0x5a});
    auto got = client.GetInto(o.key, buf);
    if (!got.ok()) {
      error("GetInto " + o.key, got.status());
      continue;
    }
    EXPECT_EQ(*got, o.value.size()) << "GetInto " << o.key << " size";
    check.Check("GetInto " + o.key, buf, o.value);
  }
  // BatchGetInto, 40 keys a batch, into buffers 100 bytes larger than the objects: the tail
  // beyond the object stays as it was.
  for (size_t begin = 0; begin < objects.size(); begin += 40) {
    size_t end = std::min(objects.size(), begin + 40);
    std::vector<std::string> keys;
    std::vector<Bytes> bufs;
    for (size_t i = begin; i < end; ++i) {
      keys.push_back(objects[i].key);
      bufs.emplace_back(objects[i].value.size() + 100, std::byte{0xcd});
    }
    std::vector<MutableByteSpan> spans;
    for (auto& b : bufs) spans.emplace_back(b);
    auto results = client.BatchGetInto(keys, spans);
    ASSERT_EQ(results.size(), keys.size());
    for (size_t k = 0; k < keys.size(); ++k) {
      const Obj& o = objects[begin + k];
      if (!results[k].ok()) {
        error("BatchGetInto " + o.key, results[k].status());
        continue;
      }
      EXPECT_EQ(*results[k], o.value.size()) << "BatchGetInto " << o.key << " size";
      check.Check("BatchGetInto " + o.key,
                  std::span<const std::byte>(bufs[k]).subspan(0, o.value.size()), o.value);
      bool tail_untouched = std::all_of(bufs[k].begin() + static_cast<ptrdiff_t>(o.value.size()),
                                        bufs[k].end(), [](std::byte b) { return b == std::byte{0xcd}; });
      EXPECT_TRUE(tail_untouched) << "BatchGetInto " << o.key << " wrote past the object's end";
    }
  }
  // BatchGetIntoParts, 40 keys a batch, each object scattered over three uneven buffers.
  for (size_t begin = 0; begin < objects.size(); begin += 40) {
    size_t end = std::min(objects.size(), begin + 40);
    std::vector<std::string> keys;
    std::vector<std::array<Bytes, 3>> bufs;
    for (size_t i = begin; i < end; ++i) {
      const uint64_t size = objects[i].value.size();
      keys.push_back(objects[i].key);
      uint64_t a = size / 3, b = size / 3 + 7;
      uint64_t c = size - a - b + 64;  // the last buffer has room to spare
      bufs.push_back({Bytes(a, std::byte{0xee}), Bytes(b, std::byte{0xee}), Bytes(c, std::byte{0xee})});
    }
    std::vector<std::vector<MutableByteSpan>> parts;
    for (auto& three : bufs) {
      parts.push_back({MutableByteSpan(three[0]), MutableByteSpan(three[1]), MutableByteSpan(three[2])});
    }
    auto results = client.BatchGetIntoParts(keys, parts);
    ASSERT_EQ(results.size(), keys.size());
    for (size_t k = 0; k < keys.size(); ++k) {
      const Obj& o = objects[begin + k];
      if (!results[k].ok()) {
        error("BatchGetIntoParts " + o.key, results[k].status());
        continue;
      }
      EXPECT_EQ(*results[k], o.value.size()) << "BatchGetIntoParts " << o.key << " size";
      Bytes joined;
      joined.reserve(o.value.size());
      for (const auto& b : bufs[k]) joined.insert(joined.end(), b.begin(), b.end());
      check.Check("BatchGetIntoParts " + o.key,
                  std::span<const std::byte>(joined).subspan(0, o.value.size()), o.value);
      EXPECT_TRUE(std::all_of(joined.begin() + static_cast<ptrdiff_t>(o.value.size()), joined.end(),
                              [](std::byte b) { return b == std::byte{0xee}; }))
          << "BatchGetIntoParts " << o.key << " wrote past the object's end";
    }
  }
  EXPECT_EQ(errors, 0) << "reads failed";
}

// Stat of every object: complete, the right size, `replicas` replicas on distinct segments.
inline void ExpectPlacement(Client& client, const std::vector<Obj>& objects, uint32_t replicas) {
  int bad = 0;
  for (const auto& o : objects) {
    auto st = client.Stat(o.key);
    if (!st.ok()) {
      if (++bad <= 5) ADD_FAILURE() << "Stat " << o.key << ": " << st.status().ToString();
      continue;
    }
    std::set<std::string> segments;
    for (const auto& r : st->replicas) segments.insert(r.segment_name);
    if (st->state != "COMPLETE" || st->size != o.value.size() || st->replicas.size() != replicas ||
        segments.size() != replicas) {
      if (++bad <= 5) {
        ADD_FAILURE() << "Stat " << o.key << ": state " << st->state << ", size " << st->size
                      << " (want " << o.value.size() << "), " << st->replicas.size()
                      << " replicas on " << segments.size() << " segments (want " << replicas
                      << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace granary::it
