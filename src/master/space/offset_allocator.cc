// master/space/offset_allocator.cc - two-level segregated fit over one segment's offsets.
//
// Size classes ("bins"). Sizes are counted in 64-byte units and encoded like a tiny float: the
// position of the top bit is the exponent, the next 3 bits are the mantissa. Sizes 0..15 units
// get a bin each (exact); above that, each power of two is cut into 8 bins, each 1/8 of the
// power wide:
//
//   units:  1 2 .. 15 | 16 18 20 .. 30 | 32 36 .. 60 | 64 72 .. 120 | ...   (lower bounds)
//   bin:    1 2 .. 15 | 16 17 18 .. 23 | 24 25 .. 31 | 32 33 .. 39  | ...
//
// so a bin's blocks differ by less than 12.5%. Bin b belongs to group b / 8; the allocator keeps
// one bit per non-empty group (uint64) and one bit per non-empty bin of each group (uint8), so
// "first non-empty bin >= b" is two find-first-set instructions. 64 groups cover any uint64 size.
//
// A free block of size s lives in FloorBin(s), the class whose lower bound is <= s. A request of
// r units first tries the head of FloorBin(r), its own class: that block may be a little smaller
// than r, so its size is checked (one probe). If it does not fit, take the head of the first
// non-empty bin from CeilBin(r) up, where every block is >= r. Plain segregated fit does only the
// second step; it then fails while a block up to 12.5% larger than the request is free, e.g. the
// tail of a nearly full segment. Trying the own class first also fits tighter (the block is
// < 12.5% too big instead of up to 25%): in the refill-after-churn test it kept about 1% more of
// the segment in use than doing it second. Only blocks behind the head of the own class can be
// missed; exact best fit (a sorted map, O(log n)) was measured only ~1% better.
//
// A taken block is split: the request gets the low part, and the rest stays a free block under
// the same node. Only free blocks have nodes. Free finds its free neighbours in two hash maps
// (EdgeMap: a free block by its first unit, and by the unit after its last) and merges with
// them by unlinking them from their bins: no search anywhere. An allocation needs no node
// because its owner names it by offset and size; the master keeps 10M objects, and a node each
// was 24 bytes of every one.

#include "master/space/offset_allocator.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstdlib>
#include <iterator>

#include "master/codec/binary_codec.h"

