#include "client/fast_channel.h"

#include "common/socket_io.h"
#include "common/spin_wait.h"
#include "proto/rpc_util.h"
#include "security/fast_hello.h"

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
#include <chrono>
#include <cstring>

namespace granary::client {

namespace {
using SteadyClock = std::chrono::steady_clock;
// Connections kept open between calls; more than the threads that call at once is waste.
constexpr size_t kMaxIdle = 16;
// A calling thread's frame buffers are kept up to this size, so a call of a usual batch mallocs
// (and zero-fills) none; a larger one is given back after its call.
constexpr size_t kKeepBuffer = 1 << 20;

// One request and one reply buffer per thread: a call runs on one thread from send to parse.
std::string& SendBuffer() {
  thread_local std::string buffer;
  return buffer;
}
std::string& ReceiveBuffer() {
  thread_local std::string buffer;
  return buffer;
}
void Trim(std::string& buffer) {
  if (buffer.capacity() > kKeepBuffer) std::string().swap(buffer);
}

Status Broken(const std::string& what) {
  return Status(ErrorCode::RPC_FAIL, "fast port: " + what);
}

using net::WaitFor;

// A connected non-blocking unix stream socket to the abstract `name`, or -1. Never waits: the
// kernel answers a local connect at once (refused, or a full backlog: EAGAIN).
int ConnectLocal(const std::string& name) {
  sockaddr_un addr;
  const auto len = static_cast<socklen_t>(net::AbstractUnixAddress(name, &addr));
  if (len == 0) return -1;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}
}  // namespace

Result<int> ConnectFirst(const addrinfo* addresses, SteadyTime deadline, const std::string& what) {
  Result<int> fd = net::ConnectFirst(addresses, deadline, what);
  if (fd.ok()) return fd;
  return Status(fd.code(), "fast port: " + fd.status().message());
}

FastChannel::FastChannel(std::string host, uint16_t port, int timeout_ms, std::string secret,
                         std::shared_ptr<const security::TlsContext> tls, std::string local_socket,
                         uint32_t spin_wait_us)
    : host_(std::move(host)), port_(port), timeout_ms_(std::max(timeout_ms, 1)),
      secret_(std::move(secret)), tls_(std::move(tls)),
      local_socket_(tls_ == nullptr ? std::move(local_socket) : std::string()),
      spin_wait_us_(spin_wait_us) {}

FastChannel::~FastChannel() = default;

uint32_t FastChannel::SpinBudget(SteadyTime deadline) const {
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<uint32_t>(std::clamp<int64_t>(left.count(), 0, spin_wait_us_));
}

Result<std::unique_ptr<net::ByteStream>> FastChannel::Connect(SteadyTime deadline) {
  if (local()) {
    if (int fd = ConnectLocal(local_socket_); fd >= 0) {
      auto conn = std::make_unique<net::ByteStream>(fd, /*owns_fd=*/true);
      if (secret_.empty()) return conn;
      Status s = security::PresentSecret(*conn, secret_, deadline);
      if (s.ok()) return conn;
      // A refused hello is the master's answer, which the TCP port would give too.
      if (s.code() != ErrorCode::RPC_FAIL) return s;
    }
    local_failed_ = true;  // another host or network namespace, or the master is gone
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port_);
  if (::getaddrinfo(host_.c_str(), service.c_str(), &hints, &found) != 0 || !found) {
    return Broken("cannot resolve " + host_);
  }
  Result<int> fd = ConnectFirst(found, deadline, host_ + ":" + service);
  ::freeaddrinfo(found);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<net::ByteStream> conn;
  if (tls_ != nullptr) {
    // Before any call: a failed handshake sent nothing (the caller may use gRPC, whose own
    // handshake then says the same).
    auto secured = tls_->Connect(*fd, host_, deadline);
    if (!secured.ok()) return Status(secured.code(), "fast port: " + secured.status().message());
    conn = std::move(*secured);
  } else {
    conn = std::make_unique<net::ByteStream>(*fd, /*owns_fd=*/true);
  }
  if (!secret_.empty()) {
    // Before any call: a refused hello means nothing was sent (the caller may use gRPC, which
    // then gets the same answer).
    if (Status s = security::PresentSecret(*conn, secret_, deadline); !s.ok()) return s;
  }
  return conn;
}

std::unique_ptr<net::ByteStream> FastChannel::TakeIdle() {
  std::lock_guard lock(mu_);
  while (!idle_.empty()) {  // bounded: each pass removes one
    std::unique_ptr<net::ByteStream> conn = std::move(idle_.back());
    idle_.pop_back();
    // An idle connection has nothing to read; readable means the master closed it (restart,
    // idle timeout): drop it rather than send a request into it.
    pollfd p{conn->fd(), POLLIN, 0};
    if (!conn->HasBuffered() && ::poll(&p, 1, 0) == 0) return conn;
  }
  return nullptr;
}

void FastChannel::GiveBack(std::unique_ptr<net::ByteStream> conn) {
  std::lock_guard lock(mu_);
  if (idle_.size() < kMaxIdle) idle_.push_back(std::move(conn));
}

FastChannel::Stage FastChannel::Attempt(net::ByteStream& conn, const std::string& frame,
                                        uint32_t request_id, uint8_t method,
                                        google::protobuf::Message* response, SteadyTime deadline,
                                        Status* status) {
  // Every wait is bounded by what is left of the deadline.
  size_t done = 0;
  if (Status s = conn.SendAll(frame, deadline, &done); !s.ok()) {
    *status = s.code() == ErrorCode::RPC_TIMEOUT
                  ? Status(ErrorCode::RPC_TIMEOUT, "fast port: send: no room in time")
                  : Broken(s.message());
    return done == 0 ? Stage::kNotSent : Stage::kSent;
  }
  std::string& in = ReceiveBuffer();
  if (in.size() < 4096) in.resize(4096);  // most replies fit: one receive
  size_t have = 0;
  size_t total = fast::kHeaderSize;  // the whole reply, once its header is known
  fast::Header h;
  bool header_done = false;
  // The reply cannot be here yet (the master has a call to apply): wait before the first
  // receive instead of after one that finds nothing, one system call less per call. Awake
  // first, briefly: a same-host master answers within the spin, sparing the wake-up.
  if (!conn.HasBuffered() && !net::SpinUntilReadable(conn.fd(), SpinBudget(deadline)) &&
      !conn.WaitReadable(deadline)) {
    *status = Status(ErrorCode::RPC_TIMEOUT, "fast port: no reply in time");
    return Stage::kSent;
  }
  while (have < total) {  // bounded: each pass reads, waits within the deadline, or returns
    // Read no further than this reply: one request, one reply, so more bytes are an error.
    const size_t want = header_done ? std::min(total, in.size()) : in.size();
    Result<size_t> n = conn.RecvSome(in.data() + have, want - have);
    if (!n.ok()) {
      *status = Broken(n.status().message());  // closed by the master, or broken
      return Stage::kSent;
    }
    if (*n == 0) {
      if (!conn.WaitReadable(deadline)) {
        *status = Status(ErrorCode::RPC_TIMEOUT, "fast port: no reply in time");
        return Stage::kSent;
      }
      continue;
    }
    have += *n;
    if (!header_done && have >= fast::kHeaderSize) {
      const bool valid = fast::DecodeHeader(reinterpret_cast<const unsigned char*>(in.data()), &h,
                                            fast::kMaxFastReply) == fast::HeaderError::kNone;
      if (valid && h.method == 0 && (h.flags & fast::kError)) {  // refused at accept: not read
        *status = Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                         "fast port: the master has no room for another connection");
        return Stage::kNotSent;
      }
      if (!valid || !(h.flags & fast::kReply) || h.request_id != request_id ||
          h.method != method) {
        *status = Broken("malformed reply");
        return Stage::kSent;
      }
      header_done = true;
      total = fast::kHeaderSize + h.body_size;
      if (have > total) {  // one request, one reply: never more
        *status = Broken("more bytes than one reply");
        return Stage::kSent;
      }
    }
    // Grow as bytes arrive, doubling: a large reply costs O(log n) copies, not one per receive.
    if (header_done && have == in.size() && in.size() < total) {
      in.resize(std::min(total, 2 * in.size()));
    }
  }
  const char* body = in.data() + fast::kHeaderSize;
  if (h.flags & fast::kError) {
    // A coded answer to the whole call: the reply is complete, so the connection is reusable.
    if (auto coded = rpc::ParseCodedMessage(std::string_view(body, h.body_size))) {
      *status = *coded;
      return Stage::kDone;
    }
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
  // One deadline for the whole call, connect and retry included.
  const SteadyTime deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms_);
  *sent = false;
  const size_t body_size = request.ByteSizeLong();
  if (body_size > fast::kMaxFastBody) return Broken("request over the frame cap");
  uint32_t id;
  {
    std::lock_guard lock(mu_);
    id = next_id_++;
  }
  // Serialized once, with the sizes ByteSizeLong just cached, into this thread's buffer.
  std::string& frame = SendBuffer();
  frame.resize(fast::kHeaderSize + body_size);
  fast::EncodeHeader({static_cast<uint8_t>(method), 0, id, static_cast<uint32_t>(body_size)},
                     reinterpret_cast<unsigned char*>(frame.data()));
  request.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(frame.data()) +
                                          fast::kHeaderSize);
  struct TrimAtEnd {
    ~TrimAtEnd() {
      Trim(SendBuffer());
      Trim(ReceiveBuffer());
    }
  } trim_at_end;

  Status status;
  // At most two attempts: a pooled connection, then a new one when the first could not have
  // reached the master (or the call is idempotent).
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::unique_ptr<net::ByteStream> conn = TakeIdle();
    const bool reused = conn != nullptr;
    if (!reused) {
      auto c = Connect(deadline);
      if (!c.ok()) return c.status();  // nothing sent by this attempt; *sent keeps the last one's
      conn = std::move(*c);
    }
    response->Clear();
    Stage stage = Attempt(*conn, frame, id, static_cast<uint8_t>(method), response, deadline,
                          &status);
    if (stage == Stage::kDone) {
      GiveBack(std::move(conn));
      *sent = true;
      return status;
    }
    conn.reset();  // a reply may still be on its way: never reuse this connection
    if (stage == Stage::kSent) *sent = true;
    const bool retry = reused && (stage == Stage::kNotSent || idempotent) &&
                       status.code() != ErrorCode::RPC_TIMEOUT &&
                       status.code() != ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
    if (!retry) break;
  }
  return status;
}

}  // namespace granary::client
