// master/space/edge_map.h - the allocator's lookup of its free blocks by where they start or end.
//
// Promise: Find, Set and Erase take expected O(1) (open addressing, linear probing, at most 3/4
// full; an erase shifts the entries behind it back, so no marker slows later lookups). Keys are
// positions in kAlignment units, so below 2^58; UINT64_MAX marks an empty slot and is refused.
// The table shrinks when it falls below 1/8 full, so it follows the count of free blocks, not
// their peak. Iteration order is never exposed: the allocator's choices do not depend on it.
// Ownership: values only; copyable and movable like the allocator that holds it.
// Thread safety: NOT thread-safe; the allocator's caller holds the segment's lock.
#pragma once

#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace granary::master {

class EdgeMap {
 public:
  static constexpr uint32_t kAbsent = UINT32_MAX;

  // The value kept for `key`, or kAbsent.
  uint32_t Find(uint64_t key) const {
    if (count_ == 0) return kAbsent;
    for (std::size_t i = Home(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return values_[i];
      if (keys_[i] == kEmpty) return kAbsent;
    }
  }

  // Keeps `value` for `key`, replacing what it had.
  void Set(uint64_t key, uint32_t value) {
    assert(key != kEmpty);
    if ((count_ + 1) * 4 > keys_.size() * 3) Resize(keys_.empty() ? 16 : keys_.size() * 2);
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

  // Forgets `key`; a key it does not hold is a no-op.
  void Erase(uint64_t key) {
    if (count_ == 0) return;
    std::size_t hole = Home(key);
    for (; keys_[hole] != key; hole = (hole + 1) & mask_) {
      if (keys_[hole] == kEmpty) return;
    }
    // Shift back each later entry of the run whose home does not lie between the hole and it.
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
    if (keys_.size() > 16 && count_ * 8 < keys_.size()) Resize(keys_.size() / 2);
  }

  std::size_t size() const { return count_; }
  // What it holds memory for: 12 bytes a slot.
  std::size_t slot_count() const { return keys_.size(); }
  void clear() {
    keys_.clear();
    values_.clear();
    count_ = 0;
    mask_ = 0;
    shift_ = 63;
  }

 private:
  static constexpr uint64_t kEmpty = UINT64_MAX;

  std::size_t Home(uint64_t key) const {
    // Fibonacci hashing: neighbouring offsets spread over the table.
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void Resize(std::size_t slots) {
    std::vector<uint64_t> keys(slots, kEmpty);
    std::vector<uint32_t> values(slots, kAbsent);
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

  std::vector<uint64_t> keys_;    // kEmpty where no entry is
  std::vector<uint32_t> values_;  // beside keys_: 12 bytes a slot
  std::size_t count_ = 0;
  std::size_t mask_ = 0;    // slots - 1 (a power of two)
  int shift_ = 63;     // 64 - log2(slots): Home takes the product's top bits
};

}  // namespace granary::master
