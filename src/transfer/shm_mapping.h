// transfer/shm_mapping.h - a client's view of a node's segment in named POSIX shared memory.
//
// Promise: Attach() maps an existing segment (made by the node's node::ShmSegment) read-write, so a
// client on the same host moves bytes with memcpy: puts write into it, gets read from it. It never
// creates, resizes or unlinks the segment; the node alone owns its lifetime. A mapping outlives
// the name (the kernel keeps the pages until the last munmap), so after a node restart a cached
// mapping is a dead copy: the caller Drop()s a name when the master reports a new segment token
// for it, or when a Get() through the mapping fails its checksum.
// SIGBUS: if the node did not prefault its segment and /dev/shm fills up, the first write to a
// page not yet backed kills the writer with SIGBUS; nodes sharing memory with clients should
// prefault (see node/shm_segment.h).
// Ownership: a ShmMapping owns its mapping (munmap in the destructor). ShmMappingCache hands out
// shared_ptrs, so Drop() never unmaps memory another thread is still copying from.
// Thread safety: ShmMapping is immutable after Attach (the bytes are shared; the master's protocol
// keeps readers and writers of a range apart). ShmMappingCache is safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
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

class ShmMapping {
 public:
  // Maps the segment "/<name>". SEGMENT_NOT_FOUND if no such segment exists on this host;
  // INVALID_PARAMS if the name is invalid or its size is not `expected_size` (both named);
  // TRANSFER_FAIL for other failures (e.g. permission: segments are mode 0600, same user only).
  static Result<std::unique_ptr<ShmMapping>> Attach(const std::string& name,
                                                    uint64_t expected_size);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  ShmMapping(std::string name, std::byte* data, uint64_t size)
      : name_(std::move(name)), data_(data), size_(size) {}

  std::string name_;
  std::byte* data_;
  uint64_t size_;
};

// One mapping per segment name, made on first use and reused: attaching costs syscalls and page
// faults that a per-Get attach would pay again and again.
class ShmMappingCache {
 public:
  // The mapping of `name`, attaching it on first use. A cached mapping of another size (the node
  // restarted with a new size) is replaced. Errors are those of ShmMapping::Attach.
  Result<std::shared_ptr<ShmMapping>> Get(const std::string& name, uint64_t size);
  // Forgets `name`; the memory is unmapped when the last holder lets go.
  void Drop(const std::string& name);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<ShmMapping>> mappings_;
};

}  // namespace granary::transfer
