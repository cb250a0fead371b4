// common/copy.h - the byte copy of the same-host data path, chosen per size class by measurement.
//
// Why not always memcpy: glibc 2.36 copies blocks between ~2 KiB and ~1 MiB with `rep movsb`,
// which on one AMD EPYC VM ran at 1.9 GB/s for 64 KiB chunks out of a shared-memory segment
// against 12.6 GB/s for a plain 16-byte-vector loop; on another run of the same CPU model glibc
// was the faster one at 4 MiB. So neither is hard-wired: CalibrateCopy() times both, interleaved,
// on small (64 KiB) and large (4 MiB) blocks, and each size class uses the faster from then on.
// Until a process calibrates, the vector loop is used (it was never far behind). GRANARY_COPY=
// memcpy or =vector in the environment skips the measurement and forces one routine.
// Large writes into shared memory (a put's copy into a segment, CopyIntoShared) may also stream:
// non-temporal stores skip the read of every destination line into this core's cache, which a
// plain store of a cold line pays first. The bytes are for another process's later read, never
// for this thread, and a put's destination is cold (a new extent each time): on the 2-core EPYC
// VM, 4 MiB into cold memory took 112 us streamed against 160 us with memcpy. CalibrateCopy times
// both on a destination flushed from the caches; GRANARY_COPY=stream forces streaming.
// Thread safety: CopyBytes from any thread; CalibrateCopy runs once per process (later calls
// return at once), on a background thread since it takes tens of milliseconds: the client's
// mapping warmer does it (only clients copy with CopyBytes; the node receives into its segment).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>  // _mm_sfence
#endif

namespace granary {

#if defined(__SSE2__)
namespace copy_internal {
// Copies whole 64-byte blocks of [0, n) from i on with 16-byte vectors, streamed (the
// destination from i 16-byte aligned) or not; returns where the blocks end.
template <bool kStream>
inline void Store16(char* to, __m128i v) {
  if constexpr (kStream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(to), v);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to), v);
  }
}
// Written out (four loads, then four stores): a loop over an array of four here compiled to a
// loop that copied 4 MiB at 27-29 GB/s against 30-34 (granary-bench limits, 2-core box).
template <bool kStream>
inline size_t CopyBlocks(char* d, const char* s, size_t i, size_t n) {
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    Store16<kStream>(d + i, a);
    Store16<kStream>(d + i + 16, b);
    Store16<kStream>(d + i + 32, c);
    Store16<kStream>(d + i + 48, e);
  }
  return i;
}
}  // namespace copy_internal
#endif

inline void CopyBytesVector(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const size_t i = copy_internal::CopyBlocks<false>(d, s, 0, n);
  if (i < n) std::memcpy(d + i, s + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

// memcpy with non-temporal stores: the destination lines are written to memory without being
// read into the cache first, and are not in this core's cache afterwards. Ends with a store
// fence, so the bytes are ordered before whatever this thread stores next (a commit's message).
inline void StreamBytes(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Streaming stores need 16-byte aligned destinations: the unaligned head is copied plainly.
  const size_t head = std::min(n, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  const size_t i = copy_internal::CopyBlocks<true>(d, s, head, n);
  if (i < n) std::memcpy(d + i, s + i, n - i);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

namespace copy_internal {
// Blocks of at least this many bytes are "large".
inline constexpr size_t kLargeBytes = 1 << 20;
// Per size class: true = glibc memcpy, false = the vector loop. Written by CalibrateCopy.
inline std::atomic<bool> use_memcpy_small{false};
inline std::atomic<bool> use_memcpy_large{false};
// Large copies into shared memory stream (StreamBytes). Written by CalibrateCopy.
inline std::atomic<bool> stream_large_shared{false};
}  // namespace copy_internal

inline void CopyBytes(void* dst, const void* src, size_t n) {
  const auto& use = n >= copy_internal::kLargeBytes ? copy_internal::use_memcpy_large
                                                    : copy_internal::use_memcpy_small;
  if (use.load(std::memory_order_relaxed)) {
    std::memcpy(dst, src, n);
  } else {
    CopyBytesVector(dst, src, n);
  }
}

// Whether a copy of `n` bytes into shared memory streams: large ones do if CalibrateCopy found
// that faster into cold memory. A copy cut into pieces asks once, for the whole.
inline bool StreamsIntoShared(size_t n) {
  return n >= copy_internal::kLargeBytes &&
         copy_internal::stream_large_shared.load(std::memory_order_relaxed);
}

// A copy into shared memory that another process reads later (a put's bytes into a segment):
// streamed as StreamsIntoShared(whole) says, else CopyBytes. `whole`: the copy this is a piece of.
inline void CopyIntoShared(void* dst, const void* src, size_t n, size_t whole = 0) {
  if (StreamsIntoShared(whole == 0 ? n : whole)) {
    StreamBytes(dst, src, n);
  } else {
    CopyBytes(dst, src, n);
  }
}

// What CalibrateCopy chose and measured (GB/s; 0 where it did not measure, e.g. forced).
struct CopyChoice {
  bool memcpy_small = false;
  bool memcpy_large = false;
  bool stream_large_shared = false;
  double small_memcpy_gbps = 0, small_vector_gbps = 0;
  double large_memcpy_gbps = 0, large_vector_gbps = 0;
  // 4 MiB into a destination flushed from every cache first: the large routine, and streamed.
  double cold_plain_gbps = 0, cold_stream_gbps = 0;
  std::string forced;  // the GRANARY_COPY value that decided, if any
};
// Measures once per process and sets CopyBytes' choice; returns the choice (every call).
const CopyChoice& CalibrateCopy();

}  // namespace granary
