#include "common/byte_stream.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace granary::net {

ByteStream::~ByteStream() {
  if (owns_fd_ && fd_ >= 0) ::close(fd_);
}

Status ByteStream::SendAll(std::string_view bytes, SteadyTime deadline, size_t* sent) {
  return net::SendAll(fd_, bytes, deadline, sent);
}

Result<size_t> ByteStream::RecvSome(char* out, size_t n) {
  for (;;) {  // bounded: EINTR only
    ssize_t r = ::recv(fd_, out, n, MSG_DONTWAIT);
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0) return Status(ErrorCode::RPC_FAIL, "connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return Status(ErrorCode::RPC_FAIL, std::string("receive failed: ") + std::strerror(errno));
  }
}

bool ByteStream::WaitReadable(SteadyTime deadline) { return WaitFor(fd_, POLLIN, deadline); }

Status ByteStream::RecvExact(char* out, size_t n, SteadyTime deadline) {
  size_t got = 0;
  while (got < n) {  // bounded: each pass receives, or waits toward the deadline
    Result<size_t> r = RecvSome(out + got, n - got);
    if (!r.ok()) return r.status();
    if (*r > 0) {
      got += *r;
      continue;
    }
    if (!WaitReadable(deadline)) return Status(ErrorCode::RPC_TIMEOUT, "receive timed out");
  }
  return Status::Ok();
}

void ByteStream::Shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

}  // namespace granary::net
