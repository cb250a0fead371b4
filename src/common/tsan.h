// common/tsan.h - telling ThreadSanitizer which memory is synchronised outside this process.
//
// A segment's object bytes live in shared memory that several processes map: the node's data
// server recv()s into it and send()s from it, clients memcpy in and out of their own mappings.
// Who may touch a range, and when, is decided by the master's protocol (a put's extents are
// written only by their writer until PutEnd; a read lease keeps them from being freed and reused)
// and carried between threads by RPCs to another process and by the data-plane sockets, none of
// which ThreadSanitizer can see. Inside one process it would therefore report every hand-over of
// a range (a write on one connection's thread, the read of the same object on another's) as a
// race. Those bytes are payload, never Granary's own state: a wrong interleaving on them is the
// protocol's business (fencing, quarantine) and the end-to-end checksum's, not a memory-model bug.
//
// The guards below make TSan ignore the current thread's reads (or writes) for their lifetime,
// the syscall interceptors' included. Wrap only the one call that moves payload bytes out of (or
// into) a segment, and only the direction that touches the segment: the other side of the copy
// (a caller's buffer) stays checked. Never put a lock, a counter or other state inside one.
// Without TSan they compile to nothing.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define GRANARY_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GRANARY_TSAN 1
#endif
#endif

#ifdef GRANARY_TSAN
extern "C" {
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
}
#endif

namespace granary {

// Reads of segment bytes (a copy or send() out of the segment).
class ScopedSegmentRead {
 public:
#ifdef GRANARY_TSAN
  ScopedSegmentRead() { AnnotateIgnoreReadsBegin(__FILE__, __LINE__); }
  ~ScopedSegmentRead() { AnnotateIgnoreReadsEnd(__FILE__, __LINE__); }
#else
  ScopedSegmentRead() {}  // user-provided: a guard held only for its scope is not "unused"
#endif
  ScopedSegmentRead(const ScopedSegmentRead&) = delete;
  ScopedSegmentRead& operator=(const ScopedSegmentRead&) = delete;
};

// Writes of segment bytes (a copy or recv() into the segment).
class ScopedSegmentWrite {
 public:
#ifdef GRANARY_TSAN
  ScopedSegmentWrite() { AnnotateIgnoreWritesBegin(__FILE__, __LINE__); }
  ~ScopedSegmentWrite() { AnnotateIgnoreWritesEnd(__FILE__, __LINE__); }
#else
  ScopedSegmentWrite() {}  // user-provided: a guard held only for its scope is not "unused"
#endif
  ScopedSegmentWrite(const ScopedSegmentWrite&) = delete;
  ScopedSegmentWrite& operator=(const ScopedSegmentWrite&) = delete;
};

}  // namespace granary
