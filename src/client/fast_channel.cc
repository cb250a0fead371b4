#include "client/fast_channel.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace granary::client {

namespace {
using SteadyClock = std::chrono::steady_clock;
// Connections kept open between calls; more than the threads that call at once is waste.
constexpr size_t kMaxIdle = 16;

Status Broken(const std::string& what) {
  return Status(ErrorCode::RPC_FAIL, "fast port: " + what);
}
}  // namespace

FastChannel::FastChannel(std::string host, uint16_t port, int timeout_ms)
    : host_(std::move(host)), port_(port), timeout_ms_(std::max(timeout_ms, 1)) {}

FastChannel::~FastChannel() {
  for (int fd : idle_) ::close(fd);
}

Result<int> FastChannel::Connect() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port_);
  if (::getaddrinfo(host_.c_str(), service.c_str(), &hints, &found) != 0 || !found) {
    return Broken("cannot resolve " + host_);
  }
  int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int rc = fd < 0 ? -1 : ::connect(fd, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  if (fd < 0) return Broken(std::strerror(errno));
  if (rc != 0 && errno == EINPROGRESS) {  // bounded by the call's timeout
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof(err);
    rc = ::poll(&p, 1, timeout_ms_) == 1 &&
                 ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0
             ? 0
             : -1;
    if (rc != 0) errno = err ? err : ETIMEDOUT;
  }
  if (rc != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Broken("cannot connect to " + host_ + ":" + service + ": " + why);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{timeout_ms_ / 1000, (timeout_ms_ % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

int FastChannel::TakeIdle() {
  std::lock_guard lock(mu_);
  while (!idle_.empty()) {  // bounded: each pass removes one
    int fd = idle_.back();
    idle_.pop_back();
    // An idle connection has nothing to read; readable means the master closed it (restart,
    // idle timeout): drop it rather than send a request into it.
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) == 0) return fd;
    ::close(fd);
  }
  return -1;
}

void FastChannel::GiveBack(int fd) {
  std::lock_guard lock(mu_);
  if (idle_.size() < kMaxIdle) {
    idle_.push_back(fd);
    return;
  }
  ::close(fd);
}

FastChannel::Stage FastChannel::Attempt(int fd, const std::string& frame, uint32_t request_id,
                                        uint8_t method, google::protobuf::Message* response,
                                        Status* status) {
  const auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms_);
  size_t done = 0;
  while (done < frame.size()) {  // bounded: each pass sends >= 1 byte or returns
    ssize_t n = ::send(fd, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *status = Status(errno == EAGAIN ? ErrorCode::RPC_TIMEOUT : ErrorCode::RPC_FAIL,
                       std::string("fast port: send: ") + std::strerror(errno));
      return done == 0 ? Stage::kNotSent : Stage::kSent;
    }
    done += static_cast<size_t>(n);
  }
  std::string in(4096, '\0');  // most replies fit: one receive
  size_t have = 0;
  fast::Header h;
  bool header_done = false;
  while (!header_done || have < fast::kHeaderSize + h.body_size) {  // bounded by the deadline
    if (SteadyClock::now() > deadline) {
      *status = Status(ErrorCode::RPC_TIMEOUT, "fast port: no reply in time");
      return Stage::kSent;
    }
    ssize_t n = ::recv(fd, in.data() + have, in.size() - have, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *status = n == 0 ? Broken("the master closed the connection")
                       : Status(errno == EAGAIN ? ErrorCode::RPC_TIMEOUT : ErrorCode::RPC_FAIL,
                                std::string("fast port: receive: ") + std::strerror(errno));
      return Stage::kSent;
    }
    have += static_cast<size_t>(n);
    if (!header_done && have >= fast::kHeaderSize) {
      const bool valid = fast::DecodeHeader(reinterpret_cast<const unsigned char*>(in.data()), &h,
                                            fast::kMaxFastReply) == fast::HeaderError::kNone;
      if (valid && h.method == 0 && (h.flags & fast::kError)) {  // refused at accept: not read
        *status = Broken("the master has no room for another connection");
        return Stage::kNotSent;
      }
      if (!valid || !(h.flags & fast::kReply) || h.request_id != request_id ||
          h.method != method) {
        *status = Broken("malformed reply");
        return Stage::kSent;
      }
      header_done = true;
      if (have > fast::kHeaderSize + h.body_size) {  // one request, one reply: never more
        *status = Broken("more bytes than one reply");
        return Stage::kSent;
      }
      in.resize(fast::kHeaderSize + h.body_size);
    }
  }
  const char* body = in.data() + fast::kHeaderSize;
  if (h.flags & fast::kError) {
    *status = Broken("the master refused the call: " + std::string(body, h.body_size));
    return Stage::kSent;
  }
  if (!response->ParseFromArray(body, static_cast<int>(h.body_size))) {
    *status = Broken("reply does not parse");
    return Stage::kSent;
  }
  *status = Status::Ok();
  return Stage::kDone;
}

Status FastChannel::Call(fast::Method method, const google::protobuf::Message& request,
                         google::protobuf::Message* response, bool idempotent, bool* sent) {
  *sent = false;
  const size_t body_size = request.ByteSizeLong();
  if (body_size > fast::kMaxFastBody) return Broken("request over the frame cap");
  uint32_t id;
  {
    std::lock_guard lock(mu_);
    id = next_id_++;
  }
  std::string frame(fast::kHeaderSize, '\0');
  fast::EncodeHeader({static_cast<uint8_t>(method), 0, id, static_cast<uint32_t>(body_size)},
                     reinterpret_cast<unsigned char*>(frame.data()));
  if (!request.AppendToString(&frame)) return Broken("request does not serialize");

  Status status;
  // At most two attempts: a pooled connection, then a new one when the first could not have
  // reached the master (or the call is idempotent).
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = TakeIdle();
    const bool reused = fd >= 0;
    if (!reused) {
      Result<int> c = Connect();
      if (!c.ok()) return c.status();  // nothing sent: *sent stays false
      fd = *c;
    }
    response->Clear();
    Stage stage = Attempt(fd, frame, id, static_cast<uint8_t>(method), response, &status);
    if (stage == Stage::kDone) {
      GiveBack(fd);
      *sent = true;
      return status;
    }
    ::close(fd);  // a reply may still be on its way: never reuse this connection
    if (stage == Stage::kSent) *sent = true;
    const bool retry = reused && (stage == Stage::kNotSent || idempotent) &&
                       status.code() != ErrorCode::RPC_TIMEOUT;
    if (!retry) break;
  }
  return status;
}

}  // namespace granary::client
