// A raw client socket for the data plane's tests, speaking the wire format by hand so hostile
// frames can be sent. Every receive gives up after 5 s so a broken server fails, never hangs;
// EINTR is retried (io_uring task work interrupts the thread that owns a ring).
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "transfer/protocol.h"

namespace granary::testing {

class RawConn {
 public:
  explicit RawConn(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval tv{5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int one = 1;  // a header and its payload may go in two sends: no Nagle wait between them
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~RawConn() { close(fd_); }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  bool connected() const { return connected_; }
  int fd() const { return fd_; }

  bool Send(const void* data, size_t n) {
    auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      ssize_t r = send(fd_, p, n, MSG_NOSIGNAL);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  bool SendHeader(const transfer::RequestHeader& h) { return Send(&h, sizeof(h)); }
  bool Recv(void* data, size_t n) {
    auto* p = static_cast<uint8_t*>(data);
    while (n > 0) {
      ssize_t r = recv(fd_, p, n, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  std::optional<transfer::ResponseHeader> RecvResponse() {
    transfer::ResponseHeader rh;
    if (!Recv(&rh, sizeof(rh))) return std::nullopt;
    return rh;
  }
  // True when the server closed the connection (EOF or reset) rather than answering or timing out.
  bool ClosedByPeer() {
    char c;
    ssize_t r;
    do {
      r = recv(fd_, &c, 1, 0);
    } while (r < 0 && errno == EINTR);
    return r == 0 || (r < 0 && errno == ECONNRESET);
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// True when `conn` has something to read now: bytes, or the server's close.
inline bool Readable(RawConn& conn) {
  pollfd pfd{conn.fd(), POLLIN, 0};
  return poll(&pfd, 1, 0) == 1;
}

}  // namespace granary::testing
