// node/data_conn.h - one data-server connection's state between readiness events (internal to
// node::DataServer; see data_server.h).
//
// Promise: holds where a connection is in its current request (which phase, how many bytes of
// it so far) so any I/O thread can resume it after EAGAIN, and when it must be dropped.
// Ownership: the server owns every DataConn (shared, so a late event finds it closed rather than
// freed) and its fd; the segment bytes `payload` points at belong to the server's caller.
// Threads: whoever holds `mu` drives the connection (one I/O thread at a time, EPOLLONESHOT, or
// the disk thread serving its DISK_READ); `deadline_ns` alone is read without it, by the timer.
#pragma once

#include <time.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "transfer/protocol.h"

namespace granary::node {

// CLOCK_MONOTONIC in nanoseconds: deadlines are compared across threads as plain integers.
inline int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

inline constexpr int64_t kNoDeadline = std::numeric_limits<int64_t>::max();
// The epoll key of the server's stop event: connection ids start at 1.
inline constexpr uint64_t kStopEventKey = 0;

struct DataConn {
  enum class Phase : uint8_t {
    kHeader,   // reading a RequestHeader (header_got bytes of it so far)
    kBody,     // reading a small request body into `body` (DISK_*, STAGE_RELEASE)
    kPayload,  // receiving a WRITE's payload straight into the segment
    kDrain,    // discarding a fenced WRITE's payload (into the I/O thread's scratch)
    kSend,     // sending `response` then `payload`
    kDisk,     // queued for or held by a disk thread; the timer expires it only while queued
  };

  DataConn(int fd_in, uint64_t id_in) : fd(fd_in), id(id_in) {}

  const int fd;       // closed by the server, under its lock, once `closed` is set
  const uint64_t id;  // epoll's key for it, and the owner of its staging slots
  std::mutex mu;
  bool closed = false;

  Phase phase = Phase::kHeader;
  transfer::RequestHeader request;
  transfer::Capability capability;  // CAP_READ / CAP_WRITE: follows the header
  size_t header_got = 0;            // of the header, then of the capability
  // A request's first receive asks for a header and a capability at once (one system call for
  // a CAP_* request's 88 bytes, not two); what came beyond the header belongs to what follows
  // it (a payload, a body, the next request) and is taken from here before the socket.
  uint8_t ahead[sizeof(transfer::RequestHeader) + sizeof(transfer::Capability)];
  uint8_t ahead_len = 0;
  uint8_t ahead_pos = 0;
  bool HasAhead() const { return ahead_pos < ahead_len; }
  std::vector<uint8_t> body;  // grows as its bytes arrive, never ahead of them
  uint64_t body_charged = 0;  // of the server's bound on bytes held for partial bodies
  uint64_t done = 0;  // bytes of the body, payload or drain so far
  uint8_t* target = nullptr;  // a WRITE's first byte, in the memory of the mount that accepted it
  int32_t drain_status = 0;  // the refusal a drained WRITE gets once its payload is gone
  bool close_after_answer = false;  // a WRITE refused at its header: answered, then closed

  transfer::ResponseHeader response;
  std::vector<uint8_t> out;          // a response payload the server built (STAGE_*)
  const uint8_t* payload = nullptr;  // `out`, a segment range (its mount's memory), or null
  uint64_t payload_len = 0;
  uint64_t sent = 0;                 // of header + payload
  bool sending_segment = false;      // a READ's answer: counted in bytes_read when complete

  int64_t request_start_ns = 0;  // the request's first header byte
  int64_t last_progress_ns = 0;  // the last byte in either direction
  std::atomic<int64_t> deadline_ns{kNoDeadline};

  // Mid-request: cutting the connection now loses a request (counted as an error).
  bool MidRequest() const {
    return header_got > 0 || phase == Phase::kBody || phase == Phase::kPayload ||
           phase == Phase::kDrain || (phase == Phase::kSend && sending_segment);
  }
};

}  // namespace granary::node
