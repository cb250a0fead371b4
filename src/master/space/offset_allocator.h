// master/space/offset_allocator.h - O(1) bookkeeping of byte ranges inside one segment.
//
// Promise: Allocate and Free are O(1): a fixed number of bitmap, list-link and hash lookups,
// never a search over free lists (probe_count() lets tests check it). Every offset and size is a
// multiple of kAlignment. A request gets exactly its size rounded up to kAlignment (a larger free
// block is split and the rest stays free), so internal waste is alignment only. Free coalesces
// with free neighbours at once, so no two free blocks are ever adjacent. Allocate fails only when
// no free block is big enough, or when the only big-enough blocks share the request's own size
// class (within 1/8 of the request) and are not at the head of that class's list. Hence a fresh
// segment fills until what is left is smaller than the request; refilling after random frees
// keeps ~97-98% of the segment in use for 4 KiB..64 MiB mixes (offset_allocator_test.cc).
// Ownership: the allocator owns only its metadata, and keeps it for free blocks only: an
// allocation is named by its offset and size, which the caller keeps anyway (the master's
// Extent), so a live allocation costs the allocator nothing (the master holds one per object).
// The segment's bytes live elsewhere.
// Thread safety: NOT thread-safe. The caller holds the segment's lock around every call,
// including GetStats.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "master/space/edge_map.h"

namespace granary::master {

class Encoder;
class Decoder;

class OffsetAllocator {
 public:
  static constexpr uint64_t kAlignment = 64;  // every offset and size is a multiple of this
  // The bytes an allocation of `request` bytes occupies: the request rounded up to kAlignment.
  static constexpr uint64_t AllocationSize(uint64_t request) {
    return (request + kAlignment - 1) / kAlignment * kAlignment;
  }

  // capacity_bytes is rounded down to kAlignment; any uint64 is accepted (below 64 gives an
  // allocator where nothing fits). `checked`: checked frees (see Free); by default as the
  // environment's GRANARY_CHECK_FREES says.
  explicit OffsetAllocator(uint64_t capacity_bytes)
      : OffsetAllocator(capacity_bytes, CheckFreesByDefault()) {}
  OffsetAllocator(uint64_t capacity_bytes, bool checked);
  static bool CheckFreesByDefault();  // GRANARY_CHECK_FREES is set and not 0 (read once)
  bool checked() const { return checked_.has_value(); }

  // Copyable and movable; a moved-from allocator may only be destroyed or assigned to.
  OffsetAllocator(const OffsetAllocator&) = default;
  OffsetAllocator& operator=(const OffsetAllocator&) = default;
  OffsetAllocator(OffsetAllocator&&) noexcept = default;
  OffsetAllocator& operator=(OffsetAllocator&&) noexcept = default;

  struct Allocation {
    uint64_t offset;  // bytes from the start of the segment
    uint64_t size;    // the request rounded up to kAlignment
  };

  // nullopt if size == 0, size > capacity or nothing fits. Never overflows for any uint64.
  std::optional<Allocation> Allocate(uint64_t size);

  // Frees the live allocation at `offset` whose size is `size` rounded up to kAlignment (the
  // request, or the allocation's size: both name it). The caller's bookkeeping must name exactly
  // one live allocation. What can be told in O(1) is refused (false; asserts in debug builds;
  // the allocator intact): a misaligned or empty range, one past the segment or larger than what
  // is allocated, and one that starts at a free block's start or ends at a free block's end. A
  // double free of a block whose neighbours were freed too lies inside one merged free block and
  // touches neither edge: only checked frees (GRANARY_CHECK_FREES=1 in the environment, as the
  // tests run; O(log n) a call) refuse every range that overlaps a free block. Decode keeps the
  // allocator's own mode.
  bool Free(uint64_t offset, uint64_t size);

  // Gives back the end of the live allocation at `offset` of `size` bytes (as for Free): from
  // then on it occupies AllocationSize(new_size) bytes at the same offset, and the rest is free
  // at once (merged into a free right neighbour). For a put committed into space reserved for a
  // larger object. Returns false, changing nothing, for a new_size of 0 or larger than the
  // allocation, a range Free would refuse, or a full node table; a new_size within the last
  // kAlignment is a no-op.
  bool Shrink(uint64_t offset, uint64_t size, uint64_t new_size);

