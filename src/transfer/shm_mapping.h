// transfer/shm_mapping.h - a client's view of a node's segment in named POSIX shared memory.
//
// Layout of a segment file (/dev/shm/<name>): a ShmSegmentHeader in its first kShmHeaderBytes,
// then the data area of `data size` bytes, the range the master allocates in (offset 0 of a
// replica is the first data byte). The header carries the token of the mount this file's memory
// belongs to; a replica names the token of the mount it was granted under. A node gives every
// remount a new file under the same name (node/shm_segment.h, Renew): the old file's token
// becomes kShmRetiredToken for good, its pages are released, and the name then refers to the new
// file. A mapping of the old file is a dead copy: nothing the master hands out is in it.
//
// Promise: Attach() maps an existing segment (made by the node's node::ShmSegment) read-write, so a
// client on the same host moves bytes with memcpy: puts write into it, gets read from it. It never
// creates, resizes or unlinks the segment; the node alone owns its lifetime. Attach checks the
// header (magic, layout version, sizes) and refuses anything else, a retired file included. A
// mapping outlives the name (the kernel keeps the file until the last munmap), so after a remount
// or a node restart a cached mapping is a dead copy: its token is retired or never changes again,
// and StillLinked() says false. Callers (client::ReplicaIo) compare token() with the replica's
// token before a copy, and for reads again after it, so a stale replica never moves bytes of a
// newer mount; a copy paused past that check lands in (or reads) the dead copy only. They drop
// mappings whose file is gone (ShmMappingCache::Retain, and ReplicaIo on a token mismatch).
// SIGBUS: if the node did not prefault its segment and /dev/shm fills up, the first write to a
// page not yet backed kills the writer with SIGBUS; nodes sharing memory with clients should
// prefault (see node/shm_segment.h).
// Ownership: a ShmMapping owns its mapping (munmap in the destructor). ShmMappingCache hands out
// shared_ptrs, so Drop() never unmaps memory another thread is still copying from.
// Thread safety: ShmMapping is immutable after Attach (the bytes are shared; the master's protocol
// keeps readers and writers of a range apart; the header token is read atomically).
// ShmMappingCache is safe from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/names.h"
#include "granary/status.h"

namespace granary::transfer {

// Segment names are one path component under /dev/shm: [A-Za-z0-9._-], 1..200 characters, not
// "." or "..". Shared by the node (create) and clients (attach) so both refuse the same names.
inline Status ValidateShmName(std::string_view name) {
  return ValidateName("shared-memory segment name", name);
}

// The first bytes of every segment file. Written by the node (node::ShmSegment): all fields at
// creation, `token` at every mount; read by clients.
inline constexpr uint64_t kShmHeaderBytes = 4096;  // the data area starts page-aligned
inline constexpr uint64_t kShmMagic = 0x314D485359524E47;  // "GNRYSHM1"
inline constexpr uint32_t kShmLayoutVersion = 1;
// The token of a file whose memory a remount retired (no mount's, ever again); never a mount's.
inline constexpr uint64_t kShmRetiredToken = ~uint64_t{0};
struct ShmSegmentHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_bytes;      // kShmHeaderBytes: where the data area starts
  uint64_t data_bytes;        // size of the data area (the size the master knows)
  std::atomic<uint64_t> token;  // this memory's mount; 0 before it, kShmRetiredToken after it
  uint64_t owner_pid;         // informational: the node process that created the file
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the token is shared between processes");
static_assert(sizeof(ShmSegmentHeader) <= kShmHeaderBytes);

class ShmMapping {
 public:
  // Maps the segment "/<name>" whose data area is `expected_size` bytes. SEGMENT_NOT_FOUND if no
  // such segment exists on this host, or if it is a retired file (caught mid-remount);
  // INVALID_PARAMS if the name is invalid, its data size is not `expected_size` (both named) or
  // its header is not a Granary segment header of this layout; TRANSFER_FAIL for other failures
  // (e.g. permission: segments are mode 0600, same user only).
  static Result<std::unique_ptr<ShmMapping>> Attach(const std::string& name,
                                                    uint64_t expected_size);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  // The data area (offset 0 of a replica) and its size.
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // The token of the mount this memory belongs to, read now (acquire); kShmRetiredToken once a
  // remount retired it.
  uint64_t token() const { return header_->token.load(std::memory_order_acquire); }
  bool retired() const { return token() == kShmRetiredToken; }
  // True while /dev/shm/<name> is still the file this mapping maps (the node has not unlinked
  // it or been replaced by a newer node of the same name). Costs an open and an fstat.
  bool StillLinked() const;
  // Something that must end before this memory is unmapped, such as a device's registration of
  // it (DeviceMemory::Register): `make` runs on the first call only, and what it returns is kept
  // until the mapping is destroyed, then released before the munmap. Any thread.
  void HoldUntilUnmapped(const std::function<std::shared_ptr<void>()>& make);

 private:
  ShmMapping(std::string name, void* base, uint64_t size, dev_t dev, ino_t ino)
      : name_(std::move(name)),
        base_(base),
        header_(static_cast<ShmSegmentHeader*>(base)),
        data_(static_cast<std::byte*>(base) + kShmHeaderBytes),
        size_(size),
        dev_(dev),
        ino_(ino) {}

  std::string name_;
  void* base_;                // the whole file: header + data
  ShmSegmentHeader* header_;
  std::byte* data_;
  uint64_t size_;             // of the data area
  dev_t dev_;
  ino_t ino_;
  std::once_flag hold_once_;
  std::shared_ptr<void> hold_;  // released before the munmap
};

// One mapping per segment name, made on first use and reused: attaching costs syscalls and page
// faults that a per-Get attach would pay again and again.
class ShmMappingCache {
 public:
  // Called with every mapping Get attaches (not with cached ones), outside the lock: the client
  // warms new mappings (transfer/mapping_warmer.h). Set before the cache is shared.
  using AttachListener = std::function<void(const std::shared_ptr<ShmMapping>&)>;
  void OnAttach(AttachListener listener) { on_attach_ = std::move(listener); }
  // The mapping of `name`, attaching it on first use. A cached mapping of another size (the node
  // restarted with a new size) is replaced. Errors are those of ShmMapping::Attach.
  Result<std::shared_ptr<ShmMapping>> Get(const std::string& name, uint64_t size);
  // Forgets `name`; the memory is unmapped when the last holder lets go.
  void Drop(const std::string& name);
  // Forgets `name` only if it is still cached as `mapping` (not a newer attach by another thread).
  void DropIf(const std::string& name, const ShmMapping* mapping);
  // Forgets every mapping whose name is not in `live` or whose file is gone (StillLinked()
  // false): what a client does after learning the current segments, so the memory of dead
  // segments is released instead of staying mapped (and charged) for the client's lifetime.
  // Returns how many were dropped.
  size_t Retain(const std::set<std::string>& live);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<ShmMapping>> mappings_;
  AttachListener on_attach_;
};

}  // namespace granary::transfer
