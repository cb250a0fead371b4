// master/state/ghost_index.h - s3fifo's ghost index: key hash -> the newest ghost entry naming it.
//
// Why: the ghost remembers eviction_ghost_ratio (4) x the objects held, so in a full cache it
// holds more entries than the master has objects. As std::unordered_map<uint64_t, uint64_t> an
// entry cost ~43 bytes (a 32-byte node and a bucket) beside the FIFO's: ~59 bytes a ghost entry,
// ~234 per object held (issue 23). Here a slot is the two words themselves, in an
// open-addressing table (linear probing from the hash's low bits, at most 3/4 full): 21-43
// bytes an entry while it grows, at most 64 after any set (a set into a table under 1/4 full
// shrinks it).
// Promise: behaves as std::unordered_map<uint64_t, uint64_t> for the calls it offers, any key
// and any value below 2^64 - 1 included. Erase moves entries back (no tombstones), so it keeps no
// iterator valid: ForEach visits each entry once, with nothing changed meanwhile.
// Ownership: owns its table. Thread safety: as a plain value (the stripe's mutex guards it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace granary::master {

class GhostIndex {
 public:
  // Sets `hash`'s entry, listing it if new.
  void Set(uint64_t hash, uint64_t entry) {
    if ((size_ + 1) * 4 > slots_.size() * 3 || (slots_.size() > 16 && size_ * 4 < slots_.size())) {
      Rehash(size_ + 1);
    }
    const size_t mask = slots_.size() - 1;
    size_t i = hash & mask;
    while (slots_[i].entry_plus_one != 0 && slots_[i].hash != hash) i = (i + 1) & mask;
    if (slots_[i].entry_plus_one == 0) ++size_;
    slots_[i] = {hash, entry + 1};
  }
  std::optional<uint64_t> Find(uint64_t hash) const {
    const size_t i = Slot(hash);
    if (i == kNone) return std::nullopt;
    return slots_[i].entry_plus_one - 1;
  }
  bool Erase(uint64_t hash) {
    size_t i = Slot(hash);
    if (i == kNone) return false;
    // Backward shift: an entry after the hole moves into it unless its home lies cyclically
    // within (hole, its slot], where the probe from its home would not pass the hole.
    const size_t mask = slots_.size() - 1;
    for (size_t j = (i + 1) & mask; slots_[j].entry_plus_one != 0; j = (j + 1) & mask) {
      const size_t home = slots_[j].hash & mask;
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
  template <typename Fn>  // fn(hash, entry)
  void ForEach(Fn&& fn) const {
    for (const Entry& e : slots_) {
      if (e.entry_plus_one != 0) fn(e.hash, e.entry_plus_one - 1);
    }
  }

 private:
  struct Entry {
    uint64_t hash = 0;
    uint64_t entry_plus_one = 0;  // 0: an empty slot
  };
  static constexpr size_t kNone = SIZE_MAX;

  size_t Slot(uint64_t hash) const {
    if (size_ == 0) return kNone;
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      if (slots_[i].entry_plus_one == 0) return kNone;
      if (slots_[i].hash == hash) return i;
    }
  }
  void Rehash(size_t want) {
    size_t capacity = 16;
    while (capacity < want * 2) capacity *= 2;
    std::vector<Entry> old = std::move(slots_);
    slots_.assign(capacity, Entry{});
    const size_t mask = capacity - 1;
    for (const Entry& e : old) {
      if (e.entry_plus_one == 0) continue;
      size_t i = e.hash & mask;
      while (slots_[i].entry_plus_one != 0) i = (i + 1) & mask;
      slots_[i] = e;
    }
  }

  std::vector<Entry> slots_;
  size_t size_ = 0;
};

}  // namespace granary::master
