// master/state/key_ref_set.h - a set of references to the keys of a shard's objects map, one
// 8-byte slot an entry.
//
// Why: a shard's side indexes (keys with a pending write, being demoted or promoted; the offload
// and re-replication planners' candidates) list keys its objects map holds. As
// std::unordered_set<std::string_view> an entry cost ~56 bytes (a 48-byte node and a bucket), and
// the offload index lists nearly every object once a disk registers: 56 of the 350 bytes an
// object cost at 10M objects (issue 23). Here an entry is the key's ObjectKey block pointer with
// the top 16 bits of the key's hash in the pointer's unused top bits, in an open-addressing table
// (linear probing from the hash's top bits, at most 3/4 full counting erased slots): 11-21 bytes
// an entry while it grows, at most 32 after any insert (an insert into a table under 1/4 full
// shrinks it), and a probe reads a key's bytes only when the 16 bits match.
//
// Promise: behaves as std::unordered_set<std::string_view> of the keys' bytes for the calls it
// offers. Iteration visits each entry once in an unspecified order, and erase(iterator) during it
// neither skips nor repeats an entry: an erased slot is marked, never filled by a moved entry, and
// only insert rehashes. Ownership: owns its table, not the keys: an entry refers to its
// ObjectKey's block, so a key leaves every set before its ObjectKey is destroyed or assigned to
// (the bytes never move: ObjectKey's promise). Thread safety: as a plain value.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <memory>
#include <string_view>
#include <utility>

#include "master/state/object_key.h"

namespace granary::master {

class KeyRefSet {
 public:
  class iterator {
   public:
    using value_type = std::string_view;
    using reference = std::string_view;
    using pointer = void;
    using difference_type = std::ptrdiff_t;
    using iterator_category = std::forward_iterator_tag;

    iterator() = default;
    std::string_view operator*() const { return ObjectKey::ViewOfBlock(BlockOf(*slot_)); }
    iterator& operator++() {
      ++slot_;
      SkipFree();
      return *this;
    }
    bool operator==(const iterator& other) const { return slot_ == other.slot_; }

   private:
    friend class KeyRefSet;
    iterator(const uint64_t* slot, const uint64_t* end) : slot_(slot), end_(end) { SkipFree(); }
    void SkipFree() {
      while (slot_ != end_ && *slot_ <= kErased) ++slot_;
    }
    const uint64_t* slot_ = nullptr;
    const uint64_t* end_ = nullptr;
  };

  KeyRefSet() = default;
  KeyRefSet(const KeyRefSet&) = delete;  // two sets naming one block are two owners' business
  KeyRefSet& operator=(const KeyRefSet&) = delete;
  KeyRefSet(KeyRefSet&& other) noexcept { *this = std::move(other); }
  KeyRefSet& operator=(KeyRefSet&& other) noexcept {
    if (this != &other) {
      slots_ = std::move(other.slots_);
      capacity_ = std::exchange(other.capacity_, 0);
      bits_ = std::exchange(other.bits_, 0);
      size_ = std::exchange(other.size_, 0);
      used_ = std::exchange(other.used_, 0);
    }
    return *this;
  }

  // Lists `key` (not empty) by its block; false if its bytes were listed already.
  bool insert(const ObjectKey& key) {
    const auto address = reinterpret_cast<uintptr_t>(key.block());
    if (address == 0 || (address >> kTagShift) != 0) {
      std::fprintf(stderr, "KeyRefSet: a key block at %p cannot be listed\n", key.block());
      std::abort();  // an empty key, or an address this 64-bit layout cannot hold: a bug
    }
    const std::string_view view = key.view();
    const uint64_t hash = Hash(view);
    if ((used_ + 1) * 4 > capacity_ * 3 || (capacity_ > 16 && size_ * 4 < capacity_)) {
      Rehash(size_ + 1);
    }
    const uint64_t tag = hash >> kTagShift;
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
      if ((slot >> kTagShift) == tag && ObjectKey::ViewOfBlock(BlockOf(slot)) == view) {
        return false;
      }
    }
    if (free == capacity_) {
      free = i;
      ++used_;
    }
    slots_[free] = (tag << kTagShift) | address;
    ++size_;
    return true;
  }