namespace granary::master {

namespace {

constexpr uint64_t kUnit = OffsetAllocator::kAlignment;

}  // namespace

// Read once a process: the tests (scripts/test.sh, ctest) set it; a production master does not.
bool OffsetAllocator::CheckFreesByDefault() {
  static const bool on = [] {
    const char* v = std::getenv("GRANARY_CHECK_FREES");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return on;
}

double OffsetAllocator::Stats::fragmentation() const {
  if (free_bytes == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free_block) / static_cast<double>(free_bytes);
}

OffsetAllocator::OffsetAllocator(uint64_t capacity_bytes, bool checked)
    : capacity_(capacity_bytes / kUnit * kUnit) {
  bin_head_.fill(kNone);
  if (checked) checked_.emplace();
  if (capacity_ == 0) return;
  const uint32_t node = NewNode();
  nodes_[node].size = capacity_ / kUnit;  // one free block: the whole segment
  by_start_.Set(0, node);
  by_end_.Set(nodes_[node].size, node);
  InsertFree(node);
}

// Bin index of the class whose lower bound is the largest one <= units (units >= 1).
uint32_t OffsetAllocator::FloorBin(uint64_t units) {
  const uint32_t top_bit = 63 - std::countl_zero(units);
  const uint32_t shift = top_bit > kMantissaBits ? top_bit - kMantissaBits : 0;
  // units >> shift is 8..15 (or < 16 when shift is 0), which already carries the exponent's +8.
  return (shift << kMantissaBits) + static_cast<uint32_t>(units >> shift);
}

// Bin index of the smallest class whose lower bound is >= units: every block there fits.
uint32_t OffsetAllocator::CeilBin(uint64_t units) {
  const uint32_t top_bit = 63 - std::countl_zero(units);
  const uint32_t shift = top_bit > kMantissaBits ? top_bit - kMantissaBits : 0;
  const uint32_t bin = (shift << kMantissaBits) + static_cast<uint32_t>(units >> shift);
  const uint64_t dropped = units & ((uint64_t{1} << shift) - 1);
  return dropped != 0 ? bin + 1 : bin;  // bin + 1 rolls into the next group correctly
}

uint32_t OffsetAllocator::FirstNonEmptyBinAtLeast(uint32_t bin) const {
  if (bin >= kBins) return kNoBin;
  uint32_t group = bin / kBinsPerGroup;
  const uint32_t in_group = bin_mask_[group] & (0xFFu << (bin % kBinsPerGroup));
  if (in_group != 0) return group * kBinsPerGroup + std::countr_zero(in_group);
  if (group + 1 >= kGroups) return kNoBin;
  const uint64_t groups = group_mask_ & (~uint64_t{0} << (group + 1));
  if (groups == 0) return kNoBin;
  group = std::countr_zero(groups);
  return group * kBinsPerGroup + std::countr_zero(static_cast<uint32_t>(bin_mask_[group]));
}

void OffsetAllocator::InsertFree(uint32_t node) {
  Node& n = nodes_[node];
  const uint32_t bin = FloorBin(n.size);
  n.list_prev = kNone;
  n.list_next = bin_head_[bin];
  if (n.list_next != kNone) nodes_[n.list_next].list_prev = node;
  bin_head_[bin] = node;
  bin_mask_[bin / kBinsPerGroup] |= static_cast<uint8_t>(1u << (bin % kBinsPerGroup));
  group_mask_ |= uint64_t{1} << (bin / kBinsPerGroup);
  ++free_block_count_;
  if (checked_) (*checked_)[n.offset] = n.offset + n.size;
}

void OffsetAllocator::RemoveFree(uint32_t node) {
  Node& n = nodes_[node];
  assert(n.size != 0);
  if (n.list_prev != kNone) {
    nodes_[n.list_prev].list_next = n.list_next;
  } else {
    const uint32_t bin = FloorBin(n.size);
    bin_head_[bin] = n.list_next;
    if (n.list_next == kNone) {  // the bin became empty: clear its bit, then maybe its group's
      const uint32_t group = bin / kBinsPerGroup;
      bin_mask_[group] &= static_cast<uint8_t>(~(1u << (bin % kBinsPerGroup)));
      if (bin_mask_[group] == 0) group_mask_ &= ~(uint64_t{1} << group);
    }
  }
  if (n.list_next != kNone) nodes_[n.list_next].list_prev = n.list_prev;
  n.list_prev = n.list_next = kNone;
  --free_block_count_;
  if (checked_) checked_->erase(n.offset);
}

uint32_t OffsetAllocator::NewNode() {
  if (unused_head_ != kNone) {
    const uint32_t node = unused_head_;
    unused_head_ = nodes_[node].list_next;
    nodes_[node] = Node{};
    return node;
  }
  if (nodes_.size() >= kNone) return kNone;  // kNone itself is the null index
  nodes_.emplace_back();
  return static_cast<uint32_t>(nodes_.size() - 1);
}

void OffsetAllocator::ReleaseNode(uint32_t node) {
  nodes_[node] = Node{};  // size 0: an unused slot
  nodes_[node].list_next = unused_head_;
  unused_head_ = node;
}

std::optional<OffsetAllocator::Allocation> OffsetAllocator::Allocate(uint64_t size) {
  // Checking against capacity first keeps the round-up below from overflowing: capacity_ is at
  // most 2^64 - 64.
  if (size == 0 || size > capacity_) return std::nullopt;
  const uint64_t units = (size + kUnit - 1) / kUnit;

  // Own class first: its head, when big enough, is the tightest fit on offer (see top).
  uint32_t node = kNone;
  const uint32_t own = bin_head_[FloorBin(units)];
  if (own != kNone) {
    ++probe_count_;
    if (nodes_[own].size >= units) node = own;
  }
  if (node == kNone) {
    const uint32_t bin = FirstNonEmptyBinAtLeast(CeilBin(units));
    if (bin != kNoBin) {
      node = bin_head_[bin];
      ++probe_count_;
    }
  }
  if (node == kNone) return std::nullopt;

  RemoveFree(node);
  Node& n = nodes_[node];
  const uint64_t offset = n.offset;
  by_start_.Erase(offset);
  if (n.size > units) {  // the rest stays free under the same node, at the head of its bin
    n.offset += units;
    n.size -= units;
    by_start_.Set(n.offset, node);
    InsertFree(node);
  } else {
    by_end_.Erase(offset + units);
    ReleaseNode(node);
  }
  used_units_ += units;
  ++allocation_count_;
  return Allocation{offset * kUnit, units * kUnit};
}

bool OffsetAllocator::MayBeLive(uint64_t offset, uint64_t units) const {
  const uint64_t capacity_units = capacity_ / kUnit;
  if (units == 0 || units > used_units_ || offset > capacity_units - units) return false;
  // A live allocation's first unit starts no free block, and its end ends none.
  if (by_start_.Find(offset) || by_end_.Find(offset + units)) return false;
  if (!checked_) return true;
  // No free block overlaps it: the one starting after it begins past its end, and the one
  // before it ends by its start.
  auto after = checked_->upper_bound(offset);
  if (after != checked_->end() && after->first < offset + units) return false;
  return after == checked_->begin() || std::prev(after)->second <= offset;
}

bool OffsetAllocator::MakeFree(uint64_t offset, uint64_t units) {
  const uint64_t end = offset + units;
  const uint32_t right = by_start_.Find(end).value_or(kNone);
  const uint32_t left = by_end_.Find(offset).value_or(kNone);
  probe_count_ += 2;
  if (left != kNone) {  // the free block on the left grows over the range...
    RemoveFree(left);
    by_end_.Erase(offset);
    nodes_[left].size += units;
    if (right != kNone) {  // ...and over the free block on the right
      RemoveFree(right);
      by_start_.Erase(end);
      nodes_[left].size += nodes_[right].size;
      by_end_.Set(nodes_[right].offset + nodes_[right].size, left);
      ReleaseNode(right);
    } else {
      by_end_.Set(end, left);
    }
    InsertFree(left);
  } else if (right != kNone) {  // the free block on the right grows leftwards
    RemoveFree(right);
    by_start_.Erase(end);
    nodes_[right].offset = offset;
    nodes_[right].size += units;
    by_start_.Set(offset, right);
    InsertFree(right);
  } else {
    const uint32_t node = NewNode();
    if (node == kNone) return false;  // 2^32 - 1 free blocks already
    nodes_[node].offset = offset;
    nodes_[node].size = units;
    by_start_.Set(offset, node);
    by_end_.Set(end, node);
    InsertFree(node);
  }
  return true;
}

bool OffsetAllocator::Free(uint64_t offset, uint64_t size) {
  const uint64_t units = size / kUnit + (size % kUnit != 0 ? 1 : 0);
  if (offset % kUnit != 0 || allocation_count_ == 0 || !MayBeLive(offset / kUnit, units)) {
    assert(false && "OffsetAllocator::Free: not a live allocation (bogus range or double free)");
    return false;  // release builds: refused, the structures untouched
  }
  // Past 2^32 - 1 free blocks the range stays allocated (lost space) rather than untracked.
  if (!MakeFree(offset / kUnit, units)) return false;
  used_units_ -= units;
  --allocation_count_;
  return true;
}

bool OffsetAllocator::Shrink(uint64_t offset, uint64_t size, uint64_t new_size) {
  const uint64_t units = size / kUnit + (size % kUnit != 0 ? 1 : 0);
  if (new_size == 0 || offset % kUnit != 0 || !MayBeLive(offset / kUnit, units)) return false;
  if (new_size > units * kUnit) return false;  // first: the round-up cannot overflow
  const uint64_t kept = (new_size + kUnit - 1) / kUnit;
  const uint64_t tail = units - kept;
  if (tail == 0) return true;
  // Its left is the allocation: it merges rightwards only.
  if (!MakeFree(offset / kUnit + kept, tail)) return false;
  used_units_ -= tail;
  return true;
}

OffsetAllocator::Stats OffsetAllocator::GetStats() const {
  Stats s;
  s.capacity = capacity_;
  s.used_bytes = used_units_ * kUnit;
  s.free_bytes = capacity_ - s.used_bytes;
  s.free_block_count = free_block_count_;
  s.allocation_count = allocation_count_;
  if (group_mask_ != 0) {
    // The largest block is in the highest non-empty bin; which one of that bin's blocks it is
    // is not tracked, so walk that list (see header).
    const uint32_t group = 63 - std::countl_zero(group_mask_);
    const uint32_t top_in_group = 31 - std::countl_zero(uint32_t{bin_mask_[group]});
    const uint32_t bin = group * kBinsPerGroup + top_in_group;
    uint64_t largest = 0;
    for (uint32_t n = bin_head_[bin]; n != kNone; n = nodes_[n].list_next) {
      largest = std::max(largest, nodes_[n].size);
    }
    s.largest_free_block = largest * kUnit;
  }
  return s;
}

std::vector<OffsetAllocator::Block> OffsetAllocator::FreeBlocks() const {
  std::vector<Block> out;
  out.reserve(free_block_count_);
  for (const Node& n : nodes_) {
    if (n.size != 0) out.push_back({n.offset * kUnit, n.size * kUnit});
  }
  std::sort(out.begin(), out.end(), [](const Block& a, const Block& b) { return a.offset < b.offset; });
  return out;
}

// ---- snapshot ----

void OffsetAllocator::Encode(Encoder& out) const {
  uint64_t capacity = capacity_, group_mask = group_mask_, used = used_units_;
  uint64_t free_blocks = free_block_count_, allocations = allocation_count_;
  uint32_t unused_head = unused_head_;
  out(capacity);
  out(group_mask);
  out(used);
  out(free_blocks);
  out(allocations);
  out(unused_head);
  for (uint8_t m : bin_mask_) {
    uint8_t v = m;
    out(v);
  }
  for (uint32_t h : bin_head_) {
    uint32_t v = h;
    out(v);
  }
  uint64_t count = nodes_.size();
  out(count);
  for (const Node& n : nodes_) {  // free blocks and unused slots (size 0)
    uint64_t offset = n.offset, size = n.size;
    uint32_t lp = n.list_prev, ln = n.list_next;
    out(offset);
    out(size);
    out(lp);
    out(ln);
  }
}

bool OffsetAllocator::Decode(Decoder& in) {
  OffsetAllocator a(0, checked());
  in(a.capacity_);
  in(a.group_mask_);
  in(a.used_units_);
  in(a.free_block_count_);
  in(a.allocation_count_);
  in(a.unused_head_);
  for (uint8_t& m : a.bin_mask_) in(m);
  for (uint32_t& h : a.bin_head_) in(h);
  uint64_t count = 0;
  in(count);
  // Each node takes at least 4 bytes: a larger count is a lie, not a reason to allocate.
  if (!in.ok() || count >= kNone || count > (uint64_t{1} << 40)) return false;
  if (a.capacity_ % kUnit != 0) return false;
  const uint64_t capacity_units = a.capacity_ / kUnit;
  a.nodes_.reserve(std::min<uint64_t>(count, 1 << 20));
  for (uint64_t i = 0; i < count && in.ok(); ++i) {
    Node n;
    in(n.offset);
    in(n.size);
    in(n.list_prev);
    in(n.list_next);
    if (n.size > capacity_units || n.offset > capacity_units - n.size) return false;
    a.nodes_.push_back(n);
  }
  // Each allocation holds at least a unit, and units are held only by allocations.
  if (!in.ok() || a.used_units_ > capacity_units || a.allocation_count_ > a.used_units_ ||
      (a.used_units_ == 0) != (a.allocation_count_ == 0)) {
    return false;
  }
  auto valid = [&](uint32_t idx) { return idx == kNone || idx < a.nodes_.size(); };
  // Every bin's list: free blocks of that class, each linked back to the one before it.
  std::vector<uint8_t> seen(a.nodes_.size(), 0);
  uint64_t listed = 0;
  std::vector<Block> blocks;
  for (uint32_t bin = 0; bin < kBins; ++bin) {
    const uint32_t head = a.bin_head_[bin];
    const bool marked = (a.bin_mask_[bin / kBinsPerGroup] >> (bin % kBinsPerGroup)) & 1;
    if (!valid(head) || marked != (head != kNone)) return false;
    for (uint32_t n = head, prev = kNone; n != kNone; prev = n, n = a.nodes_[n].list_next) {
      if (!valid(n) || seen[n] != 0) return false;
      const Node& node = a.nodes_[n];
      if (node.size == 0 || FloorBin(node.size) != bin || node.list_prev != prev ||
          !valid(node.list_next)) {
        return false;
      }
      seen[n] = 1;
      ++listed;
      blocks.push_back({node.offset, node.size});
    }
  }
  for (uint32_t g = 0; g < kGroups; ++g) {
    if (((a.group_mask_ >> g) & 1) != (a.bin_mask_[g] != 0 ? 1u : 0u)) return false;
  }
  // The unused slots: one chain, each a size-0 node, with every node either there or listed.
  uint64_t unused = 0;
  for (uint32_t n = a.unused_head_; n != kNone; n = a.nodes_[n].list_next) {
    if (!valid(n) || seen[n] != 0 || a.nodes_[n].size != 0) return false;
    seen[n] = 1;
    ++unused;
  }
  if (listed != a.free_block_count_ || listed + unused != a.nodes_.size()) return false;
  // Free blocks neither overlap nor touch (they would have merged), and add up to what is free.
  std::sort(blocks.begin(), blocks.end(),
            [](const Block& x, const Block& y) { return x.offset < y.offset; });
  uint64_t free_units = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i > 0 && blocks[i - 1].offset + blocks[i - 1].size >= blocks[i].offset) return false;
    free_units += blocks[i].size;
  }
  if (free_units != capacity_units - a.used_units_) return false;
  for (uint32_t i = 0; i < a.nodes_.size(); ++i) {
    const Node& n = a.nodes_[i];
    if (n.size == 0) continue;
    a.by_start_.Set(n.offset, i);
    a.by_end_.Set(n.offset + n.size, i);
    if (a.checked_) (*a.checked_)[n.offset] = n.offset + n.size;
  }
  *this = std::move(a);
  return true;
}

}  // namespace granary::master