  struct Stats {
    uint64_t capacity = 0;
    uint64_t used_bytes = 0;          // sum of allocated (rounded-up) sizes
    uint64_t free_bytes = 0;          // capacity - used_bytes
    uint64_t largest_free_block = 0;  // exact
    uint64_t free_block_count = 0;
    uint64_t allocation_count = 0;    // live allocations
    // 1 - largest_free_block / free_bytes; 0 when free_bytes == 0. 0 means all free space is one
    // block; near 1 means it is scattered in many small holes.
    double fragmentation() const;
  };
  // Counters are kept, so this is O(1) except largest_free_block: it is the largest block of the
  // highest non-empty size class, found by walking that one class's list (blocks within 1/8 of
  // each other in size; usually one or a few). Exact, and off the Allocate/Free path.
  Stats GetStats() const;

  uint64_t capacity() const { return capacity_; }
  // capacity - allocated bytes, without GetStats' walk for the largest free block.
  uint64_t free_bytes() const { return capacity_ - used_units_ * kAlignment; }

  struct Block {
    uint64_t offset;  // bytes
    uint64_t size;    // bytes
  };
  // Every free block, by address. O(blocks): for eviction planning, off the Allocate/Free path.
  std::vector<Block> FreeBlocks() const;

  // Nodes in the table: free blocks and slots kept for reuse, never live allocations. What the
  // allocator's memory grows with (24 bytes each, and two edge-map slots per free block).
  size_t node_count() const { return nodes_.size(); }

  // The allocator's whole state (node table, free lists in their order, counters), so that a
  // decoded copy makes exactly the same choices from then on: part of a master snapshot.
  // Decode replaces *this only if the bytes describe a consistent allocator (every free block
  // in the list of its size class once, none overlapping or adjacent, the counters matching);
  // false otherwise.
  void Encode(Encoder& out) const;
  bool Decode(Decoder& in);

  // Blocks examined by Allocate, Free and Shrink since construction (at most 2 per call); lets
  // tests check that the cost per call does not grow with the number of blocks.
  uint64_t probe_count() const { return probe_count_; }

 private:
  // Size classes: see the block comment in offset_allocator.cc.
  static constexpr uint32_t kMantissaBits = 3;
  static constexpr uint32_t kBinsPerGroup = 1u << kMantissaBits;  // 8: one uint8 of bitmap
  static constexpr uint32_t kGroups = 64;                         // covers any uint64 size
  static constexpr uint32_t kBins = kGroups * kBinsPerGroup;
  static constexpr uint32_t kNone = UINT32_MAX;  // null node index
  static constexpr uint32_t kNoBin = UINT32_MAX;

  // One free block, or an unused slot (size 0) kept for reuse and chained through list_next.
  // Offsets and sizes are in kAlignment units. A node's size is its bin's key: it changes only
  // while the block is out of its list.
  struct Node {
    uint64_t offset = 0;
    uint64_t size = 0;
    uint32_t list_prev = kNone;  // free blocks: the bin's list; unused slots: list_next only
    uint32_t list_next = kNone;
  };
  static_assert(sizeof(Node) == 24);

  static uint32_t FloorBin(uint64_t units);
  static uint32_t CeilBin(uint64_t units);
  uint32_t FirstNonEmptyBinAtLeast(uint32_t bin) const;
  void InsertFree(uint32_t node);  // into its bin's list
  void RemoveFree(uint32_t node);  // from its bin's list
  uint32_t NewNode();              // kNone if the node table is full (2^32 - 1 nodes)
  void ReleaseNode(uint32_t node);
  // Whether [offset, offset + units) may be a live allocation, as far as O(1) can tell (Free),
  // or, with checked frees, whether it overlaps no free block.
  bool MayBeLive(uint64_t offset, uint64_t units) const;
  // Makes [offset, offset + units) free, merged with the free blocks on either side; false,
  // changing nothing, when it would need a node and the table is full. Counters are the caller's.
  bool MakeFree(uint64_t offset, uint64_t units);

  uint64_t capacity_ = 0;  // bytes
  std::vector<Node> nodes_;
  EdgeMap by_start_;  // a free block's first unit -> its node
  EdgeMap by_end_;    // the unit after a free block's last -> its node
  // Checked frees only: every free block, start -> end (units), kept by InsertFree/RemoveFree.
  std::optional<std::map<uint64_t, uint64_t>> checked_;
  uint32_t unused_head_ = kNone;  // chain of unused slots through list_next
  uint64_t group_mask_ = 0;       // bit g set: some bin of group g is non-empty
  std::array<uint8_t, kGroups> bin_mask_{};  // bit m of [g] set: bin g*8+m is non-empty
  std::array<uint32_t, kBins> bin_head_{};
  uint64_t used_units_ = 0;
  uint64_t free_block_count_ = 0;
  uint64_t allocation_count_ = 0;
  uint64_t probe_count_ = 0;
};

}  // namespace granary::master
