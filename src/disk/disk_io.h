// disk/disk_io.h - the block I/O layer under the disk tier: batches of positional reads and
// writes, issued together and waited for together.
//
// Promise: Run() issues every request of a batch with up to `queue_depth` of them in flight at once
// and returns when all have finished; each request's `result` is then the number of bytes moved
// (a short count means end of file) or -errno. Short transfers that are not end of file (signals,
// requests above the per-call kernel limit) are continued until done, so callers only see a short
// count when the file really ended. Two implementations:
//   - io_uring: one ring per thread (thread_local: no lock between threads), many reads in one
//     submission, the thread's staging area registered as a fixed buffer when the kernel allows
//     (READ_FIXED / WRITE_FIXED for requests that lie in it);
//   - POSIX: pread / pwrite, one request after the other.
// Requests on O_DIRECT files must have 4 KiB-aligned buffers, offsets and lengths (the callers in
// this directory ensure it; see kBlockSize).
// Ownership: a DiskIo owns nothing but its settings; each thread's ring and staging area belong to
// that thread and are released when it exits. Callers own the buffers and file descriptors.
// Thread safety: Run() and Staging() from any thread at once; Staging() returns the CALLING
// thread's area, valid until that thread exits.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "granary/status.h"

namespace granary::disk {

// O_DIRECT's unit: buffers, file offsets and lengths are multiples of it on every path.
inline constexpr uint64_t kBlockSize = 4096;
inline constexpr uint64_t AlignUp(uint64_t n) { return (n + kBlockSize - 1) / kBlockSize * kBlockSize; }
inline constexpr bool IsAligned(uint64_t n) { return n % kBlockSize == 0; }

// Each thread's staging area: where writes are gathered into aligned blocks.
inline constexpr size_t kStagingBytes = 16u << 20;

enum class IoMode { kAuto, kUring, kPosix };
std::string_view IoModeName(IoMode mode);
Result<IoMode> ParseIoMode(std::string_view text);  // "auto", "io_uring" (or "uring"), "posix"

struct IoRequest {
  int fd = -1;
  bool write = false;
  std::byte* buffer = nullptr;
  uint64_t length = 0;
  uint64_t offset = 0;
  int64_t result = 0;  // out: bytes moved (short = end of file), or -errno
};

class DiskIo {
 public:
  virtual ~DiskIo() = default;
  virtual IoMode mode() const = 0;  // kUring or kPosix, never kAuto
  virtual void Run(std::span<IoRequest> requests) = 0;
  // The calling thread's staging area: kStagingBytes, 4 KiB aligned, created on first use.
  virtual std::span<std::byte> Staging() = 0;
};

// True when this process may create and use an io_uring (the kernel or a seccomp policy may forbid
// it: io_uring_disabled, containers). Probed once, by a real NOP round trip.
bool UringUsable();

// kAuto picks io_uring when UringUsable(), else POSIX. kUring when the probe fails is an error
// (INVALID_PARAMS) so an operator who asked for it knows. queue_depth: 1..256.
Result<std::unique_ptr<DiskIo>> MakeDiskIo(IoMode mode, int queue_depth = 32);

// A heap buffer aligned to kBlockSize, zero-filled, for O_DIRECT. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> span() const { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

namespace internal {
// The two implementations, for tests that name one explicitly (MakeDiskIo is the normal way).
std::unique_ptr<DiskIo> MakePosixIo(int queue_depth);
std::unique_ptr<DiskIo> MakeUringIo(int queue_depth);  // caller checked UringUsable()
}  // namespace internal

}  // namespace granary::disk
