// master/space/offset_allocator.h - O(1) bookkeeping of byte ranges inside one segment.
//
// Promise: Allocate and Free are O(1): a fixed number of bitmap and list-link operations, never a
// search over free lists (probe_count() lets tests check it). Every offset and size is a multiple
// of kAlignment. A request gets exactly its size rounded up to kAlignment (a larger free block is
// split and the rest stays free), so internal waste is alignment only. Free coalesces with free
// neighbours at once, so no two free blocks are ever adjacent. Allocate fails only when no free
// block is big enough, or when the only big-enough blocks share the request's own size class
// (within 1/8 of the request) and are not at the head of that class's list. Hence a fresh segment
// fills until what is left is smaller than the request; refilling after random frees keeps
// ~97-98% of the segment in use for 4 KiB..64 MiB mixes (offset_allocator_test.cc measures it).
// Ownership: the allocator owns only its metadata (a node table it grows to its peak block count
// and then reuses); the segment's bytes live elsewhere. A handle names one live allocation from
// Allocate until the matching Free; after that the handle may be reused by a later Allocate.
// Thread safety: NOT thread-safe. The caller holds the segment's lock around every call,
// including GetStats.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

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
  // allocator where nothing fits).
  explicit OffsetAllocator(uint64_t capacity_bytes);

  // Copyable and movable; a moved-from allocator may only be destroyed or assigned to.
  OffsetAllocator(const OffsetAllocator&) = default;
  OffsetAllocator& operator=(const OffsetAllocator&) = default;
  OffsetAllocator(OffsetAllocator&&) noexcept = default;
  OffsetAllocator& operator=(OffsetAllocator&&) noexcept = default;

  struct Allocation {
    uint64_t offset;  // bytes from the start of the segment
    uint64_t size;    // the request rounded up to kAlignment
    uint32_t handle;  // pass to Free
  };

  // nullopt if size == 0, size > capacity, nothing fits, or the node table is full (2^32 - 1
  // blocks). Never overflows for any uint64.
  std::optional<Allocation> Allocate(uint64_t size);

  // handle must come from Allocate and not have been freed. A handle that is out of range or not
  // live (double free) asserts in debug builds and is ignored in release builds, leaving the
  // allocator intact. A stale handle whose slot was reused by a later Allocate cannot be told
  // apart from the new owner: it frees that allocation (the caller's bookkeeping must prevent it).
  void Free(uint32_t handle);

  // Gives back the end of a live allocation: from then on it occupies AllocationSize(size) bytes
  // at the same offset under the same handle, and the rest is free at once (merged into a free
  // right neighbour). For a put committed into space reserved for a larger object. Returns false,
  // changing nothing, for a handle that is not live, a size of 0, a size larger than the
  // allocation, or a full node table; a size within the allocation's last kAlignment is a no-op.
  bool Shrink(uint32_t handle, uint64_t size);

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

  // The allocator's whole state (node table, free lists in their order, counters), so that a
  // decoded copy makes exactly the same choices from then on: part of a master snapshot.
  // Decode replaces *this only if the bytes describe a consistent allocator; false otherwise.
  void Encode(Encoder& out) const;
  bool Decode(Decoder& in);

  // Blocks examined by Allocate and Free since construction (at most 2 per call); lets tests
  // check that the cost per call does not grow with the number of blocks.
  uint64_t probe_count() const { return probe_count_; }

 private:
  // Size classes: see the block comment in offset_allocator.cc.
  static constexpr uint32_t kMantissaBits = 3;
  static constexpr uint32_t kBinsPerGroup = 1u << kMantissaBits;  // 8: one uint8 of bitmap
  static constexpr uint32_t kGroups = 64;                         // covers any uint64 size
  static constexpr uint32_t kBins = kGroups * kBinsPerGroup;
  static constexpr uint32_t kNone = UINT32_MAX;  // null node index
  static constexpr uint32_t kNoBin = UINT32_MAX;

  enum class State : uint8_t { kUnused, kFree, kUsed };

  // One block of the segment (free or allocated), or an unused slot. Offsets are in kAlignment
  // units. A node's index is its handle. 24 bytes: one per object in the master, so the state
  // rides in the offset's top bits (an offset in units is below 2^58), and a block's size is not
  // kept: the blocks tile the segment, so it ends where its right neighbour starts (SizeOf).
  // A free block's size is its bin's key: it changes only while the block is out of its list.
  struct Node {
    uint64_t offset : 62 = 0;
    uint64_t state_bits : 2 = static_cast<uint64_t>(State::kUnused);
    uint32_t list_prev = kNone;  // free blocks: the bin's list; unused slots: list_next only
    uint32_t list_next = kNone;
    uint32_t phys_prev = kNone;  // neighbours by address, free or allocated
    uint32_t phys_next = kNone;

    State state() const { return static_cast<State>(state_bits); }
    void set_state(State s) { state_bits = static_cast<uint64_t>(s); }
  };
  static_assert(sizeof(Node) == 24);

  // Where block `node` (free or used) ends, in units: its right neighbour's start, or the
  // segment's end; and so its size.
  uint64_t EndOf(uint32_t node) const {
    const uint32_t next = nodes_[node].phys_next;
    return next != kNone ? nodes_[next].offset : capacity_ / kAlignment;
  }
  uint64_t SizeOf(uint32_t node) const { return EndOf(node) - nodes_[node].offset; }

  static uint32_t FloorBin(uint64_t units);
  static uint32_t CeilBin(uint64_t units);
  uint32_t FirstNonEmptyBinAtLeast(uint32_t bin) const;
  void InsertFree(uint32_t node);
  void RemoveFree(uint32_t node);
  uint32_t NewNode();  // kNone if the node table is full (2^32 - 1 nodes)
  void ReleaseNode(uint32_t node);

  uint64_t capacity_ = 0;  // bytes
  std::vector<Node> nodes_;
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
