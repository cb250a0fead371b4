// RareVector and InlineVector keep their header promises (vector behaviour, empty means no
// allocation, one element inline); OptionalVersion behaves as an optional; and the master's
// records that hold them encode to the bytes of the fields they replaced (snapshot format
// unchanged).
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/inline_vector.h"
#include "common/rare_vector.h"
#include "master/codec/binary_codec.h"
#include "master/state/object_meta.h"
#include "master/state/state_codec.h"

namespace granary {
namespace {

using master::DiskReplica;
using master::Extent;
using master::ObjectMeta;
using master::ReadLock;

bool Inside(const void* p, const void* object, size_t size) {
  auto a = reinterpret_cast<uintptr_t>(p);
  auto o = reinterpret_cast<uintptr_t>(object);
  return a >= o && a < o + size;
}

std::vector<int> Items(const RareVector<int>& v) { return std::vector<int>(v.begin(), v.end()); }
std::vector<uint64_t> Offsets(const InlineVector<Extent>& v) {
  std::vector<uint64_t> out;
  for (const auto& e : v) out.push_back(e.offset);
  return out;
}
Extent At(uint64_t offset) { return Extent{1, offset, 100}; }

TEST(RareVectorTest, EmptyIsOnePointerAndNoAllocation) {
  static_assert(sizeof(RareVector<ReadLock>) == sizeof(void*));
  RareVector<int> v;
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.data(), nullptr);
  EXPECT_EQ(v.begin(), v.end());

  v.push_back(1);
  v.push_back(2);
  EXPECT_NE(v.data(), nullptr);
  v.erase(v.begin());
  EXPECT_EQ(Items(v), std::vector<int>{2});
  int* after = v.erase(v.begin());
  EXPECT_EQ(after, v.end());
  EXPECT_EQ(v.data(), nullptr) << "removing the last element frees the list";

  v = {1, 2, 3};
  EXPECT_EQ(erase_if(v, [](int x) { return x > 0; }), 3u);
  EXPECT_EQ(v.data(), nullptr);
  v = {1, 2};
  v.resize(0);
  EXPECT_EQ(v.data(), nullptr);
  v = {1};
  v.clear();
  EXPECT_EQ(v.data(), nullptr);
  EXPECT_EQ(RareVector<int>(std::vector<int>{}).data(), nullptr);
}

TEST(RareVectorTest, AFailedFirstElementLeavesNoAllocation) {
  struct Refuses {
    explicit Refuses(int) { throw std::runtime_error("refused"); }
  };
  RareVector<Refuses> v;
  EXPECT_THROW(v.emplace_back(1), std::runtime_error);
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.data(), nullptr);
}

TEST(RareVectorTest, BehavesAsAVector) {
  RareVector<int> v = {5, 6, 7, 8};
  EXPECT_EQ(v.size(), 4u);
  EXPECT_EQ(v.front(), 5);
  EXPECT_EQ(v.back(), 8);
  EXPECT_EQ(v[2], 7);
  int* next = v.erase(v.begin() + 1, v.begin() + 3);
  EXPECT_EQ(*next, 8);
  EXPECT_EQ(Items(v), (std::vector<int>{5, 8}));
  EXPECT_EQ(erase_if(v, [](int x) { return x == 5; }), 1u);
  EXPECT_EQ(Items(v), std::vector<int>{8});
  EXPECT_EQ(v.emplace_back(9), 9);
  v.resize(4);
  EXPECT_EQ(Items(v), (std::vector<int>{8, 9, 0, 0}));
  EXPECT_EQ(v.ToVector(), (std::vector<int>{8, 9, 0, 0}));

  RareVector<int> copy = v;
  copy[0] = 1;
  EXPECT_EQ(v[0], 8) << "copies are deep";
  EXPECT_FALSE(copy == v);
  copy[0] = 8;
  EXPECT_TRUE(copy == v);
  RareVector<int> moved = std::move(copy);
  EXPECT_TRUE(copy.empty());  // NOLINT(bugprone-use-after-move): the promise under test
  EXPECT_TRUE(moved == v);
  v = v;  // self-assignment keeps the elements
  EXPECT_EQ(v.size(), 4u);
}

