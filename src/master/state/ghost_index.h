// master/state/ghost_index.h - s3fifo's ghost index: a key's fingerprint -> the newest ghost
// entry naming it.
//
// Why: the ghost remembers eviction_ghost_ratio (4) x the objects held, so in a full cache it
// holds more entries than the master has objects. A slot is a 32-bit fingerprint of the key and
// the low 32 bits of the entry's number, 8 bytes, in an open-addressing table (linear probing
// from the fingerprint's low bits, at most 3/4 full; a set into a table under 1/4 full shrinks
// it): 11-21 bytes an entry while it grows, at most 32 after any set. With 64-bit hashes and
// numbers a slot was 16 bytes, and a ghost entry ~37 bytes with its FIFO's, ~150 an object held
// (issue 23). A fingerprint is not the key: two keys may share one, and the ghost then answers
// for both (an admission hint, never data; GhostFingerprint says how rare).
// Promise: behaves as std::unordered_map<uint32_t, uint32_t> for the calls it offers, for any
// key but 0 (GhostFingerprint never makes it) and any value. Erase moves entries back (no
// tombstones), so it keeps no iterator valid: ForEach visits each entry once, with nothing
// changed meanwhile.
// Ownership: owns its table. Thread safety: as a plain value (the stripe's mutex guards it).
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace granary::master {

// A key's fingerprint in the ghost of stripe `hash >> 60`: the 32 bits below the stripe's (the
// shards take the low bits), never 0. With the stripe, 36 bits tell keys apart: a ghost of 40M
// entries (10M objects held) answers for a key it never saw about once in 1,700 lookups.
inline uint32_t GhostFingerprint(uint64_t hash) {
  const auto fp = static_cast<uint32_t>(hash >> 28);
  return fp != 0 ? fp : 1;
}

class GhostIndex {
 public:
  // Sets `fp`'s entry, listing it if new.
  void Set(uint32_t fp, uint32_t entry) {
    assert(fp != 0);
    if ((size_ + 1) * 4 > slots_.size() * 3 || (slots_.size() > 16 && size_ * 4 < slots_.size())) {
      Rehash(size_ + 1);
    }
    const size_t mask = slots_.size() - 1;
    size_t i = fp & mask;
    while (slots_[i].fp != 0 && slots_[i].fp != fp) i = (i + 1) & mask;
    if (slots_[i].fp == 0) ++size_;
    slots_[i] = {fp, entry};
  }
  std::optional<uint32_t> Find(uint32_t fp) const {
    const size_t i = Slot(fp);
    if (i == kNone) return std::nullopt;
    return slots_[i].entry;
  }
  bool Erase(uint32_t fp) {
    size_t i = Slot(fp);
    if (i == kNone) return false;
    // Backward shift: an entry after the hole moves into it unless its home lies cyclically
    // within (hole, its slot], where the probe from its home would not pass the hole.
    const size_t mask = slots_.size() - 1;
    for (size_t j = (i + 1) & mask; slots_[j].fp != 0; j = (j + 1) & mask) {
      const size_t home = slots_[j].fp & mask;
      const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {};
    --size_;
    return true;
  }
  size_t size() const { return size_; }
  size_t table_bytes() const { return slots_.size() * sizeof(Entry); }
  template <typename Fn>  // fn(fp, entry)
  void ForEach(Fn&& fn) const {
    for (const Entry& e : slots_) {
      if (e.fp != 0) fn(e.fp, e.entry);
    }
  }

 private:
  struct Entry {
    uint32_t fp = 0;  // 0: an empty slot
    uint32_t entry = 0;
  };
  static_assert(sizeof(Entry) == 8);
  static constexpr size_t kNone = SIZE_MAX;

  size_t Slot(uint32_t fp) const {
    if (size_ == 0 || fp == 0) return kNone;
    const size_t mask = slots_.size() - 1;
    for (size_t i = fp & mask;; i = (i + 1) & mask) {
      if (slots_[i].fp == 0) return kNone;
      if (slots_[i].fp == fp) return i;
    }
  }
  void Rehash(size_t want) {
    size_t capacity = 16;
    while (capacity < want * 2) capacity *= 2;
    std::vector<Entry> old = std::move(slots_);
    slots_.assign(capacity, Entry{});
    const size_t mask = capacity - 1;
    for (const Entry& e : old) {
      if (e.fp == 0) continue;
      size_t i = e.fp & mask;
      while (slots_[i].fp != 0) i = (i + 1) & mask;
      slots_[i] = e;
    }
  }

  std::vector<Entry> slots_;
  size_t size_ = 0;
};

}  // namespace granary::master
