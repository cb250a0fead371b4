// client/split_copy.h - one large copy to or from a segment on this host, shared between the
// calling thread and one worker of the client's pool, and hashed as one thread would hash it.
//
// Why: a copy and its XXH3 pass on one thread left a 4 MiB same-host put or get at ~0.6x of a
// plain memcpy on the 2-core box (bench/profiles/put4m-split-copy-2026-11-29.txt). The checksum
// cannot be split (XXH3 is one sequential state, and its format stays), the copy can. A get: the
// range's head is copied and hashed by one thread while the other copies the tail, which the
// caller then hashes, still in its cache, continuing from the head's state. A put: one thread
// copies the head while the other hashes the caller's bytes and then copies the tail; large
// copies into the segment stream past the cache (CopyIntoShared, common/copy.h).
// Promise: the bytes land as CopyBytes would land them and `sum` ends in the state one thread's
// CopyAndUpdateSource (a put) or CopyAndUpdate (a get) would leave: the hash reads only the
// private side of the copy (the caller's buffer), never the segment. Returns once both halves
// are done; with no pool, or below kSplitCopyBytes, it is that one-thread call.
// Thread safety: any thread; the pool runs nested and concurrent ParallelFor calls (a batch's
// transfers already on its workers still progress: the caller works too).
#pragma once

#include <cstddef>

#include "common/checksum.h"
#include "common/thread_pool.h"

namespace granary::client {

// Ranges from this size up are split. Below it the hand-over to a worker (a wake-up, tens of
// microseconds on a busy VM) costs more than the second thread wins.
inline constexpr size_t kSplitCopyBytes = 1 << 20;

// A put: src is the caller's buffer (hashed), dst is segment memory.
void SplitCopyToSegment(ThreadPool* pool, ChecksumStream& sum, std::byte* dst,
                        const std::byte* src, size_t n);
// A get: src is segment memory, dst is the caller's buffer (hashed, after the copy).
void SplitCopyFromSegment(ThreadPool* pool, ChecksumStream& sum, std::byte* dst,
                          const std::byte* src, size_t n);

}  // namespace granary::client
