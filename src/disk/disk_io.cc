// disk/disk_io.cc - the POSIX implementation, the factory and AlignedBuffer (io_uring: uring_io.cc).
#include "disk/disk_io.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace granary::disk {

std::string_view IoModeName(IoMode mode) {
  switch (mode) {
    case IoMode::kAuto: return "auto";
    case IoMode::kUring: return "io_uring";
    case IoMode::kPosix: return "posix";
  }
  return "?";
}

Result<IoMode> ParseIoMode(std::string_view text) {
  if (text == "auto") return IoMode::kAuto;
  if (text == "io_uring" || text == "uring") return IoMode::kUring;
  if (text == "posix") return IoMode::kPosix;
  return Result<IoMode>(ErrorCode::INVALID_PARAMS,
                        "unknown disk io mode '" + std::string(text.substr(0, 64)) +
                            "': expected auto, io_uring or posix");
}

AlignedBuffer::AlignedBuffer(size_t size) : size_(size) {
  if (size == 0) return;
  void* p = nullptr;
  if (posix_memalign(&p, kBlockSize, AlignUp(size)) != 0) {
    size_ = 0;
    return;
  }
  data_ = static_cast<std::byte*>(p);
  std::memset(data_, 0, AlignUp(size));
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

namespace {

// Linux moves at most this much per read/write call; larger requests continue in pieces.
constexpr uint64_t kMaxPiece = 1ull << 30;

class PosixIo final : public DiskIo {
 public:
  IoMode mode() const override { return IoMode::kPosix; }

  void Run(std::span<IoRequest> requests) override {
    for (auto& r : requests) {
      uint64_t done = 0;
      r.result = 0;
      while (done < r.length) {
        size_t piece = static_cast<size_t>(std::min(r.length - done, kMaxPiece));
        ssize_t n = r.write ? ::pwrite(r.fd, r.buffer + done, piece, static_cast<off_t>(r.offset + done))
                            : ::pread(r.fd, r.buffer + done, piece, static_cast<off_t>(r.offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          r.result = -errno;
          break;
        }
        if (n == 0) break;  // end of file (reads); a write of 0 bytes cannot progress either
        done += static_cast<uint64_t>(n);
      }
      if (r.result == 0) r.result = static_cast<int64_t>(done);
    }
  }

  std::span<std::byte> Staging() override {
    // Plain anonymous memory: page-aligned, so 4 KiB-aligned, and never touched by other threads.
    thread_local struct Area {
      std::byte* data = nullptr;
      ~Area() {
        if (data) munmap(data, kStagingBytes);
      }
    } area;
    if (!area.data) {
      void* p = mmap(nullptr, kStagingBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return {};
      area.data = static_cast<std::byte*>(p);
    }
    return {area.data, kStagingBytes};
  }
};

}  // namespace

namespace internal {
std::unique_ptr<DiskIo> MakePosixIo(int /*queue_depth*/) { return std::make_unique<PosixIo>(); }
}  // namespace internal

Result<std::unique_ptr<DiskIo>> MakeDiskIo(IoMode mode, int queue_depth) {
  if (queue_depth < 1 || queue_depth > 256) {
    return Result<std::unique_ptr<DiskIo>>(
        ErrorCode::INVALID_PARAMS, "disk queue depth " + std::to_string(queue_depth) + " is outside 1..256");
  }
  if (mode == IoMode::kPosix) return internal::MakePosixIo(queue_depth);
  if (UringUsable()) return internal::MakeUringIo(queue_depth);
  if (mode == IoMode::kUring) {
    return Result<std::unique_ptr<DiskIo>>(
        ErrorCode::INVALID_PARAMS,
        "disk io mode io_uring was asked for but this process cannot use io_uring (kernel setting "
        "io_uring_disabled, seccomp or an old kernel); use 'auto' or 'posix'");
  }
  return internal::MakePosixIo(queue_depth);
}

}  // namespace granary::disk
