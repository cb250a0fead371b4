// disk/staged_writer.h - gathers what the disk tier writes into the thread's aligned staging area
// and writes it in batches.
//
// Promise: Put(fd, offset, bytes, tag) writes `bytes` at `offset` (4 KiB-aligned) followed by zeros
// up to the next 4 KiB boundary, so unaligned sources (callers' values, encoded metadata) reach
// O_DIRECT files through one aligned bounce area. Puts are buffered; when the staging area is full,
// and at Flush(), everything staged goes out as up to 1 MiB requests issued together. A Put that
// continues the previous one in the same file joins its request. Every tag whose bytes failed to
// reach the file is reported by Flush() with the first errno seen, so callers can fail exactly
// the objects (or buckets) concerned.
// Ownership: borrows the DiskIo and the calling thread's staging area; the fds stay the caller's.
// Thread safety: one writer per thread, used by that thread only (the staging area is per thread).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "disk/disk_io.h"

namespace granary::disk {

class StagedWriter {
 public:
  explicit StagedWriter(DiskIo& io);

  bool ok() const { return !staging_.empty(); }  // false: no staging memory (mmap failed)

  void Put(int fd, uint64_t offset, std::span<const std::byte> bytes, uint32_t tag);

  // Writes everything staged; returns the failures of this writer since the last Flush (tag ->
  // errno; a short write counts as ENOSPC, the only way a regular file write comes up short).
  std::map<uint32_t, int> Flush();

  uint64_t bytes_written() const { return bytes_written_; }

 private:
  struct Run {
    int fd;
    uint64_t file_offset;
    size_t staging_offset;
    size_t length;
    uint32_t tag;
  };
  void Drain();  // writes the staged runs; records failures

  DiskIo& io_;
  std::span<std::byte> staging_;
  size_t used_ = 0;
  std::vector<Run> runs_;
  std::map<uint32_t, int> failures_;
  uint64_t bytes_written_ = 0;
};

}  // namespace granary::disk