TEST(InlineVectorTest, OneElementLivesInline) {
  static_assert(sizeof(InlineVector<Extent>) == sizeof(Extent) + 8);
  InlineVector<Extent> v;
  EXPECT_TRUE(v.empty());
  v.push_back(At(64));
  EXPECT_TRUE(Inside(v.data(), &v, sizeof(v))) << "one element needs no allocation";
  v.push_back(At(128));
  EXPECT_FALSE(Inside(v.data(), &v, sizeof(v))) << "two go to the heap";
  EXPECT_EQ(Offsets(v), (std::vector<uint64_t>{64, 128}));
  v.erase(v.begin());
  EXPECT_TRUE(Inside(v.data(), &v, sizeof(v))) << "back to one: back inline";
  EXPECT_EQ(Offsets(v), std::vector<uint64_t>{128});
  v.erase(v.begin());
  EXPECT_TRUE(v.empty());

  InlineVector<Extent> many;
  for (uint64_t i = 0; i < 100; ++i) many.push_back(At(i * 64));
  ASSERT_EQ(many.size(), 100u);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_EQ(many[i].offset, i * 64);
  EXPECT_EQ(erase_if(many, [](const Extent& e) { return e.offset != 640; }), 99u);
  EXPECT_TRUE(Inside(many.data(), &many, sizeof(many)));
  EXPECT_EQ(Offsets(many), std::vector<uint64_t>{640});
  many.resize(3);
  EXPECT_EQ(Offsets(many), (std::vector<uint64_t>{640, 0, 0}));
  many.resize(1);
  EXPECT_TRUE(Inside(many.data(), &many, sizeof(many)));
  many.clear();
  EXPECT_TRUE(many.empty());
}

// Its count is 32 bits: a size past it is refused whole, never truncated (a decoded count is
// checked against max_size first).
TEST(InlineVectorTest, RefusesASizePastItsCount) {
  InlineVector<Extent> v = {At(0)};
  EXPECT_THROW(v.resize(size_t{1} << 32), std::length_error);
  EXPECT_EQ(Offsets(v), std::vector<uint64_t>{0}) << "a refused resize changes nothing";
  EXPECT_EQ(InlineVector<Extent>::max_size(), 0xFFFFFFFFu);
  EXPECT_TRUE(InlineVector<Extent>(std::vector<Extent>{}).empty());
}

TEST(InlineVectorTest, BehavesAsAVector) {
  InlineVector<Extent> v = {At(0), At(64), At(128)};
  // An element of the list itself, pushed while the list grows.
  v.push_back(v[0]);
  v.push_back(v[1]);
  EXPECT_EQ(Offsets(v), (std::vector<uint64_t>{0, 64, 128, 0, 64}));
  Extent* next = v.erase(v.begin() + 1, v.begin() + 3);
  EXPECT_EQ(next->offset, 0u);
  EXPECT_EQ(Offsets(v), (std::vector<uint64_t>{0, 0, 64}));
  EXPECT_EQ(v.front().offset, 0u);
  EXPECT_EQ(v.back().offset, 64u);

  InlineVector<Extent> copy = v;
  copy[0].offset = 4096;
  EXPECT_EQ(v[0].offset, 0u) << "copies are deep";
  InlineVector<Extent> one = {At(7 * 64)};
  InlineVector<Extent> one_copy = one;
  one_copy[0].offset = 0;
  EXPECT_EQ(one[0].offset, 7u * 64);
  InlineVector<Extent> moved = std::move(copy);
  EXPECT_TRUE(copy.empty());  // NOLINT(bugprone-use-after-move): the promise under test
  EXPECT_EQ(moved.size(), 3u);
  EXPECT_EQ(moved[0].offset, 4096u);
  moved = one;
  EXPECT_EQ(Offsets(moved), std::vector<uint64_t>{7 * 64});
  moved = moved;  // self-assignment keeps the elements
  EXPECT_EQ(moved.size(), 1u);
  EXPECT_EQ(InlineVector<Extent>(std::vector<Extent>{At(0), At(64)}).ToVector().size(), 2u);
}

