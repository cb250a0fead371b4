#include "disk/extent_allocator.h"

#include <iterator>

#include "disk/disk_io.h"

namespace granary::disk {

ExtentAllocator::ExtentAllocator(uint64_t capacity) : capacity_(capacity / kBlockSize * kBlockSize) {
  if (capacity_ > 0) Insert(0, capacity_);
}

void ExtentAllocator::Insert(uint64_t offset, uint64_t bytes) {
  by_offset_.emplace(offset, bytes);
  by_length_.emplace(bytes, offset);
  free_bytes_ += bytes;
}

void ExtentAllocator::Erase(std::map<uint64_t, uint64_t>::iterator it) {
  by_length_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_offset_.erase(it);
}

std::optional<uint64_t> ExtentAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0 || !IsAligned(bytes)) return std::nullopt;
  auto fit = by_length_.lower_bound({bytes, 0});
  if (fit == by_length_.end()) return std::nullopt;
  const uint64_t offset = fit->second, length = fit->first;
  Erase(by_offset_.find(offset));
  if (length > bytes) Insert(offset + bytes, length - bytes);
  return offset;
}

bool ExtentAllocator::Free(uint64_t offset, uint64_t bytes) {
  if (bytes == 0 || !IsAligned(offset) || !IsAligned(bytes) || offset > capacity_ ||
      bytes > capacity_ - offset) {
    return false;
  }
  // Refuse a range overlapping free space (double free).
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first < offset + bytes) return false;
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > offset) return false;
  }
  uint64_t start = offset, length = bytes;
  if (next != by_offset_.end() && next->first == offset + bytes) {
    length += next->second;
    Erase(next);
  }
  auto after = by_offset_.lower_bound(start);
  if (after != by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      Erase(prev);
    }
  }
  Insert(start, length);
  return true;
}

bool ExtentAllocator::Reserve(uint64_t offset, uint64_t bytes) {
  if (bytes == 0 || !IsAligned(offset) || !IsAligned(bytes)) return false;
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) return false;
  --it;
  const uint64_t start = it->first, length = it->second;
  if (offset + bytes > start + length || offset + bytes < offset) return false;
  Erase(it);
  if (offset > start) Insert(start, offset - start);
  if (start + length > offset + bytes) Insert(offset + bytes, start + length - offset - bytes);
  return true;
}

uint64_t ExtentAllocator::largest_free() const {
  return by_length_.empty() ? 0 : by_length_.rbegin()->first;
}

}  // namespace granary::disk