  size_t erase(std::string_view key) {
    const size_t i = Find(key);
    if (i == capacity_) return 0;
    EraseSlot(i);
    return 1;
  }
  // Erases the entry at `it` and returns the next one.
  iterator erase(iterator it) {
    EraseSlot(static_cast<size_t>(it.slot_ - slots_.get()));
    return ++it;
  }

  bool contains(std::string_view key) const { return Find(key) != capacity_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear() { *this = KeyRefSet(); }
  // The table's own bytes (the keys are the objects map's).
  size_t table_bytes() const { return capacity_ * sizeof(uint64_t); }

  iterator begin() const { return iterator(slots_.get(), slots_.get() + capacity_); }
  iterator end() const {
    return iterator(slots_.get() + capacity_, slots_.get() + capacity_);
  }

 private:
  static constexpr uint64_t kEmpty = 0;
  static constexpr uint64_t kErased = 1;  // no block lives at address 1
  static constexpr int kTagShift = 48;    // user-space addresses fit in 48 bits
  static constexpr uint64_t kAddressMask = (uint64_t{1} << kTagShift) - 1;

  static const char* BlockOf(uint64_t slot) {
    return reinterpret_cast<const char*>(static_cast<uintptr_t>(slot & kAddressMask));
  }
  static uint64_t Hash(std::string_view key) {
    static_assert(sizeof(size_t) == sizeof(uint64_t), "64-bit only: the tag is 16 hash bits");
    return std::hash<std::string_view>{}(key);
  }
  // Probing starts at the hash's top bits, so up to 2^16 slots a rehash needs only the tag.
  size_t Home(uint64_t hash) const { return static_cast<size_t>(hash >> (64 - bits_)); }

  size_t Find(std::string_view key) const {
    if (size_ == 0) return capacity_;
    const uint64_t hash = Hash(key);
    const uint64_t tag = hash >> kTagShift;
    const size_t mask = capacity_ - 1;
    for (size_t i = Home(hash);; i = (i + 1) & mask) {
      const uint64_t slot = slots_[i];
      if (slot == kEmpty) return capacity_;
      if (slot != kErased && (slot >> kTagShift) == tag &&
          ObjectKey::ViewOfBlock(BlockOf(slot)) == key) {
        return i;
      }
    }
  }

  // Marks slot i erased; where the probe sequence ends right after it, empties it and the erased
  // run before it instead, so a set that empties itself out needs no rehash to be fast again.
  void EraseSlot(size_t i) {
    const size_t mask = capacity_ - 1;
    --size_;
    if (slots_[(i + 1) & mask] != kEmpty) {
      slots_[i] = kErased;
      return;
    }
    slots_[i] = kEmpty;
    --used_;
    for (size_t j = (i - 1) & mask; slots_[j] == kErased; j = (j - 1) & mask) {
      slots_[j] = kEmpty;
      --used_;
    }
  }

  // A table for `want` entries, more than a quarter and at most half full (or 16 slots), without
  // erased slots.
  void Rehash(size_t want) {
    size_t capacity = 16;
    while (capacity < want * 2) capacity *= 2;
    std::unique_ptr<uint64_t[]> old = std::move(slots_);
    const size_t old_capacity = capacity_;
    slots_ = std::make_unique<uint64_t[]>(capacity);  // zeroed: every slot kEmpty
    capacity_ = capacity;
    bits_ = std::countr_zero(capacity);
    used_ = size_;
    const size_t mask = capacity_ - 1;
    for (size_t k = 0; k < old_capacity; ++k) {
      const uint64_t slot = old[k];
      if (slot <= kErased) continue;
      const uint64_t hash = bits_ <= 64 - kTagShift
                                ? slot & ~kAddressMask
                                : Hash(ObjectKey::ViewOfBlock(BlockOf(slot)));
      size_t i = Home(hash);
      while (slots_[i] != kEmpty) i = (i + 1) & mask;
      slots_[i] = slot;
    }
  }

  std::unique_ptr<uint64_t[]> slots_;
  size_t capacity_ = 0;  // a power of two, or 0
  int bits_ = 0;         // log2(capacity_)
  size_t size_ = 0;      // entries
  size_t used_ = 0;      // entries and erased slots: what probes walk over
};

}  // namespace granary::master