template <typename T>
std::string Encode(T value) {
  master::Encoder enc;
  enc(value);
  return enc.Take();
}

// The snapshot and the ordered history keep their format: each field that moved from
// std::vector (or two plain integers) encodes to the bytes it did.
TEST(CompactFieldsTest, EncodeAsTheFieldsTheyReplaced) {
  std::vector<Extent> extents = {At(0), At(64)};
  EXPECT_EQ(Encode(InlineVector<Extent>(extents)), Encode(extents));
  EXPECT_EQ(Encode(InlineVector<Extent>(std::vector<Extent>{At(64)})),
            Encode(std::vector<Extent>{At(64)}));
  std::vector<ReadLock> locks = {{"a", 1, 5}, {"b", 2, 6}};
  EXPECT_EQ(Encode(RareVector<ReadLock>(locks)), Encode(locks));
  EXPECT_EQ(Encode(RareVector<ReadLock>()), Encode(std::vector<ReadLock>{}));

  ObjectMeta meta;
  meta.committed = master::Version{};
  meta.committed->size = 100;
  meta.committed->replicas.push_back(At(64));
  meta.committed->disk.push_back(DiskReplica{"node", 9, 100, 3});
  meta.TakeReadLock("reader", 77);
  meta.TakeReadLock("reader", 77);
  meta.set_soft_pin(master::SoftPin{1234, 600});
  meta.last_access_ms = 99;
  meta.queue_stamp = 5;

  // The layout before: vectors, and the soft pin as two integers after hard_pinned.
  master::Encoder old;
  old(meta.committed->size); old(meta.committed->checksum); old(meta.committed->gen);
  std::vector<Extent> replicas = {At(64)};
  old(replicas);
  std::vector<DiskReplica> disk = {DiskReplica{"node", 9, 100, 3}};
  old(disk);
  old(meta.committed->offload_declined); old(meta.committed->persistence);
  old(meta.committed->want_replicas);
  std::string prefix = "\x01" + old.Take();
  master::Encoder rest;
  std::optional<master::PendingWrite> no_pending;
  std::optional<master::Demotion> no_demotion;
  std::optional<master::Promotion> no_promotion;
  rest(no_pending); rest(no_demotion); rest(no_promotion);
  std::vector<ReadLock> readers = {{"reader", 2, 77}};
  bool hard_pinned = meta.hard_pinned;
  rest(readers); rest(hard_pinned);
  int64_t until = 1234, ttl = 600;
  rest(until); rest(ttl);
  int64_t last_access_ms = meta.last_access_ms;
  uint8_t reads = meta.reads;
  bool in_main = meta.in_main;
  rest(last_access_ms); rest(meta.queue_stamp); rest(reads); rest(in_main);
  const std::string bytes = Encode(meta);
  EXPECT_EQ(bytes, prefix + rest.Take());

  ObjectMeta decoded;
  master::Decoder dec(bytes);
  dec(decoded);
  ASSERT_TRUE(dec.ok() && dec.done());
  ASSERT_TRUE(decoded.soft_pin());
  EXPECT_EQ(decoded.soft_pin()->until_ms, 1234);
  EXPECT_EQ(decoded.soft_pin()->ttl_ms, 600);
  ASSERT_EQ(decoded.readers().size(), 1u);
  EXPECT_EQ(decoded.readers()[0].count, 2u);
  EXPECT_EQ(Encode(decoded), bytes);

  ObjectMeta unpinned;
  const std::string plain = Encode(unpinned);
  ObjectMeta plain_decoded;
  master::Decoder plain_dec(plain);
  plain_dec(plain_decoded);
  ASSERT_TRUE(plain_dec.ok());
  EXPECT_FALSE(plain_decoded.soft_pin()) << "(0, 0) is no pin";
  EXPECT_FALSE(plain_decoded.has_rare_block()) << "nothing rare: nothing allocated";
}

