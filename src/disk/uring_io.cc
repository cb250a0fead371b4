// disk/uring_io.cc - the io_uring implementation of DiskIo (see disk_io.h for the promise).
//
// One ring per thread, created on the thread's first Run() and torn down when the thread exits:
// rings are not thread-safe, and a lock around a shared ring would serialise every reader of the
// node. Each ring has its thread's staging area registered as fixed buffer 0 when the kernel allows
// it, so writes gathered there (every write of the disk tier) skip the per-request page pinning.
// Requests whose buffer lies elsewhere (reads into callers' buffers) use plain READ/WRITE.
#include <liburing.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/tsan.h"
#include "disk/disk_io.h"

#ifdef GRANARY_TSAN
extern "C" {
void AnnotateHappensBefore(const char* file, int line, const volatile void* addr);
void AnnotateHappensAfter(const char* file, int line, const volatile void* addr);
}
#endif

namespace granary::disk {

namespace {

// liburing maps and unmaps a ring's memory with raw system calls, which ThreadSanitizer does not
// see: a ring created at the address where an exited thread's ring was looks to it like that
// thread's memory, written again without synchronisation. The kernel orders the old unmap before
// the new map; these two calls tell TSan so. Nothing without TSan.
[[maybe_unused]] char ring_memory_handoff;
void RingMemoryReleased() {
#ifdef GRANARY_TSAN
  AnnotateHappensBefore(__FILE__, __LINE__, &ring_memory_handoff);
#endif
}
void RingMemoryAcquired() {
#ifdef GRANARY_TSAN
  AnnotateHappensAfter(__FILE__, __LINE__, &ring_memory_handoff);
#endif
}

constexpr unsigned kRingEntries = 256;     // >= the largest queue depth MakeDiskIo accepts
constexpr uint64_t kMaxPiece = 1ull << 30;  // larger requests continue in pieces

struct ThreadRing {
  io_uring ring{};
  bool ring_ok = false;
  std::byte* staging = nullptr;
  bool staging_registered = false;

  ThreadRing() {
    ring_ok = io_uring_queue_init(kRingEntries, &ring, 0) == 0;
    if (ring_ok) RingMemoryAcquired();
    void* p = mmap(nullptr, kStagingBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    staging = static_cast<std::byte*>(p);
    if (!ring_ok) return;
    // Registered pages stay pinned for the ring's life. Small pages keep that pinning at 4 KiB
    // granularity and keep khugepaged from trying (and failing) to collapse pinned memory.
    madvise(staging, kStagingBytes, MADV_NOHUGEPAGE);
    iovec iov{staging, kStagingBytes};
    // Fails under a small RLIMIT_MEMLOCK (non-root) or an old kernel: plain requests then.
    staging_registered = io_uring_register_buffers(&ring, &iov, 1) == 0;
  }
  ~ThreadRing() {
    if (ring_ok) {
      RingMemoryReleased();
      io_uring_queue_exit(&ring);
    }
    if (staging) munmap(staging, kStagingBytes);
  }
  bool InStaging(const std::byte* p, uint64_t n) const {
    return staging_registered && p >= staging && p + n <= staging + kStagingBytes;
  }
  static ThreadRing& Get() {
    thread_local ThreadRing tr;
    return tr;
  }
};

class UringIo final : public DiskIo {
 public:
  explicit UringIo(int queue_depth) : queue_depth_(static_cast<unsigned>(queue_depth)) {}
  IoMode mode() const override { return IoMode::kUring; }

  std::span<std::byte> Staging() override {
    ThreadRing& tr = ThreadRing::Get();
    if (!tr.staging) return {};
    return {tr.staging, kStagingBytes};
  }

