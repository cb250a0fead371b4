// node/shm_staging.h - the node's shared-memory staging region for same-host disk loads
// (DISK_STAGE, transfer/protocol.h; layout in transfer/shm_staging.h).
//
// Promise: space is handed out as slots (an id, a generation, a 4 KiB-aligned range of the data
// area). A slot is first *filling* (the node's reader owns it: never released, reclaimed or
// reused), then, once handed to a connection (Hand), *handed*: it is freed only by
//   - Release by the same owner naming its current generation (a client's STAGE_RELEASE),
//   - ReleaseOwner (the owner's connection closed),
//   - the TTL: a handed slot not released within slot_ttl_ms is reclaimed (ReclaimExpired, also
//     run by every Acquire), for a client that died or stopped without closing.
// Freeing bumps the slot's generation in shared memory *before* the space can be granted again,
// so a reader still copying from a reclaimed slot (a SIGSTOPped client resumed) finds another
// generation after its copy and discards the bytes (transfer::StagingView::Copy). A release
// naming an unknown id, a stale generation or another owner's slot frees nothing.
// Budget: the data area is the budget; Acquire takes space for a whole window at once or waits
// (bounded) for releases, so a window never holds part of its space while waiting for the rest.
// Ownership: owns the mapping, the descriptor (kept open with an exclusive flock, so
// ShmSegment::ReclaimOrphans leaves a live region alone and removes a crashed node's) and the
// name (unlinked in the destructor if it still names this file).
// Thread safety: all methods from any thread (one mutex).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "granary/status.h"

namespace granary::node {

struct ShmStagingOptions {
  uint64_t bytes = 256ull << 20;  // the data area (rounded up to 4 KiB)
  int slot_ttl_ms = 30000;        // a handed slot not released this long is reclaimed
  uint32_t max_slots = 0;         // 0: one per 64 KiB of data, between 64 and 16384
  std::string shm_dir = "/dev/shm";  // for the free-space check only
};

class ShmStaging {
 public:
  using Options = ShmStagingOptions;
  using Clock = std::chrono::steady_clock;

  // Creates /dev/shm/<name> (mode 0600). INVALID_PARAMS for a bad name or size, or when /dev/shm
  // has not that much free space; SEGMENT_ALREADY_EXISTS when a live node holds the name;
  // INTERNAL_ERROR for a failing system call.
  static Result<std::unique_ptr<ShmStaging>> Create(const std::string& name, Options options);
  ~ShmStaging();
  ShmStaging(const ShmStaging&) = delete;
  ShmStaging& operator=(const ShmStaging&) = delete;

  const std::string& name() const { return name_; }
  uint64_t token() const { return token_; }
  uint64_t data_bytes() const { return data_bytes_; }
  uint32_t slot_count() const { return slot_count_; }

  struct Grant {
    uint32_t slot = 0;
    uint64_t generation = 0;
    uint64_t offset = 0;            // in the data area
    std::span<std::byte> buffer;    // the slot's whole (4 KiB-rounded) space
  };
  // Space for every size (each rounded up to 4 KiB), all or none, owned by `owner` and filling.
  // NO_AVAILABLE_HANDLE when it did not free up within wait_ms, or can never fit.
  Result<std::vector<Grant>> Acquire(const std::vector<uint64_t>& sizes, uint64_t owner,
                                     int wait_ms);
  // The node hands a filling slot to its owner's client: the TTL starts now.
  void Hand(uint32_t slot);
  // The node gives back a filling slot it did not hand out (the entry was refused).
  void Free(uint32_t slot);
  // A client's release: OK, INVALID_PARAMS (no such id), OBJECT_NOT_FOUND (not handed under that
  // generation) or ILLEGAL_CLIENT (another owner's); only OK frees anything.
  ErrorCode Release(uint32_t slot, uint64_t generation, uint64_t owner);
  // Frees every handed slot of `owner`; returns how many.
  size_t ReleaseOwner(uint64_t owner);
  // Frees handed slots past their TTL; returns how many.
  size_t ReclaimExpired();
  // The generation in shared memory now (what a client compares after its copy).
  uint64_t generation(uint32_t slot) const;

  struct Stats {
    uint64_t granted = 0;
    uint64_t released = 0;        // by their owner
    uint64_t closed = 0;          // freed because their connection closed
    uint64_t reclaimed = 0;       // past their TTL
    uint64_t refused_releases = 0;
    uint64_t bytes_in_use = 0;    // a gauge
    uint64_t slots_in_use = 0;    // a gauge
  };
  Stats stats() const;

 private:
  enum class State : uint8_t { kFree, kFilling, kHanded };
  struct Slot {
    State state = State::kFree;
    uint64_t owner = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    Clock::time_point deadline{};
  };
  ShmStaging(std::string name, int fd, std::byte* base, uint64_t map_bytes, uint64_t header_bytes,
             uint64_t data_bytes, uint32_t slots, Options options);
  void FreeLocked(uint32_t slot);  // bumps the generation first
  size_t ReclaimExpiredLocked(Clock::time_point now);
  bool TakeExtent(uint64_t bytes, uint64_t* offset);
  void PutExtent(uint64_t offset, uint64_t bytes);

  const std::string name_;
  const int fd_;
  std::byte* const base_;
  const uint64_t map_bytes_;
  std::byte* const data_;
  const uint64_t data_bytes_;
  const uint32_t slot_count_;
  const Options options_;
  uint64_t token_ = 0;
  std::atomic<uint64_t>* generations_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_ids_;
  std::map<uint64_t, uint64_t> free_extents_;  // offset -> bytes, coalesced
  Clock::time_point next_expiry_ = Clock::time_point::max();
  Stats stats_;
};

}  // namespace granary::node
