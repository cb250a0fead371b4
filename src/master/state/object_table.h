// master/state/object_table.h - a shard's objects: each key's ObjectMeta and the key's bytes in
// one heap block, found through a TaggedRefTable.
//
// Why: as std::unordered_map<ObjectKey, ObjectMeta> an object cost a 128-byte node (next
// pointer, key pointer, ObjectMeta, cached hash), the key's own 64-byte block (55-byte keys) and
// 8-16 bytes of buckets: ~200 of its ~240 bytes at 10M objects (issue 23). Here it is one block,
// the 96-byte ObjectMeta then the key in ObjectKey's format (a 160-byte chunk for a 55-byte key),
// and one 8-byte slot at 3/8-3/4 load.
//
// Promise: behaves as std::unordered_map<ObjectKey, ObjectMeta> for the calls it offers, except:
// - an entry's key is an EntryKey, which reads as an ObjectKey does and cannot be copied out;
// - an insert may invalidate iterators, never a reference to an entry's ObjectMeta or a view of
//   its key: blocks never move, and each lives until its entry is erased;
// - erase(iterator) invalidates no other iterator, and an iteration that erases neither skips
//   nor repeats an entry.
// Ownership: owns the entries. Thread safety: as a plain value (the shard's mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "master/state/object_key.h"
#include "master/state/object_meta.h"
#include "master/state/tagged_ref_table.h"

namespace granary::master {

struct ObjectEntry;

// The key of an ObjectEntry: empty itself, its bytes follow the entry in the entry's block, in
// ObjectKey's format (so a KeyRefSet lists it by block() as it would an ObjectKey).
class EntryKey {
 public:
  EntryKey(const EntryKey&) = delete;  // its bytes are where it is: a copy would have none
  EntryKey& operator=(const EntryKey&) = delete;

  inline const char* block() const;
  std::string_view view() const { return ObjectKey::ViewOfBlock(block()); }
  size_t size() const { return view().size(); }
  const char* data() const { return view().data(); }
  operator std::string_view() const { return view(); }  // NOLINT: a key reads as its bytes
  std::string str() const { return std::string(view()); }
  friend bool operator==(const EntryKey& a, std::string_view b) { return a.view() == b; }

 private:
  friend struct ObjectEntry;
  EntryKey() = default;
};

// One object: `first` and `second` as in a std::unordered_map's value, so `auto& [key, meta]`
// and `it->second` read as they did. `first` takes no room: it sits at the entry's start (the
// Itanium ABI's place for an empty no_unique_address member; ObjectTableTest checks it), and
// EntryKey::block() counts from there.
struct ObjectEntry {
  explicit ObjectEntry(ObjectMeta meta) : second(std::move(meta)) {}
  [[no_unique_address]] EntryKey first;
  ObjectMeta second;
};
static_assert(std::is_empty_v<EntryKey> && sizeof(ObjectEntry) == sizeof(ObjectMeta));

inline const char* EntryKey::block() const {
  return reinterpret_cast<const char*>(this) + sizeof(ObjectEntry);
}

class ObjectTable {
  struct EntryKeyOf {
    static std::string_view Of(const ObjectEntry* e) { return e->first.view(); }
  };
  using Table = TaggedRefTable<ObjectEntry, EntryKeyOf>;
  struct Free {
    void operator()(ObjectEntry* e) const {
      e->~ObjectEntry();
      ::operator delete(e);
    }
  };

 public:
  // An entry made outside the table (a put makes its entries before it takes the lock).
  using EntryHandle = std::unique_ptr<ObjectEntry, Free>;
  static EntryHandle MakeEntry(std::string_view key, ObjectMeta meta = {}) {
    void* raw = ::operator new(sizeof(ObjectEntry) + ObjectKey::BlockSize(key));
    EntryHandle entry(new (raw) ObjectEntry(std::move(meta)));
    ObjectKey::WriteBlock(static_cast<char*>(raw) + sizeof(ObjectEntry), key);
    return entry;
  }

  template <bool kConst>
  class Iterator {
    using Entry = std::conditional_t<kConst, const ObjectEntry, ObjectEntry>;

