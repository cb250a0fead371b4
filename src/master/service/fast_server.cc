#include "master/service/fast_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/random.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <google/protobuf/arena.h>

#include "common/logging.h"
#include "common/socket_io.h"
#include "proto/fast_frame.h"
#include "proto/rpc_util.h"

namespace granary::master {

namespace {

using SteadyClock = std::chrono::steady_clock;
// A connection's arena block: a batch of 128 keys' request and reply fit in it; more spills
// into blocks the arena mallocs and frees itself.
constexpr size_t kArenaBlock = 256 * 1024;
constexpr size_t kKeepOut = 1 << 20;  // reply buffer kept between calls
constexpr uint32_t kMaxHelloBody = 4096;  // a secret is a line (security/secret.h)

std::string PeerOf(int fd) {
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return "?";
  if (peer.ss_family == AF_UNIX) {  // the local socket: who is at the other end, by the kernel
    ucred cred{};
    socklen_t cred_len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) return "local";
    return "local pid " + std::to_string(cred.pid) + " uid " + std::to_string(cred.uid);
  }
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (peer.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  } else if (peer.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

bool SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {  // bounded: each pass sends >= 1 byte or returns
    ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// A reply, sent within the read deadline (a peer that stops reading must not hold the thread).
bool Send(net::ByteStream& conn, std::string_view bytes, int deadline_ms) {
  return conn.SendAll(bytes, SteadyClock::now() + std::chrono::milliseconds(deadline_ms)).ok();
}

std::string Frame(uint8_t method, uint16_t flags, uint32_t request_id, size_t body_size) {
  std::string out(fast::kHeaderSize, '\0');
  fast::EncodeHeader({method, flags, request_id, static_cast<uint32_t>(body_size)},
                     reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

// Reads whole frames from one socket, buffering what the peer sent ahead.
class FrameReader {
 public:
  enum class Result { kFrame, kClosed, kIdle, kStalled, kBadHeader, kStopped };

  FrameReader(net::ByteStream* conn, int read_deadline_ms, int idle_timeout_ms,
              const std::atomic<bool>* stop)
      : conn_(conn), read_deadline_ms_(read_deadline_ms), idle_ms_(idle_timeout_ms), stop_(stop) {}

  // *body views this reader's buffer: valid until the next call.
  Result Next(fast::Header* h, std::string_view* body, fast::HeaderError* why,
              uint32_t max_body = fast::kMaxFastBody) {
    if (Result r = Fill(fast::kHeaderSize); r != Result::kFrame) return r;
    *why = fast::DecodeHeader(reinterpret_cast<const unsigned char*>(buf_.data() + pos_), h,
                              max_body);
    if (*why != fast::HeaderError::kNone) return Result::kBadHeader;
    if (Result r = Fill(fast::kHeaderSize + h->body_size); r != Result::kFrame) return r;
    *body = std::string_view(buf_.data() + pos_ + fast::kHeaderSize, h->body_size);
    pos_ += fast::kHeaderSize + h->body_size;
    return Result::kFrame;
  }
  // Every wait also ends by `until` (a connection's hello deadline); max(): none.
  void set_until(SteadyClock::time_point until) { until_ = until; }

 private:
  // Until `need` bytes past pos_ are buffered. Waiting for the first byte of a frame is idle time;
  // once a frame has begun, the rest must come within the read deadline.
  Result Fill(size_t need) {
    if (len_ - pos_ >= need) return Result::kFrame;
    if (pos_ > 0) {
      std::memmove(buf_.data(), buf_.data() + pos_, len_ - pos_);
      len_ -= pos_;
      pos_ = 0;
    }
    if (buf_.size() > kKeep && len_ <= kKeep) {  // after a big frame
      buf_.resize(std::max(len_, kChunk));
      buf_.shrink_to_fit();
    }
    bool idle = len_ == 0;
    auto deadline = std::min(
        until_, SteadyClock::now() + std::chrono::milliseconds(idle ? idle_ms_ : read_deadline_ms_));
    while (len_ < need) {  // bounded by the deadline: every pass waits or reads
      if (stop_->load()) return Result::kStopped;
      if (SteadyClock::now() >= deadline) return idle ? Result::kIdle : Result::kStalled;
      if (!conn_->WaitReadable(deadline)) continue;  // the deadline, checked above
      // Room for what may come next, never for what a header merely announces: a peer that
      // sends headers only costs kChunk per connection, and memory doubles only as bytes arrive.
      // The buffer keeps its size between frames, so only growth is zero-filled.
      const size_t room = std::max(kChunk, std::min(need - len_, len_));
      if (buf_.size() < len_ + room) buf_.resize(len_ + room);
      granary::Result<size_t> n = conn_->RecvSome(buf_.data() + len_, buf_.size() - len_);
      if (!n.ok()) return Result::kClosed;
      if (*n == 0) continue;
      len_ += *n;
      if (idle) {  // a frame has begun: the rest is due within the read deadline
        idle = false;
        deadline = std::min(until_,
                            SteadyClock::now() + std::chrono::milliseconds(read_deadline_ms_));
      }
    }
    return Result::kFrame;
  }

  static constexpr size_t kChunk = 64 * 1024;
  static constexpr size_t kKeep = 1 << 20;  // buffer kept between frames; larger is given back
  net::ByteStream* conn_;
  int read_deadline_ms_;
  int idle_ms_;
  const std::atomic<bool>* stop_;
  SteadyClock::time_point until_ = SteadyClock::time_point::max();
  std::string buf_;  // bytes [pos_, len_) are received and not yet handed out
  size_t pos_ = 0;
  size_t len_ = 0;
};

}  // namespace

FastServer::FastServer(MasterService* service, MetricsRegistry* metrics, Options options)
    : service_(service), options_(options) {
  accepted_ = metrics->AddCounter("granary_master_fast_connections_total",
                                  "connections accepted on the fast port");
  refused_ = metrics->AddCounter("granary_master_fast_refused_total",
                                 "fast-port connections closed at accept (over the cap)");
  bad_frames_ = metrics->AddCounter("granary_master_fast_bad_frames_total",
                                    "fast-port connections closed for a malformed frame");
  accepted_local_ = metrics->AddCounter(
      "granary_master_fast_local_connections_total",
      "of those, connections accepted on the local socket (clients on this host)");
  tls_failures_ = metrics->AddCounter("granary_master_fast_tls_failures_total",
                                      "fast-port connections closed for a failed TLS handshake");
  open_ = metrics->AddGauge("granary_master_fast_connections", "open fast-port connections");
  for (uint8_t m = 1; m < fast::kMethodCount; ++m) {
    calls_[m] = metrics->AddCounter("granary_master_fast_calls_total",
                                    "calls served on the fast port (also in granary_master_rpc_*)",
                                    {{"method", fast::MethodName(static_cast<fast::Method>(m))}});
  }
}

FastServer::~FastServer() { Stop(); }

Status FastServer::Start(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0 || !found) {
    return Status(ErrorCode::INVALID_PARAMS, "fast port: cannot resolve host '" + host + "'");
  }
  int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // restart on the same port
  const bool ok = fd >= 0 && ::bind(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  ::listen(fd, 64) == 0;
  ::freeaddrinfo(found);
  if (!ok) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return Status(ErrorCode::INTERNAL_ERROR,
                  "cannot listen on the fast port " + host + ":" + service + ": " + why);
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  listen_fd_ = fd;
  acceptor_ = std::thread([this, fd] { AcceptLoop(fd, /*local=*/false); });
  return Status::Ok();
}

Status FastServer::StartLocal() {
  if (tls_ != nullptr) {
    return Status(ErrorCode::INVALID_PARAMS, "fast port: no local socket under TLS");
  }
  if (listen_fd_ < 0 || local_fd_ >= 0) {
    return Status(ErrorCode::INVALID_PARAMS, "fast port: StartLocal before Start, or twice");
  }
  uint64_t random[2];
  if (::getrandom(random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
    return Status(ErrorCode::INTERNAL_ERROR, "fast port: no randomness for the local socket");
  }
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(random[0]),
                static_cast<unsigned long long>(random[1]));
  const std::string name = std::string("granary-fast-") + hex;
  sockaddr_un addr;
  const auto addr_len = static_cast<socklen_t>(net::AbstractUnixAddress(name, &addr));
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 ||
      ::listen(fd, 64) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return Status(ErrorCode::INTERNAL_ERROR, "fast port: cannot listen on a local socket: " + why);
  }
  local_fd_ = fd;
  local_name_ = name;
  local_acceptor_ = std::thread([this, fd] { AcceptLoop(fd, /*local=*/true); });
  return Status::Ok();
}

void FastServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  if (local_fd_ >= 0) ::shutdown(local_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  if (local_acceptor_.joinable()) local_acceptor_.join();
  std::list<std::unique_ptr<Connection>> all;
  {
    std::lock_guard lock(mu_);
    for (auto& c : connections_) ::shutdown(c->fd, SHUT_RDWR);  // wakes poll/recv
    all.swap(connections_);
  }
  for (auto& c : all) {
    if (c->thread.joinable()) c->thread.join();
    ::close(c->fd);
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  if (local_fd_ >= 0) ::close(local_fd_);
  local_fd_ = -1;
}

void FastServer::ReapFinished() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (!(*it)->done.load()) {
      ++it;
      continue;
    }
    (*it)->thread.join();
    ::close((*it)->fd);
    it = connections_.erase(it);
  }
}

void FastServer::ShedUnauthenticated() {
  if (auth_ == nullptr || !auth_->required()) return;
  size_t waiting = 0;
  Connection* oldest = nullptr;
  for (auto& c : connections_) {  // in accept order
    if (c->done.load() || !c->awaiting_hello.load()) continue;
    if (oldest == nullptr) oldest = c.get();
    waiting++;
  }
  if (waiting < options_.max_unauthenticated || oldest == nullptr) return;
  // Its thread wakes and ends; a client's hello takes one round trip, so only a connection
  // that has been silent for a while is old enough to be the oldest of many.
  (void)auth_->Refuse("fast", PeerOf(oldest->fd), "no hello while others waited");
  ::shutdown(oldest->fd, SHUT_RDWR);
  oldest->awaiting_hello = false;  // not counted again before its thread ends
}

void FastServer::AcceptLoop(int listen_fd, bool local) {
  while (!stopping_.load()) {  // ends when Stop() shuts the listener down
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (!stopping_.load()) GLOG_WARN("fast port: accept failed: {}", std::strerror(errno));
      return;
    }
    int one = 1;
    if (!local) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // A peer that stops reading must not hold a thread in send() forever.
    timeval tv{options_.read_deadline_ms / 1000, (options_.read_deadline_ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    std::lock_guard lock(mu_);
    ReapFinished();
    ShedUnauthenticated();
    if (stopping_.load() || connections_.size() >= options_.max_connections) {
      if (const auto now = SteadyClock::now(); now - last_cap_log_ >= std::chrono::seconds(1)) {
        GLOG_WARN("fast port: {} connections open (the cap): closing a new one",
                  connections_.size());
        last_cap_log_ = now;
      }
      refused_->Inc();
      // Said before any request is read, so the client knows nothing was applied and may use gRPC.
      // Under TLS the client expects a handshake: the close itself says it (nothing was sent).
      const std::string busy = "busy";
      if (tls_ == nullptr) {
        (void)SendAll(fd, Frame(0, fast::kReply | fast::kError, 0, busy.size()) + busy);
      }
      // Unread bytes at close() would make it a reset, which can destroy the busy frame in flight.
      ::shutdown(fd, SHUT_WR);
      char sink[4096];
      for (int i = 0; i < 16 && ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
      }
      ::close(fd);
      continue;
    }
    accepted_->Inc();
    if (local) accepted_local_->Inc();
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->awaiting_hello = auth_ != nullptr && auth_->required();
    Connection* raw = c.get();
    connections_.push_back(std::move(c));
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }
}

void FastServer::Serve(Connection* c) {
  open_->Add(1);
  struct Closed {
    FastServer* server;
    Connection* c;
    ~Closed() {
      ::shutdown(c->fd, SHUT_RDWR);
      server->open_->Add(-1);
      c->done = true;
    }
  } closed{this, c};
  std::unique_ptr<net::ByteStream> conn;
  if (tls_ != nullptr) {
    // The handshake is part of the time a connection has to say hello.
    auto secured = tls_->Accept(
        c->fd, /*owns_fd=*/false,
        SteadyClock::now() + std::chrono::milliseconds(options_.read_deadline_ms));
    if (!secured.ok()) {
      tls_failures_->Inc();
      if (auth_ != nullptr) {
        (void)auth_->Refuse("fast", PeerOf(c->fd), secured.status().message().c_str());
      } else {
        GLOG_WARN("fast port: closing a connection from {}: {}", PeerOf(c->fd),
                  secured.status().message());
      }
      return;
    }
    conn = std::move(*secured);
  } else {
    conn = std::make_unique<net::ByteStream>(c->fd, /*owns_fd=*/false);
  }
  FrameReader reader(conn.get(), options_.read_deadline_ms, options_.idle_timeout_ms, &stopping_);
  fast::Header h;
  std::string_view body;
  Scratch scratch;  // its arena block only once the connection may call
  // From the configuration, never from the shared flag: a shed connection must not be served.
  bool authenticated = auth_ == nullptr || !auth_->required();
  const security::Principal* who = nullptr;  // named by the hello
  // Until its hello, a connection may hold a slot only briefly and send only a short frame.
  if (!authenticated) {
    reader.set_until(SteadyClock::now() + std::chrono::milliseconds(options_.read_deadline_ms));
  }
  for (;;) {  // one frame per pass; ends at close, idle timeout, a bad frame or Stop()
    fast::HeaderError why = fast::HeaderError::kNone;
    auto r = reader.Next(&h, &body, &why, authenticated ? fast::kMaxFastBody : kMaxHelloBody);
    if (!authenticated && (r == FrameReader::Result::kBadHeader ||
                           r == FrameReader::Result::kStalled || r == FrameReader::Result::kIdle)) {
      // A stranger's noise: counted and logged as a refusal (at most a line a second).
      (void)auth_->Refuse("fast", PeerOf(c->fd),
                          r == FrameReader::Result::kBadHeader ? "a malformed first frame"
                                                               : "no hello in time");
      break;
    }
    if (r == FrameReader::Result::kBadHeader) {
      bad_frames_->Inc();
      GLOG_WARN("fast port: closing a connection: {}",
                why == fast::HeaderError::kMagic     ? "bad magic (not a Granary fast frame)"
                : why == fast::HeaderError::kVersion ? "unsupported frame version"
                                                     : "frame body over the size cap");
      break;
    }
    if (r == FrameReader::Result::kStalled) {
      bad_frames_->Inc();
      GLOG_WARN("fast port: closing a connection: frame incomplete after {} ms",
                options_.read_deadline_ms);
      break;
    }
    if (r != FrameReader::Result::kFrame) break;  // closed by the peer, idle, or stopping
    if (h.method == static_cast<uint8_t>(fast::Method::kHello) || !authenticated) {
      if (!Hello(c, *conn, h, body, &who)) break;
      authenticated = true;
      reader.set_until(SteadyClock::time_point::max());
      continue;
    }
    if (!scratch.arena_block) scratch.arena_block = std::make_unique<char[]>(kArenaBlock);
    MasterService::FastCaller caller(who);
    if (!Handle(*conn, h.method, h.request_id, body, &scratch, who)) break;
  }
}

bool FastServer::Hello(Connection* c, net::ByteStream& conn, const fast::Header& h,
                       std::string_view body, const security::Principal** who) {
  const int fd = c->fd;
  const bool is_hello = h.method == static_cast<uint8_t>(fast::Method::kHello);
  Status s = Status::Ok();
  if (auth_ != nullptr) {
    auto found = auth_->Identify(is_hello ? std::optional<std::string_view>(body) : std::nullopt,
                                 "fast", PeerOf(fd));
    s = found.status();
    if (found.ok()) *who = *found;
  }
  if (s.ok()) {
    c->awaiting_hello = false;
    return Send(conn, Frame(h.method, fast::kReply, h.request_id, 0), options_.read_deadline_ms);
  }
  const std::string msg = rpc::ToGrpc(s).error_message();  // "granary:-1100:..."
  (void)Send(conn, Frame(h.method, fast::kReply | fast::kError, h.request_id, msg.size()) + msg,
             options_.read_deadline_ms);
  return false;
}

bool FastServer::Handle(net::ByteStream& conn, uint8_t method, uint32_t request_id, std::string_view body,
                        Scratch* scratch, const security::Principal* who) {
  // One handler per method, the gRPC one: the fast port is a second transport, not a second
  // implementation. The handlers ignore their ServerContext.
  // Req and Resp come from the handler's own signature.
  auto call = [&]<typename Req, typename Resp>(
                  grpc::Status (MasterService::*handler)(MasterService::Ctx*, const Req*, Resp*)) {
    // Request and response live in an arena whose first block is this connection's: a batch's
    // strings and sub-messages are carved from it and dropped at once, instead of one malloc
    // and free each (the largest cost of a call after the state machine itself).
    google::protobuf::ArenaOptions arena_options;
    arena_options.initial_block = scratch->arena_block.get();
    arena_options.initial_block_size = kArenaBlock;
    google::protobuf::Arena arena(arena_options);
    Req* req = google::protobuf::Arena::CreateMessage<Req>(&arena);
    Resp* resp = google::protobuf::Arena::CreateMessage<Resp>(&arena);
    if (!req->ParseFromArray(body.data(), static_cast<int>(body.size()))) {
      bad_frames_->Inc();
      GLOG_WARN("fast port: closing a connection: {} body does not parse",
                fast::MethodName(static_cast<fast::Method>(method)));
      return false;
    }
    calls_[method]->Inc();  // method < kMethodCount: only known methods reach here
    const grpc::Status handled = (service_->*handler)(nullptr, req, resp);
    if (!handled.ok()) {  // the call as a whole was answered with a code: the connection is fine
      const std::string& msg = handled.error_message();
      return Send(conn, Frame(method, fast::kReply | fast::kError, request_id, msg.size()) + msg, options_.read_deadline_ms);
    }
    const size_t size = resp->ByteSizeLong();
    if (size > fast::kMaxFastReply) {  // the client would refuse it, as gRPC's would
      GLOG_WARN("fast port: {} reply of {} bytes is over the cap; closing the connection",
                fast::MethodName(static_cast<fast::Method>(method)), size);
      const std::string msg = "reply over the frame cap";
      (void)Send(conn, Frame(method, fast::kReply | fast::kError, request_id, msg.size()) + msg, options_.read_deadline_ms);
      return false;
    }
    std::string& out = scratch->out;
    out.resize(fast::kHeaderSize + size);
    fast::EncodeHeader({method, fast::kReply, request_id, static_cast<uint32_t>(size)},
                       reinterpret_cast<unsigned char*>(out.data()));
    resp->SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out.data()) +
                                          fast::kHeaderSize);
    const bool sent = Send(conn, out, options_.read_deadline_ms);
    if (out.capacity() > kKeepOut) std::string().swap(out);  // a huge reply is not kept
    return sent;
  };
  using S = MasterService;
  switch (static_cast<fast::Method>(method)) {
    case fast::Method::kPing:
      return call(&S::Ping);
    case fast::Method::kPutStart:
      return call(&S::BatchPutStart);
    case fast::Method::kPutEnd:
      return call(&S::BatchPutEnd);
    case fast::Method::kPutRevoke:
      return call(&S::BatchPutRevoke);
    case fast::Method::kGetReplicaList:
      return call(&S::BatchGetReplicaList);
    case fast::Method::kFinishRead:
      return call(&S::BatchFinishRead);
    case fast::Method::kExist:
      return call(&S::BatchExist);
    case fast::Method::kReserve:
      return call(&S::Reserve);
    case fast::Method::kPutCommit:
      return call(&S::BatchPutCommit);
    case fast::Method::kReleaseReservations:
      return call(&S::ReleaseReservations);
    case fast::Method::kReplicate: {
      calls_[method]->Inc();
      if (who != nullptr && who->tenant_only()) {  // the history holds every tenant's keys
        const std::string msg = "granary:-1101:a tenant may not stream the master's history";
        (void)Send(conn, Frame(method, fast::kReply | fast::kError, request_id, msg.size()) + msg, options_.read_deadline_ms);
        return false;
      }
      if (!stream_handler_) {
        const std::string msg = "granary:-1011:this master streams no history";
        (void)Send(conn, Frame(method, fast::kReply | fast::kError, request_id, msg.size()) + msg, options_.read_deadline_ms);
        return false;
      }
      stream_handler_(conn, body);
      return false;  // the stream ended: so does the connection
    }
    case fast::Method::kHello:
      break;
  }
  bad_frames_->Inc();
  GLOG_WARN("fast port: closing a connection: unknown method {}", method);
  const std::string msg = "unknown method";
  (void)Send(conn, Frame(method, fast::kReply | fast::kError, request_id, msg.size()) + msg, options_.read_deadline_ms);
  return false;
}

}  // namespace granary::master
