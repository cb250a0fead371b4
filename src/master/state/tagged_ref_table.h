// master/state/tagged_ref_table.h - an open-addressing table of pointers to blocks that hold
// their own key, one 8-byte slot an entry: under the shards' objects (ObjectTable) and their
// side indexes (KeyRefSet).
//
// Why: node-based maps and sets cost a node (a malloc chunk with a next pointer and a cached
// hash) and a bucket per entry; the master holds tens of millions of objects (issue 23). Here a
// slot is the block's address with the top 16 bits of the key's hash in the address's unused top
// bits; probing is linear from the hash's top bits, at most 3/4 of the slots in use counting
// erased ones. A probe reads a block only when its 16 bits match. Up to 2^16 slots they are the
// hash's top bits, which also pick the home slot, so a rehash reads no block, and among entries
// of one home they differ in 16 - log2(slots) bits (at 2^14 slots, a shard at 10M objects, a
// lookup reads about 0.1 blocks too many); beyond 2^16 slots they are bits apart from the
// home's, and a rehash reads every block. A table holds 3/8-3/4 as many entries as slots while
// it grows (11-21 bytes an entry); an insert into a table under 1/4 full shrinks it.
//
// Promise: a set of distinct keys, each read from its block by KeyOf, looked up by the key's
// bytes. Slot indices visit each entry once in an unspecified order; erasing a slot neither moves
// another entry nor ends such a walk: an erased slot is marked (or emptied with the marked run
// before it when the probe sequence ends there), never filled by a moved entry. Only Insert
// rehashes, which moves slots, never blocks.
// Ownership: holds the pointers, not the blocks: a block leaves the table before it is freed.
// Thread safety: as a plain value (the caller synchronises).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string_view>
#include <utility>

namespace granary::master {

// KeyOf: a type with `static std::string_view Of(const Block*)`.
template <typename Block, typename KeyOf>
class TaggedRefTable {
 public:
  TaggedRefTable() = default;
  TaggedRefTable(const TaggedRefTable&) = delete;  // two tables naming one block: two owners
  TaggedRefTable& operator=(const TaggedRefTable&) = delete;
  TaggedRefTable(TaggedRefTable&& other) noexcept { *this = std::move(other); }
  TaggedRefTable& operator=(TaggedRefTable&& other) noexcept {
    if (this != &other) {
      slots_ = std::move(other.slots_);
      capacity_ = std::exchange(other.capacity_, 0);
      bits_ = std::exchange(other.bits_, 0);
      size_ = std::exchange(other.size_, 0);
      used_ = std::exchange(other.used_, 0);
    }
    return *this;
  }

  static uint64_t Hash(std::string_view key) {
    static_assert(sizeof(size_t) == sizeof(uint64_t), "64-bit only: the tag is 16 hash bits");
    return std::hash<std::string_view>{}(key);
  }

  // The slot holding `key` (whose Hash is `hash`), or capacity().
  size_t Find(std::string_view key) const { return Find(key, Hash(key)); }
  size_t Find(std::string_view key, uint64_t hash) const {
    if (size_ == 0) return capacity_;
    const uint64_t tag = Tag(hash);
    const size_t mask = capacity_ - 1;
    for (size_t i = Home(hash);; i = (i + 1) & mask) {  // ends: a quarter of the slots are empty
      const uint64_t slot = slots_[i];
      if (slot == kEmpty) return capacity_;
      if (slot != kErased && (slot >> kTagShift) == tag && KeyOf::Of(BlockOf(slot)) == key) {
        return i;
      }
    }
  }

  // Lists `block`, whose key is `key` (whose Hash is `hash`): its slot and true; or, if an entry
  // has that key already, that entry's slot and false (the table is unchanged but for a rehash).
  std::pair<size_t, bool> Insert(Block* block, std::string_view key) {
    return Insert(block, key, Hash(key));
  }
  std::pair<size_t, bool> Insert(Block* block, std::string_view key, uint64_t hash) {
    const auto address = reinterpret_cast<uintptr_t>(block);
    if (address <= kErased || (address >> kTagShift) != 0) {
      std::fprintf(stderr, "TaggedRefTable: a block at %p cannot be listed\n",
                   static_cast<const void*>(block));
      std::abort();  // an address this 64-bit layout cannot hold: a bug
    }
    if ((used_ + 1) * 4 > capacity_ * 3 || (capacity_ > 16 && size_ * 4 < capacity_)) {
      Rehash(size_ + 1);
    }
    const uint64_t tag = Tag(hash);
    const size_t mask = capacity_ - 1;
    size_t free = capacity_;
    size_t i = Home(hash);
    for (;; i = (i + 1) & mask) {  // ends: at least a quarter of the slots are empty
      const uint64_t slot = slots_[i];
      if (slot == kEmpty) break;
      if (slot == kErased) {
        if (free == capacity_) free = i;
        continue;
      }
      if ((slot >> kTagShift) == tag && KeyOf::Of(BlockOf(slot)) == key) return {i, false};
    }
    if (free == capacity_) {
      free = i;
      ++used_;
    }
    slots_[free] = (tag << kTagShift) | address;
    ++size_;
    return {free, true};
  }

