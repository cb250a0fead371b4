// tools/bench/kv_socket.cc - see kv_socket.h.
#include "tools/bench/kv_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace granary::bench {
namespace {

Status IoError(const std::string& what) {
  return Status(ErrorCode::TRANSFER_FAIL, what + ": " + std::strerror(errno));
}

}  // namespace

LineSocket::LineSocket(int fd) : fd_(fd), staging_(64 << 10) {}
LineSocket::~LineSocket() { close(fd_); }

Result<std::unique_ptr<LineSocket>> LineSocket::Connect(const std::string& address) {
  using R = Result<std::unique_ptr<LineSocket>>;
  auto colon = address.rfind(':');
  if (colon == std::string::npos) return R(ErrorCode::INVALID_PARAMS, "address " + address);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(address.substr(0, colon).c_str(), address.c_str() + colon + 1, &hints, &found) != 0) {
    return R(ErrorCode::INVALID_PARAMS, "address " + address);
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int ok = fd >= 0 ? connect(fd, found->ai_addr, found->ai_addrlen) : -1;
  freeaddrinfo(found);
  if (ok != 0) {
    Status s = IoError("connect " + address);
    if (fd >= 0) close(fd);
    return s;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval timeout{30, 0};  // a stuck server fails the case instead of hanging the run
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  return std::unique_ptr<LineSocket>(new LineSocket(fd));
}

Status LineSocket::WriteAll(iovec* iov, int count) {
  while (count > 0) {
    ssize_t n = writev(fd_, iov, count);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return IoError("write");
    while (count > 0 && static_cast<size_t>(n) >= iov->iov_len) {
      n -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + n;
      iov->iov_len -= n;
    }
  }
  return Status::Ok();
}

// Appends whatever the socket has (at least one byte) to the staging buffer.
Status LineSocket::Fill() {
  if (begin_ == end_) begin_ = end_ = 0;
  if (end_ == staging_.size()) {  // compact; lines are short, so this rarely moves anything
    std::memmove(staging_.data(), staging_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
    if (end_ == staging_.size()) return Status(ErrorCode::INVALID_READ, "reply line too long");
  }
  for (;;) {
    ssize_t n = recv(fd_, staging_.data() + end_, staging_.size() - end_, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return Status(ErrorCode::TRANSFER_FAIL, "connection closed");
    if (n < 0) return IoError("read");
    end_ += n;
    return Status::Ok();
  }
}

// Lines are short: rescanning from begin_ after each read costs nothing.
Status LineSocket::ReadLine(std::string* line) {
  for (;;) {
    for (size_t i = begin_ + 1; i < end_; ++i) {
      if (staging_[i] == '\n' && staging_[i - 1] == '\r') {
        line->assign(staging_.data() + begin_, i - 1 - begin_);
        begin_ = i + 1;
        return Status::Ok();
      }
    }
    if (Status s = Fill(); !s.ok()) return s;
  }
}

Status LineSocket::ReadExact(void* dst, size_t n) {
  char* out = static_cast<char*>(dst);
  size_t have = std::min(n, end_ - begin_);
  std::memcpy(out, staging_.data() + begin_, have);
  begin_ += have;
  while (have < n) {
    ssize_t got = recv(fd_, out + have, n - have, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got == 0) return Status(ErrorCode::TRANSFER_FAIL, "connection closed");
    if (got < 0) return IoError("read");
    have += got;
  }
  return Status::Ok();
}

}  // namespace granary::bench
