#include "tools/bench/tcp_echo.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace granary::bench {

Result<std::unique_ptr<TcpEcho>> TcpEcho::Start() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 64) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return Status(ErrorCode::INTERNAL_ERROR, "echo server: " + why);
  }
  return std::unique_ptr<TcpEcho>(new TcpEcho(fd, ntohs(addr.sin_port)));
}

TcpEcho::TcpEcho(int fd, uint16_t port) : listen_fd_(fd), port_(port) {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

TcpEcho::~TcpEcho() {
  ::shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  {
    std::lock_guard lock(mu_);
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  }
  for (auto& t : threads_) t.join();
  for (int fd : fds_) ::close(fd);
  ::close(listen_fd_);
}

void TcpEcho::AcceptLoop() {
  for (;;) {  // ends when the destructor shuts the listener down
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0 && errno == EINTR) continue;
    if (fd < 0) return;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard lock(mu_);
    fds_.push_back(fd);
    threads_.emplace_back([fd] {
      char buf[4096];
      for (;;) {  // ends when the peer closes or the destructor shuts the socket down
        ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || ::send(fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) return;
      }
    });
  }
}

}  // namespace granary::bench
