#include "client/split_copy.h"

#include "common/copy.h"
#include "common/tsan.h"

namespace granary::client {
namespace {

// Cuts fall on 64 KiB boundaries, the copy-and-hash chunk.
constexpr size_t kChunkMask = (64 << 10) - 1;

// A put: the hash reads the caller's bytes, which do not depend on the copy. The calling thread
// copies the head; the other thread hashes the whole range (in cache, ~2x the copy's speed),
// then copies the tail. Into cold memory the copy is bound by memory, not by the core (a streamed
// 4 MiB: ~110 us one thread, no faster on two, on the 2-core box), so the hash hides behind it.
void SplitToSegment(ThreadPool& pool, ChecksumStream& sum, std::byte* dst, const std::byte* src,
                    size_t n) {
  const size_t head = (n * 3 / 4) & ~kChunkMask;
  pool.ParallelFor(2, [&](size_t item) {
    if (item == 0) {  // often the calling thread's: it claims as soon as it has queued the other
      ScopedSegmentWrite payload;
      CopyIntoShared(dst, src, head, n);
    } else {
      sum.Update(src, n);
      ScopedSegmentWrite payload;  // the copy's stores only: the hash's state stays checked
      CopyIntoShared(dst + head, src + head, n - head, n);
    }
  });
}

// A get: the hash must read the caller's buffer after the copy (never the segment), in order.
// A worker copies and hashes the head; the calling thread copies the tail, then continues the
// head's hash over the tail, which is still in its own cache.
void SplitFromSegment(ThreadPool& pool, ChecksumStream& sum, std::byte* dst, const std::byte* src,
                      size_t n) {
  // The head is a little shorter: its thread also hashes it.
  const size_t head = (n * 7 / 16) & ~kChunkMask;
  ChecksumStream head_sum = sum;  // continues from the parts already hashed
  pool.ParallelFor(2, [&](size_t item) {
    ScopedSegmentRead payload;  // the segment's loads (and, within CopyAndUpdate, the hash's)
    if (item == 1) {
      head_sum.CopyAndUpdate(dst, src, head);
    } else {
      CopyBytes(dst + head, src + head, n - head);
    }
  });
  sum = head_sum;
  sum.Update(dst + head, n - head);
}

}  // namespace

void SplitCopyToSegment(ThreadPool* pool, ChecksumStream& sum, std::byte* dst,
                        const std::byte* src, size_t n) {
  if (pool == nullptr || n < kSplitCopyBytes) {
    ScopedSegmentWrite payload;  // as before the split: the stores into the segment
    sum.CopyAndUpdateSource(dst, src, n);
  } else {
    SplitToSegment(*pool, sum, dst, src, n);
  }
}

void SplitCopyFromSegment(ThreadPool* pool, ChecksumStream& sum, std::byte* dst,
                          const std::byte* src, size_t n) {
  if (pool == nullptr || n < kSplitCopyBytes) {
    ScopedSegmentRead payload;
    sum.CopyAndUpdate(dst, src, n);
  } else {
    SplitFromSegment(*pool, sum, dst, src, n);
  }
}

}  // namespace granary::client