TEST(CompactFieldsTest, OptionalVersionBehavesAsOptional) {
  static_assert(sizeof(master::OptionalVersion) == sizeof(master::Version));
  master::OptionalVersion v;
  EXPECT_FALSE(v);
  EXPECT_FALSE(v.has_value());
  master::Version version;
  version.size = 5;
  version.replicas.push_back(At(64));
  version.replicas.push_back(At(128));
  v = version;
  ASSERT_TRUE(v);
  EXPECT_EQ(v->size, 5u);
  EXPECT_EQ((*v).replicas.size(), 2u);
  master::OptionalVersion copy = v;
  EXPECT_TRUE(copy);
  copy->size = 6;
  EXPECT_EQ(v->size, 5u) << "copies are deep";
  v.reset();
  EXPECT_FALSE(v);
  EXPECT_TRUE(v->replicas.empty()) << "reset lets the replica list go";
  master::OptionalVersion none = std::nullopt;
  EXPECT_FALSE(none);
  none.emplace().gen = 9;
  EXPECT_TRUE(none);
  EXPECT_EQ(none->gen, 9u);
  none = std::nullopt;
  EXPECT_FALSE(none);
  master::OptionalVersion moved = std::move(copy);
  EXPECT_TRUE(moved);
  EXPECT_EQ(moved->size, 6u);

  // Encodes as the std::optional<Version> it replaced, held or not, and decodes back.
  std::optional<master::Version> plain = *moved;
  EXPECT_EQ(Encode(moved), Encode(plain));
  EXPECT_EQ(Encode(master::OptionalVersion()), Encode(std::optional<master::Version>()));
  master::OptionalVersion decoded;
  const std::string bytes = Encode(moved);
  master::Decoder dec(bytes);
  dec(decoded);
  ASSERT_TRUE(dec.ok() && dec.done());
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded->size, 6u);
  EXPECT_EQ(decoded->replicas.size(), 2u);
  // The held flag belongs to the slot: assigning a version through it keeps it held, and a
  // version copied out of it is a plain value.
  *moved = master::Version{};
  EXPECT_TRUE(moved) << "*committed = v keeps the version held";
  moved->size = 6;
  master::Version out = *moved;
  master::OptionalVersion empty;
  *empty = out;
  EXPECT_FALSE(empty) << "assigning through an empty slot does not make it held";
  master::OptionalVersion assigned;
  assigned = moved;
  EXPECT_TRUE(assigned);
  assigned = master::OptionalVersion();
  EXPECT_FALSE(assigned);
}

std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

// The same records encoded by a build of a0e38e5, before these fields changed type (std::vector,
// std::optional<Version>, the soft pin as two integers), less each extent's allocator handle,
// which snapshot format 9 dropped (allocations have no node): the codec's own templates cannot
// vouch for themselves.
TEST(CompactFieldsTest, EncodeToTheBytesOfTheBuildBefore) {
  ObjectMeta meta;
  meta.committed = master::Version{};
  meta.committed->size = 100;
  meta.committed->replicas.push_back(Extent{1, 64, 100});
  meta.committed->disk.push_back(DiskReplica{"node", 9, 100, 3});
  meta.TakeReadLock("reader", 77);
  meta.TakeReadLock("reader", 77);
  meta.set_soft_pin(master::SoftPin{1234, 600});
  meta.last_access_ms = 99;
  meta.queue_stamp = 5;
  EXPECT_EQ(Hex(Encode(meta)),
            "016400000101406401046e6f64650964030000000000000106726561646572029a0100a413b009c6"
            "010a0000");

  ObjectMeta two;
  two.committed = master::Version{};
  two.committed->size = 7;
  two.committed->gen = 3;
  two.committed->replicas.push_back(Extent{1, 0, 7});
  two.committed->replicas.push_back(Extent{2, 128, 7});
  two.in_main = true;
  EXPECT_EQ(Hex(Encode(two)), "010700030201000702800107000000000000000000000000000001");
}

