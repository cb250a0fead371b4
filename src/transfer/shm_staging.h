// transfer/shm_staging.h - a node's disk-read staging region in named POSIX shared memory: the
// layout both sides agree on, and a same-host client's read-only view of it.
//
// Layout of /dev/shm/<name>: a StageRegionHeader at 0, an array of `slot_count` slot
// generations (atomic uint64) at kStageGenerationsAt, then the data area at `header_bytes` (a
// 4 KiB multiple, so O_DIRECT reads land in it) of `data_bytes`. The node (node::ShmStaging)
// creates the file, writes the header once and bumps a slot's generation every time it frees
// the slot; it reads objects from disk into the data area and tells the client, over the data
// plane's DISK_STAGE, (slot, generation, offset, length).
//
// Promise (StagingView): Attach maps an existing region read-only (a client can never write into
// another client's staged bytes) and refuses it unless its header is well-formed and its token
// is the one the node gave over the connection: a file of the same name on another host's
// /dev/shm, or of an older node process, is never used. Copy() copies a staged object out and
// then checks that the slot's generation is still the granted one (a seqlock's reader side): a
// copy that overlapped a reclaim and reuse of the space is reported as SEGMENT_NOT_FOUND, never
// returned as bytes.
// Ownership: a StagingView owns its mapping (munmap in the destructor); share it by shared_ptr
// so dropping it never unmaps memory another thread is copying from.
// Thread safety: immutable after Attach; Copy and generation from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "granary/status.h"
#include "transfer/protocol.h"

namespace granary::transfer {

inline constexpr uint64_t kStageMagic = 0x3147545359524E47;  // "GNRYSTG1"
inline constexpr uint32_t kStageLayoutVersion = 1;
inline constexpr uint64_t kStageGenerationsAt = 64;
inline constexpr uint64_t kStageAlign = 4096;

struct StageRegionHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t slot_count;
  uint64_t header_bytes;  // where the data area starts: a kStageAlign multiple
  uint64_t data_bytes;
  uint64_t region_token;  // random per region: names this file, not just its path
  uint64_t owner_pid;     // informational
};
static_assert(sizeof(StageRegionHeader) <= kStageGenerationsAt);
static_assert(std::atomic<uint64_t>::is_always_lock_free, "generations are shared between processes");

// The header and generation table, rounded up to a kStageAlign multiple.
inline uint64_t StageHeaderBytes(uint32_t slot_count) {
  const uint64_t raw = kStageGenerationsAt + uint64_t{slot_count} * sizeof(uint64_t);
  return (raw + kStageAlign - 1) / kStageAlign * kStageAlign;
}

class StagingView {
 public:
  // SEGMENT_NOT_FOUND when no such file exists on this host; INVALID_PARAMS when its header is
  // not a staging region's, its sizes are inconsistent, or its token is not `expected_token`;
  // TRANSFER_FAIL for other failures.
  static Result<std::unique_ptr<StagingView>> Attach(const std::string& name,
                                                     uint64_t expected_token);
  ~StagingView();
  StagingView(const StagingView&) = delete;
  StagingView& operator=(const StagingView&) = delete;

  uint64_t token() const { return token_; }
  uint64_t data_bytes() const { return data_bytes_; }
  uint32_t slot_count() const { return slot_count_; }
  const std::string& name() const { return name_; }
  // The slot's generation now (acquire); 0 for a slot id out of range.
  uint64_t generation(uint32_t slot) const;
  // Copies the staged bytes of `s` into dst (whose sizes add up to s.length) and, with
  // `checksum`, hashes them on the way. INVALID_PARAMS for a slot that is not in this region
  // (token, id, range); SEGMENT_NOT_FOUND when the slot's generation moved (the node reclaimed
  // it): the bytes in dst must not be used.
  Status Copy(const StagedSlot& s, const std::vector<std::span<std::byte>>& dst,
              uint64_t* checksum) const;

 private:
  StagingView(std::string name, void* base, uint64_t map_bytes, const StageRegionHeader& h);

  std::string name_;
  void* base_;
  uint64_t map_bytes_;
  uint64_t token_;
  uint64_t data_bytes_;
  uint32_t slot_count_;
  const std::atomic<uint64_t>* generations_;
  const std::byte* data_;
};

}  // namespace granary::transfer
