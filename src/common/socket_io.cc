#include "common/socket_io.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

namespace granary::net {

int MillisLeft(SteadyTime deadline) {
  const auto left = deadline - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return 0;
  return static_cast<int>(std::min<int64_t>(
      std::chrono::ceil<std::chrono::milliseconds>(left).count(), 1 << 30));
}

bool WaitFor(int fd, short events, SteadyTime deadline) {
  for (;;) {  // bounded by the deadline: EINTR recomputes what is left
    const int left = MillisLeft(deadline);
    if (left == 0) return false;
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, left);
    if (ready > 0) return true;  // ready, or an error that the next send/recv reports
    if (ready < 0 && errno != EINTR) return true;
  }
}

Result<int> ConnectFirst(const addrinfo* addresses, SteadyTime deadline, const std::string& what) {
  std::string why = "no address";
  for (const addrinfo* a = addresses; a; a = a->ai_next) {  // bounded by the list
    if (MillisLeft(deadline) == 0) {
      return Status(ErrorCode::RPC_TIMEOUT, "cannot connect to " + what + " in time");
    }
    int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (rc != 0 && err == EINPROGRESS) {
      socklen_t len = sizeof(err);
      if (!WaitFor(fd, POLLOUT, deadline)) {
        err = ETIMEDOUT;
      } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        err = errno;
      }
    }
    if (err == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    why = std::strerror(err);
    ::close(fd);
  }
  return Status(ErrorCode::RPC_FAIL, "cannot connect to " + what + ": " + why);
}

Result<int> ConnectTcp(const std::string& host, uint16_t port, SteadyTime deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) {
    return Status(ErrorCode::RPC_FAIL, "cannot resolve " + host);
  }
  Result<int> fd = ConnectFirst(found, deadline, host + ":" + std::to_string(port));
  ::freeaddrinfo(found);
  return fd;
}

Status SendAll(int fd, std::string_view bytes, SteadyTime deadline, size_t* sent_out) {
  size_t sent = 0;
  Status s = Status::Ok();
  while (sent < bytes.size()) {  // bounded: each pass sends, or waits toward the deadline
    ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (WaitFor(fd, POLLOUT, deadline)) continue;
      s = Status(ErrorCode::RPC_TIMEOUT, "send timed out");
      break;
    }
    s = Status(ErrorCode::RPC_FAIL, std::string("send failed: ") +
                                        (n < 0 ? std::strerror(errno) : "connection closed"));
    break;
  }
  if (sent_out != nullptr) *sent_out = sent;
  return s;
}

Status RecvExact(int fd, char* out, size_t n, SteadyTime deadline) {
  size_t got = 0;
  while (got < n) {  // bounded: each pass receives, or waits toward the deadline
    ssize_t r = ::recv(fd, out + got, n - got, MSG_DONTWAIT);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return Status(ErrorCode::RPC_FAIL, "connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!WaitFor(fd, POLLIN, deadline)) return Status(ErrorCode::RPC_TIMEOUT, "receive timed out");
      continue;
    }
    return Status(ErrorCode::RPC_FAIL, std::string("receive failed: ") + std::strerror(errno));
  }
  return Status::Ok();
}

unsigned AbstractUnixAddress(std::string_view name, sockaddr_un* addr) {
  *addr = sockaddr_un{};
  if (name.empty() || name.size() + 1 > sizeof(addr->sun_path)) return 0;
  addr->sun_family = AF_UNIX;
  std::memcpy(addr->sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  return static_cast<unsigned>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

}  // namespace granary::net
