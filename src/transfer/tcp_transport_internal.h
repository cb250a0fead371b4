// transfer/tcp_transport_internal.h - what tcp_transport.cc and tcp_transport_disk.cc share:
// the pooled connection and endpoint records, and the blocking-call helpers with their errno
// conventions (kEof for a peer that closed). Internal to the TCP transport; not for callers.
// Threads: an Endpoint's idle list under its mu; a Conn belongs to the request that checked it out.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "granary/status.h"
#include "transfer/iovec.h"
#include "transfer/protocol.h"
#include "transfer/tcp_transport.h"

namespace granary::transfer {

namespace tcp_internal {

inline constexpr int kEof = -1;  // an "errno" for a peer that closed the connection
// A lone lane's payload moves in blocking calls of this much (MSG_WAITALL on receive): one wake
// per piece instead of one poll + recv per socket-buffer's worth, and a piece is hashed while
// it is still in the core's L2 (512 KiB here).
inline constexpr uint64_t kPiece = 256 << 10;
// A pooled connection idle at least this long is probed for a close before reuse (Checkout).
inline constexpr int64_t kProbeAfterIdleMs = 100;

inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline std::string ErrnoText(int err) {
  return err == kEof ? "connection closed by the node" : std::strerror(err);
}

// The node's refusal codes, as protocol.h defines them.
inline std::string RefusalText(ErrorCode code, bool capability) {
  std::string text(ErrorCodeName(code));
  if (code == ErrorCode::SEGMENT_NOT_FOUND) {
    text += capability ? " (capability expired, or of an earlier mount)"
                       : " (stale segment token: the node restarted)";
  }
  if (code == ErrorCode::INVALID_PARAMS) text += " (range outside the segment)";
  if (code == ErrorCode::PERMISSION_DENIED) text += " (outside the capability's range or access)";
  return text;
}

inline const char* OpName(Opcode op) {
  switch (op) {
    case Opcode::kRead:
      return "READ";
    case Opcode::kWrite:
      return "WRITE";
    case Opcode::kPing:
      return "PING";
    case Opcode::kDiskRead:
      return "DISK_READ";
    case Opcode::kDiskStage:
      return "DISK_STAGE";
    case Opcode::kStageRelease:
      return "STAGE_RELEASE";
    case Opcode::kStageInfo:
      return "STAGE_INFO";
    case Opcode::kCapRead:
      return "CAP_READ";
    case Opcode::kCapWrite:
      return "CAP_WRITE";
  }
  return "?";
}

// Moves all of iov on a non-blocking socket, waiting at most timeout_ms for each step of
// progress. 0 on success, else an errno (kEof for a closed peer, ETIMEDOUT).
inline int SendFully(int fd, iovec* iov, int iovcnt, int timeout_ms) {
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    ssize_t r = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
      pollfd pfd{fd, POLLOUT, 0};
      int rc = poll(&pfd, 1, timeout_ms);
      if (rc == 0) return ETIMEDOUT;
      if (rc < 0 && errno != EINTR) return errno;
      continue;
    }
    ConsumeIov(&iov, &iovcnt, static_cast<size_t>(r));
  }
  return 0;
}

inline int RecvFully(int fd, void* buf, size_t n, int timeout_ms) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return kEof;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    pollfd pfd{fd, POLLIN, 0};
    int rc = poll(&pfd, 1, timeout_ms);
    if (rc == 0) return ETIMEDOUT;
    if (rc < 0 && errno != EINTR) return errno;
  }
  return 0;
}

}  // namespace tcp_internal

struct TcpTransport::Conn {
  int fd = -1;  // blocking, SO_RCVTIMEO/SO_SNDTIMEO = io_timeout_ms; see Connect
  int64_t idle_since_ms = 0;
  bool from_pool = false;  // reused: may have been closed by the node since
};

struct TcpTransport::Endpoint {
  std::string name;
  std::vector<sockaddr_storage> addrs;
  std::vector<socklen_t> addr_lens;
  std::mutex mu;  // guards idle and dropped
  std::vector<Conn> idle;
  bool dropped = false;
};

}  // namespace granary::transfer