  // Unlists the entry in slot i (which holds one).
  void EraseSlot(size_t i) {
    const size_t mask = capacity_ - 1;
    --size_;
    if (slots_[(i + 1) & mask] != kEmpty) {
      slots_[i] = kErased;
      return;
    }
    // The probe sequence ends right after it: empty it and the erased run before it instead, so
    // a table that empties itself out needs no rehash to be fast again.
    slots_[i] = kEmpty;
    --used_;
    for (size_t j = (i - 1) & mask; slots_[j] == kErased; j = (j - 1) & mask) {
      slots_[j] = kEmpty;
      --used_;
    }
  }

  // The block in slot i (i < capacity()), or null if the slot holds none.
  Block* At(size_t i) const { return slots_[i] > kErased ? BlockOf(slots_[i]) : nullptr; }
  // The first slot at or after i that holds an entry, or capacity().
  size_t NextUsed(size_t i) const {
    while (i < capacity_ && slots_[i] <= kErased) ++i;
    return i;
  }

  // For a batch of lookups, stage by stage: the slot a probe for `hash` starts at (to prefetch),
  // and the first block there with the hash's 16 bits (to prefetch; null if none before an
  // empty slot).
  const uint64_t* HomeSlot(uint64_t hash) const {
    return capacity_ ? &slots_[Home(hash)] : nullptr;
  }
  Block* FirstTagged(uint64_t hash) const {
    if (size_ == 0) return nullptr;
    const uint64_t tag = Tag(hash);
    const size_t mask = capacity_ - 1;
    for (size_t i = Home(hash);; i = (i + 1) & mask) {
      const uint64_t slot = slots_[i];
      if (slot == kEmpty) return nullptr;
      if (slot != kErased && (slot >> kTagShift) == tag) return BlockOf(slot);
    }
  }

  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  size_t table_bytes() const { return capacity_ * sizeof(uint64_t); }

 private:
  static constexpr uint64_t kEmpty = 0;
  static constexpr uint64_t kErased = 1;  // no block lives at address 1
  static constexpr int kTagShift = 48;    // user-space addresses fit in 48 bits
  static constexpr uint64_t kAddressMask = (uint64_t{1} << kTagShift) - 1;

  static Block* BlockOf(uint64_t slot) {
    return reinterpret_cast<Block*>(static_cast<uintptr_t>(slot & kAddressMask));
  }
  // Probing starts at the hash's top bits.
  size_t Home(uint64_t hash) const { return static_cast<size_t>(hash >> (64 - bits_)); }
  // The 16 bits a slot keeps. Up to 2^16 slots, the hash's top bits: they hold the home slot's,
  // so a rehash reads no key. Beyond, the low bits, apart from the home's, so that they tell
  // entries of one home apart too (a rehash there reads every key anyway).
  static constexpr int kTagBits = 64 - kTagShift;
  uint64_t Tag(uint64_t hash) const {
    return bits_ <= kTagBits ? hash >> kTagShift : hash & ((uint64_t{1} << kTagBits) - 1);
  }

  // A table for `want` entries, more than a quarter and at most half full (or 16 slots), without
  // erased slots.
  void Rehash(size_t want) {
    size_t capacity = 16;
    while (capacity < want * 2) capacity *= 2;
    // Made before the old one is let go: if it throws, the table is as it was.
    auto fresh = std::make_unique<uint64_t[]>(capacity);  // zeroed: every slot kEmpty
    std::unique_ptr<uint64_t[]> old = std::exchange(slots_, std::move(fresh));
    const size_t old_capacity = capacity_;
    const int old_bits = bits_;
    capacity_ = capacity;
    bits_ = std::countr_zero(capacity);
    used_ = size_;
    const size_t mask = capacity_ - 1;
    for (size_t k = 0; k < old_capacity; ++k) {
      const uint64_t slot = old[k];
      if (slot <= kErased) continue;
      // Both tables at most 2^16 slots: the tag is the hash's top bits, all a home needs.
      const uint64_t hash = old_bits <= kTagBits && bits_ <= kTagBits
                                ? slot & ~kAddressMask
                                : Hash(KeyOf::Of(BlockOf(slot)));
      size_t i = Home(hash);
      while (slots_[i] != kEmpty) i = (i + 1) & mask;
      slots_[i] = (Tag(hash) << kTagShift) | (slot & kAddressMask);
    }
  }

  std::unique_ptr<uint64_t[]> slots_;
  size_t capacity_ = 0;  // a power of two, or 0
  int bits_ = 0;         // log2(capacity_)
  size_t size_ = 0;      // entries
  size_t used_ = 0;      // entries and erased slots: what probes walk over
};

}  // namespace granary::master