// ObjectMeta keeps its access time in 48 bits: every value a master makes comes back, encodes
// as the plain field did, and a decode refuses what does not fit instead of cutting it. An
// extent is three plain fields (no handle since format 9): every value a master makes comes
// back, and a decode refuses an offset past any segment or a length past any object.
TEST(CompactFieldsTest, PackedFieldsKeepEveryValueTheyTake) {
  for (uint64_t offset : {uint64_t{0}, master::kMaxSegmentBytes - 64, master::kMaxSegmentBytes}) {
    for (uint64_t length : {uint64_t{1}, master::kMaxObjectBytes}) {
      const Extent e{7, offset, length};
      master::Encoder plain;
      uint64_t id = 7;
      plain(id); plain(offset); plain(length);
      const std::string bytes = Encode(e);
      EXPECT_EQ(bytes, plain.Take());
      Extent back;
      master::Decoder dec(bytes);
      dec(back);
      ASSERT_TRUE(dec.ok() && dec.done());
      EXPECT_EQ(back, e);
    }
  }
  for (auto [offset, length] : {std::pair{master::kMaxSegmentBytes + 1, uint64_t{1}},
                                std::pair{uint64_t{0}, master::kMaxObjectBytes + 1},
                                std::pair{uint64_t{0}, ~uint64_t{0}}}) {
    master::Encoder plain;
    uint64_t id = 7;
    plain(id); plain(offset); plain(length);
    const std::string bytes = plain.Take();
    Extent back;
    master::Decoder dec(bytes);
    dec(back);
    EXPECT_FALSE(dec.ok()) << "offset " << offset << " length " << length;
  }

  for (uint64_t size : {master::kMaxObjectBytes, master::kMaxObjectBytes + 1}) {
    master::Version v;
    v.size = size;
    const std::string bytes = Encode(v);
    master::Version back;
    master::Decoder dec(bytes);
    dec(back);
    EXPECT_EQ(dec.ok(), size <= master::kMaxObjectBytes) << "a version of " << size << " bytes";
  }

  const int64_t edge = (int64_t{1} << (ObjectMeta::kAccessBits - 1)) - 1;
  for (int64_t ms : {int64_t{0}, int64_t{-5}, int64_t{1'800'000'000'000}, edge, -edge - 1}) {
    ObjectMeta meta;
    meta.last_access_ms = ms;
    meta.reads = master::kMaxQueueReads;
    meta.in_main = true;
    meta.hard_pinned = true;
    EXPECT_EQ(meta.last_access_ms, ms);
    const std::string bytes = Encode(meta);
    ObjectMeta back;
    master::Decoder dec(bytes);
    dec(back);
    ASSERT_TRUE(dec.ok() && dec.done());
    EXPECT_EQ(back.last_access_ms, ms);
    EXPECT_EQ(back.reads, master::kMaxQueueReads);
    EXPECT_TRUE(back.in_main && back.hard_pinned);
  }
  for (int64_t ms : {edge + 1, -edge - 2, INT64_MAX}) {
    // The bytes a record of that time would have: an encode of it with the time patched in.
    ObjectMeta meta;
    meta.last_access_ms = 123456789012;
    std::string bytes = Encode(meta);
    master::Encoder patched_time;
    patched_time(ms);
    master::Encoder old_time;
    int64_t old_ms = 123456789012;
    old_time(old_ms);
    const std::string from = old_time.Take();
    const size_t at = bytes.find(from);
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, from.size(), patched_time.Take());
    ObjectMeta back;
    master::Decoder dec(bytes);
    dec(back);
    EXPECT_FALSE(dec.ok()) << ms;
  }
}

// The point of the types: the record the master keeps for every key (issue 23, bytes/object).
TEST(CompactFieldsTest, ObjectMetaIsSmall) {
  EXPECT_LE(sizeof(ObjectMeta), 96u);
  EXPECT_EQ(sizeof(Extent), 24u);
  ObjectMeta meta;
  EXPECT_FALSE(meta.IsSoftPinned(0));
  meta.set_soft_pin(master::SoftPin{10, 5});
  EXPECT_TRUE(meta.IsSoftPinned(9));
  EXPECT_FALSE(meta.IsSoftPinned(10));
}

}  // namespace
}  // namespace granary
