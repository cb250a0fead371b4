// disk/extent_allocator.h - free space of the offset backend's file, in 4 KiB blocks.
//
// Promise: Allocate(n) returns the start of a free range of n bytes (n a positive multiple of
// 4 KiB) taken from the smallest free range that holds it (best fit: keeps large ranges whole
// for large objects), or nullopt. Free() gives a range back and merges it with free neighbours,
// so no two free ranges touch. Reserve() marks a range used (recovery rebuilds the map from the
// records it finds). Cost: O(log ranges) per call: the disk write behind every call costs far
// more, so the simple ordered maps win over the master's O(1) segment allocator here.
// Ownership: plain value. Thread safety: none; the offset layout holds its mutex around calls.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace granary::disk {

class ExtentAllocator {
 public:
  explicit ExtentAllocator(uint64_t capacity);  // rounded down to 4 KiB

  std::optional<uint64_t> Allocate(uint64_t bytes);
  // The range must be allocated (or reserved) and not freed since; anything else is ignored
  // and returns false (a double free must not corrupt the map).
  bool Free(uint64_t offset, uint64_t bytes);
  // False when [offset, offset + bytes) is not entirely free.
  bool Reserve(uint64_t offset, uint64_t bytes);

  uint64_t capacity() const { return capacity_; }
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t largest_free() const;
  size_t free_ranges() const { return by_offset_.size(); }

 private:
  void Insert(uint64_t offset, uint64_t bytes);
  void Erase(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_;
  uint64_t free_bytes_ = 0;
  std::map<uint64_t, uint64_t> by_offset_;       // free: start -> length
  // free: (length, start), unique, so that erasing one range is O(log n) even when thousands of
  // ranges share a length (recovery reserving records out of file order leaves such gaps).
  std::set<std::pair<uint64_t, uint64_t>> by_length_;
};

}  // namespace granary::disk
