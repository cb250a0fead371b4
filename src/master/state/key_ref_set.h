// master/state/key_ref_set.h - a set of references to the keys of a shard's objects, one 8-byte
// slot an entry.
//
// Why: a shard's side indexes (keys with a pending write, being demoted or promoted; the offload
// and re-replication planners' candidates) list keys its objects table holds. As
// std::unordered_set<std::string_view> an entry cost ~56 bytes (a 48-byte node and a bucket), and
// the offload index lists nearly every object once a disk registers: 56 of the 350 bytes an
// object cost at 10M objects (issue 23). Here an entry is the key's block pointer in a
// TaggedRefTable (tagged_ref_table.h): 11-21 bytes an entry while it grows.
//
// Promise: behaves as std::unordered_set<std::string_view> of the keys' bytes for the calls it
// offers. Iteration visits each entry once in an unspecified order, and erase(iterator) during it
// neither skips nor repeats an entry; only insert rehashes. Ownership: owns its table, not the
// keys: an entry refers to its key's block (ObjectKey's or an ObjectTable entry's), so a key
// leaves every set before its block is freed (the bytes never move). Thread safety: as a plain
// value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

#include "master/state/object_key.h"
#include "master/state/tagged_ref_table.h"

namespace granary::master {

class KeyRefSet {
  struct BlockKey {
    static std::string_view Of(const char* block) { return ObjectKey::ViewOfBlock(block); }
  };
  using Table = TaggedRefTable<const char, BlockKey>;

 public:
  class iterator {
   public:
    using value_type = std::string_view;
    using reference = std::string_view;
    using pointer = void;
    using difference_type = std::ptrdiff_t;
    using iterator_category = std::forward_iterator_tag;

    iterator() = default;
    std::string_view operator*() const { return ObjectKey::ViewOfBlock(table_->At(slot_)); }
    iterator& operator++() {
      slot_ = table_->NextUsed(slot_ + 1);
      return *this;
    }
    bool operator==(const iterator& other) const { return slot_ == other.slot_; }

   private:
    friend class KeyRefSet;
    iterator(const Table* table, size_t slot) : table_(table), slot_(table->NextUsed(slot)) {}
    const Table* table_ = nullptr;
    size_t slot_ = 0;
  };

  KeyRefSet() = default;

  // Lists `key` (not empty; an ObjectKey or an ObjectTable entry's key) by its block; false if
  // its bytes were listed already.
  template <typename Key>
  bool insert(const Key& key) {
    return table_.Insert(key.block(), key.view()).second;
  }
  size_t erase(std::string_view key) {
    const size_t i = table_.Find(key);
    if (i == table_.capacity()) return 0;
    table_.EraseSlot(i);
    return 1;
  }
  // Erases the entry at `it` and returns the next one.
  iterator erase(iterator it) {
    table_.EraseSlot(it.slot_);
    return ++it;
  }

  bool contains(std::string_view key) const { return table_.Find(key) != table_.capacity(); }
  size_t size() const { return table_.size(); }
  bool empty() const { return table_.size() == 0; }
  void clear() { table_ = Table(); }
  // The table's own bytes (the keys are the objects table's).
  size_t table_bytes() const { return table_.table_bytes(); }

  iterator begin() const { return iterator(&table_, 0); }
  iterator end() const { return iterator(&table_, table_.capacity()); }

 private:
  Table table_;
};

}  // namespace granary::master
