// common/int_map.h - a flat hash map from an integer key to a uint32_t, for tables the master
// keeps by the million: the allocator's free blocks by their edges (OffsetAllocator) and the
// s3fifo ghost's fingerprints (GhostIndex).
//
// Promise: behaves as std::unordered_map<Key, uint32_t> for the calls it offers, for any key but
// kEmpty (which marks a free slot: a caller never makes it) and any value. Find, Set and Erase
// take expected O(1): open addressing, linear probing from the key's Fibonacci hash, at most 3/4
// full; an erase moves the entries behind it back (no tombstones). A slot is sizeof(Key) + 4
// bytes (keys and values in separate arrays). Its memory follows its count, not its peak: after
// any Set the table is at least 1/4 full (3/8 after one that grew it), and an Erase that leaves
// it under 1/4 full shrinks it. Iteration order is not part of the promise: ForEach visits each
// entry once, with nothing changed meanwhile.
// Ownership: values only; copyable and movable. Thread safety: as a plain value.
#pragma once

#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

namespace granary {

template <typename Key, Key kEmpty>
class IntMap {
  static_assert(std::is_unsigned_v<Key>);

 public:
  std::optional<uint32_t> Find(Key key) const {
    const std::size_t i = Slot(key);
    if (i == kNone) return std::nullopt;
    return values_[i];
  }

  // Keeps `value` for `key`, replacing what it had.
  void Set(Key key, uint32_t value) {
    assert(key != kEmpty);
    if ((count_ + 1) * 4 > keys_.size() * 3) Resize(count_ + 1);
    std::size_t i = Home(key);
    for (; keys_[i] != kEmpty; i = (i + 1) & mask_) {
      if (keys_[i] == key) {
        values_[i] = value;
        return;
      }
    }
    keys_[i] = key;
    values_[i] = value;
    ++count_;
  }

  // Forgets `key`; false if it held none.
  bool Erase(Key key) {
    std::size_t hole = Slot(key);
    if (hole == kNone) return false;
    // Shift back each later entry of the run whose home does not lie cyclically within
    // (hole, its slot], where the probe from its home would not pass the hole.
    for (std::size_t j = (hole + 1) & mask_; keys_[j] != kEmpty; j = (j + 1) & mask_) {
      const std::size_t home = Home(keys_[j]);
      const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (stays) continue;
      keys_[hole] = keys_[j];
      values_[hole] = values_[j];
      hole = j;
    }
    keys_[hole] = kEmpty;
    --count_;
    if (keys_.size() > kMinSlots && count_ * 4 < keys_.size()) Resize(count_);
    return true;
  }

  std::size_t size() const { return count_; }
  std::size_t slot_count() const { return keys_.size(); }
  std::size_t table_bytes() const { return keys_.size() * (sizeof(Key) + sizeof(uint32_t)); }
  template <typename Fn>  // fn(key, value)
  void ForEach(Fn&& fn) const {
    for (std::size_t i = 0; i < keys_.size(); ++i) {
      if (keys_[i] != kEmpty) fn(keys_[i], values_[i]);
    }
  }
  void clear() { *this = IntMap(); }

 private:
  static constexpr std::size_t kNone = SIZE_MAX;
  static constexpr std::size_t kMinSlots = 16;

  std::size_t Home(Key key) const {
    return static_cast<std::size_t>((uint64_t{key} * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  std::size_t Slot(Key key) const {
    if (count_ == 0 || key == kEmpty) return kNone;
    for (std::size_t i = Home(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return i;
      if (keys_[i] == kEmpty) return kNone;
    }
  }
  // A table for `want` entries at most half full.
  void Resize(std::size_t want) {
    std::size_t slots = kMinSlots;
    while (slots < want * 2) slots *= 2;
    std::vector<Key> keys(slots, kEmpty);
    std::vector<uint32_t> values(slots, 0);
    keys.swap(keys_);
    values.swap(values_);
    mask_ = slots - 1;
    shift_ = 64 - std::countr_zero(slots);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == kEmpty) continue;
      std::size_t j = Home(keys[i]);
      while (keys_[j] != kEmpty) j = (j + 1) & mask_;
      keys_[j] = keys[i];
      values_[j] = values[i];
    }
  }

  std::vector<Key> keys_;  // kEmpty where no entry is
  std::vector<uint32_t> values_;
  std::size_t count_ = 0;
  std::size_t mask_ = 0;  // slots - 1 (a power of two)
  int shift_ = 63;        // 64 - log2(slots): Home takes the product's top bits
};

}  // namespace granary