   public:
    Iterator() = default;
    operator Iterator<true>() const { return Iterator<true>(table_, slot_); }  // NOLINT
    Entry& operator*() const { return *table_->At(slot_); }
    Entry* operator->() const { return table_->At(slot_); }
    Iterator& operator++() {
      slot_ = table_->NextUsed(slot_ + 1);
      return *this;
    }
    Iterator operator++(int) {
      Iterator before = *this;
      ++*this;
      return before;
    }
    friend bool operator==(const Iterator& a, const Iterator& b) { return a.slot_ == b.slot_; }

   private:
    friend class ObjectTable;
    friend class Iterator<!kConst>;
    Iterator(const Table* table, size_t slot) : table_(table), slot_(slot) {}
    const Table* table_ = nullptr;
    size_t slot_ = 0;
  };
  using iterator = Iterator<false>;
  using const_iterator = Iterator<true>;

  ObjectTable() = default;
  ObjectTable(ObjectTable&& other) noexcept = default;
  ObjectTable& operator=(ObjectTable&& other) noexcept {
    if (this != &other) {
      FreeAll();
      table_ = std::move(other.table_);
    }
    return *this;
  }
  ~ObjectTable() { FreeAll(); }

  iterator find(std::string_view key) { return At(table_.Find(key)); }
  const_iterator find(std::string_view key) const { return At(table_.Find(key)); }
  // With the key's Hash, for a batch that computed it early (FirstTagged, Prefetch).
  const_iterator find(std::string_view key, uint64_t hash) const {
    return At(table_.Find(key, hash));
  }

  // The entry of `key`, made with `meta` if there was none (and then true); `meta` is taken
  // either way.
  std::pair<iterator, bool> try_emplace(std::string_view key, ObjectMeta meta = {}) {
    const uint64_t hash = Table::Hash(key);
    const size_t found = table_.Find(key, hash);
    if (found != table_.capacity()) return {At(found), false};
    EntryHandle entry = MakeEntry(key, std::move(meta));
    auto [slot, inserted] = table_.Insert(entry.get(), key, hash);
    entry.release();  // inserted: the table had no such key
    return {At(slot), inserted};
  }
  // Takes `entry` (not null) if no entry has its key: the entry of its key, and whether it was
  // taken; not taken, it stays the caller's.
  std::pair<iterator, bool> insert(EntryHandle& entry) {
    auto [slot, inserted] = table_.Insert(entry.get(), entry->first.view());
    if (inserted) entry.release();
    return {At(slot), inserted};
  }
  // Erases the entry at `it` (its key has left every KeyRefSet) and returns the next one.
  iterator erase(iterator it) {
    ObjectEntry* entry = table_.At(it.slot_);
    table_.EraseSlot(it.slot_);
    Free{}(entry);
    return iterator(&table_, table_.NextUsed(it.slot_ + 1));
  }

  size_t size() const { return table_.size(); }
  bool empty() const { return table_.size() == 0; }
  // The slots' bytes (the entries' blocks are apart).
  size_t table_bytes() const { return table_.table_bytes(); }

  iterator begin() { return iterator(&table_, table_.NextUsed(0)); }
  iterator end() { return iterator(&table_, table_.capacity()); }
  const_iterator begin() const { return const_iterator(&table_, table_.NextUsed(0)); }
  const_iterator end() const { return const_iterator(&table_, table_.capacity()); }

  // A batch of lookups, stage by stage (MasterState::FindRun): Hash each key, Prefetch its home
  // slot, then prefetch its FirstTagged entry, then find.
  static uint64_t Hash(std::string_view key) { return Table::Hash(key); }
  void Prefetch(uint64_t hash) const {
    if (const uint64_t* slot = table_.HomeSlot(hash)) __builtin_prefetch(slot);
  }
  const ObjectEntry* FirstTagged(uint64_t hash) const { return table_.FirstTagged(hash); }

 private:
  Iterator<false> At(size_t slot) { return iterator(&table_, slot); }
  Iterator<true> At(size_t slot) const { return const_iterator(&table_, slot); }
  void FreeAll() {
    for (size_t i = table_.NextUsed(0); i < table_.capacity(); i = table_.NextUsed(i + 1)) {
      Free{}(table_.At(i));
    }
  }

  Table table_;
};

}  // namespace granary::master