  void Run(std::span<IoRequest> requests) override {
    ThreadRing& tr = ThreadRing::Get();
    if (!tr.ring_ok) {
      // The probe passed but this thread could not get a ring (e.g. out of locked memory).
      internal::MakePosixIo(1)->Run(requests);
      return;
    }
    const size_t n = requests.size();
    std::vector<uint64_t> done(n, 0);
    std::vector<uint32_t> queue(n);  // requests (or their continuations) waiting for a slot
    for (size_t i = 0; i < n; ++i) {
      queue[i] = static_cast<uint32_t>(i);
      requests[i].result = 0;
    }
    size_t head = 0;
    unsigned inflight = 0;
    while (head < queue.size() || inflight > 0) {
      while (inflight < queue_depth_ && head < queue.size()) {
        io_uring_sqe* sqe = io_uring_get_sqe(&tr.ring);
        if (!sqe) break;
        uint32_t i = queue[head++];
        IoRequest& r = requests[i];
        std::byte* buf = r.buffer + done[i];
        unsigned len = static_cast<unsigned>(std::min(r.length - done[i], kMaxPiece));
        uint64_t off = r.offset + done[i];
        if (tr.InStaging(buf, len)) {
          if (r.write) io_uring_prep_write_fixed(sqe, r.fd, buf, len, off, 0);
          else io_uring_prep_read_fixed(sqe, r.fd, buf, len, off, 0);
        } else {
          if (r.write) io_uring_prep_write(sqe, r.fd, buf, len, off);
          else io_uring_prep_read(sqe, r.fd, buf, len, off);
        }
        io_uring_sqe_set_data64(sqe, i);
        ++inflight;
      }
      int ret = io_uring_submit_and_wait(&tr.ring, 1);
      if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
        // Only a broken ring gets here. Requests already in the kernel still complete into their
        // buffers, so wait for them before handing the buffers back.
        GLOG_ERROR("io_uring submit failed: {}", std::strerror(-ret));
        FailRemaining(tr, requests, queue, head, inflight, ret);
        return;
      }
      io_uring_cqe* cqe = nullptr;
      while (io_uring_peek_cqe(&tr.ring, &cqe) == 0) {
        uint32_t i = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
        int res = cqe->res;
        io_uring_cqe_seen(&tr.ring, cqe);
        --inflight;
        IoRequest& r = requests[i];
        if (res == -EAGAIN || res == -EINTR) {
          queue.push_back(i);
        } else if (res < 0) {
          r.result = res;
        } else if (res == 0) {
          r.result = static_cast<int64_t>(done[i]);  // end of file
        } else {
          done[i] += static_cast<uint64_t>(res);
          if (done[i] < r.length) queue.push_back(i);  // short: continue where it stopped
          else r.result = static_cast<int64_t>(done[i]);
        }
      }
    }
  }

 private:
  static void FailRemaining(ThreadRing& tr, std::span<IoRequest> requests,
                            const std::vector<uint32_t>& queue, size_t head, unsigned inflight, int err) {
    for (size_t q = head; q < queue.size(); ++q) requests[queue[q]].result = err;
    // The kernel may still write into the buffers of reads in flight, and the caller reuses them
    // (staging slots, client memory) once this returns: wait for every one. The block layer's
    // own timeouts bound that; past two minutes the node stops rather than risk wrong bytes.
    for (int tries = 0; inflight > 0; ++tries) {
      if (tries >= 100 + 120) {
        GLOG_ERROR("io_uring: {} requests still in flight 2 minutes after the ring broke; "
                   "stopping rather than reuse their buffers", inflight);
        std::abort();
      }
      __kernel_timespec ts{tries < 100 ? 0 : 1, tries < 100 ? 10'000'000 : 0};
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe_timeout(&tr.ring, &cqe, &ts) == 0) {
        uint32_t i = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
        requests[i].result = err;
        io_uring_cqe_seen(&tr.ring, cqe);
        --inflight;
      }
    }
  }

  unsigned queue_depth_;
};

bool ProbeUring() {
  io_uring ring{};
  if (io_uring_queue_init(4, &ring, 0) != 0) return false;
  RingMemoryAcquired();
  bool ok = false;
  if (io_uring_sqe* sqe = io_uring_get_sqe(&ring)) {
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, 42);
    io_uring_cqe* cqe = nullptr;
    if (io_uring_submit(&ring) == 1 && io_uring_wait_cqe(&ring, &cqe) == 0) {
      ok = cqe->res == 0 && io_uring_cqe_get_data64(cqe) == 42;
      io_uring_cqe_seen(&ring, cqe);
    }
  }
  RingMemoryReleased();
  io_uring_queue_exit(&ring);
  return ok;
}

}  // namespace

bool UringUsable() {
  static const bool usable = ProbeUring();
  return usable;
}

namespace internal {
std::unique_ptr<DiskIo> MakeUringIo(int queue_depth) { return std::make_unique<UringIo>(queue_depth); }
}  // namespace internal

}  // namespace granary::disk
