#include "transfer/tcp_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "common/checksum.h"
#include "common/spin_wait.h"
#include "transfer/iovec.h"
#include "transfer/tcp_transport_internal.h"

namespace granary::transfer {

using namespace tcp_internal;

// One connection of a request, moving one chunk at a time: send the header (and a WRITE's
// payload), receive the response header, receive a READ's payload.
struct TcpTransport::Lane {
  enum Phase { kIdle, kSend, kRecvHeader, kRecvPayload };
  Conn conn;
  bool open = false;
  Phase phase = kIdle;
  uint64_t off = 0;  // the chunk, relative to the start of the range
  uint64_t len = 0;
  RequestHeader req;
  // What goes before a WRITE's payload: the header, and a CAP_* request's capability after it.
  uint8_t prefix[sizeof(RequestHeader) + sizeof(Capability)];
  uint64_t prefix_len = 0;
  ResponseHeader resp;
  uint64_t sent = 0;
  uint64_t got = 0;
  bool answered = false;  // this connection has delivered response bytes
};

namespace {
// A zero SO_RCVTIMEO would wait forever: the I/O timeout is at least a millisecond. A spin is at
// most the I/O timeout (the blocking receive after a spin that ran out waits its own).
TcpTransport::Options Normalised(TcpTransport::Options options) {
  options.io_timeout_ms = std::max(options.io_timeout_ms, 1);
  options.spin_wait_us = static_cast<uint32_t>(
      std::min<uint64_t>(options.spin_wait_us, uint64_t(options.io_timeout_ms) * 1000));
  return options;
}
}  // namespace

TcpTransport::TcpTransport(Options options) : options_(Normalised(std::move(options))) {}

TcpTransport::~TcpTransport() {
  std::lock_guard lock(mu_);
  for (auto& [name, ep] : endpoints_) {
    std::lock_guard ep_lock(ep->mu);
    for (Conn& c : ep->idle) close(c.fd);
    ep->idle.clear();
    ep->dropped = true;
  }
}

Result<std::shared_ptr<TcpTransport::Endpoint>> TcpTransport::GetEndpoint(
    const std::string& endpoint) {
  {
    std::lock_guard lock(mu_);
    auto it = endpoints_.find(endpoint);
    if (it != endpoints_.end()) return it->second;
  }
  // Parse and resolve outside the lock: a slow resolver must not stall other endpoints.
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size()) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "bad data-plane endpoint '" + endpoint + "': expected host:port");
  }
  std::string host = endpoint.substr(0, colon);
  std::string port = endpoint.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  bool numeric = port.size() <= 5 && std::all_of(port.begin(), port.end(), [](unsigned char c) {
                   return std::isdigit(c) != 0;
                 });
  if (!numeric || std::stoul(port) == 0 || std::stoul(port) > 65535) {
    return Status(ErrorCode::INVALID_PARAMS, "bad port in data-plane endpoint '" + endpoint + "'");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return Status(ErrorCode::TRANSFER_FAIL,
                  "cannot resolve data-plane endpoint '" + endpoint + "': " + gai_strerror(rc));
  }
  auto ep = std::make_shared<Endpoint>();
  ep->name = endpoint;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    ep->addrs.push_back(ss);
    ep->addr_lens.push_back(ai->ai_addrlen);
  }
  freeaddrinfo(res);
  std::lock_guard lock(mu_);
  auto [it, inserted] = endpoints_.emplace(endpoint, ep);
  return it->second;
}

Result<TcpTransport::Conn> TcpTransport::Connect(Endpoint& ep) {
  const int64_t deadline = NowMs() + options_.connect_timeout_ms;
  std::string last_error = "no address";
  for (size_t i = 0; i < ep.addrs.size(); ++i) {
    const auto* addr = reinterpret_cast<const sockaddr*>(&ep.addrs[i]);
    int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int err = 0;
    if (connect(fd, addr, ep.addr_lens[i]) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd pfd{fd, POLLOUT, 0};
        int rc;
        do {
          rc = poll(&pfd, 1, static_cast<int>(std::max<int64_t>(0, deadline - NowMs())));
        } while (rc < 0 && errno == EINTR);
        socklen_t len = sizeof(err);
        if (rc == 0) {
          err = ETIMEDOUT;
        } else if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
          err = errno;
        }
      }
    }
    if (err != 0) {
      last_error = err == ETIMEDOUT ? "connect timed out after " +
                                          std::to_string(options_.connect_timeout_ms) + " ms"
                                    : std::strerror(err);
      close(fd);
      if (NowMs() >= deadline) break;
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // Blocking from now on, bounded by the I/O timeout: every multi-lane or probing call passes
    // MSG_DONTWAIT, and a lone lane's calls may sleep (its answer's wait, its payload: kPiece).
    timeval tv{options_.io_timeout_ms / 1000, (options_.io_timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    Conn conn;
    conn.fd = fd;
    return conn;
  }
  return Status(ErrorCode::TRANSFER_FAIL,
                "cannot connect to data-plane endpoint " + ep.name + ": " + last_error);
}

Result<TcpTransport::Conn> TcpTransport::Checkout(Endpoint& ep, bool probe_all) {
  const int64_t now = NowMs();
  std::vector<int> stale;
  std::optional<Conn> found;
  {
    std::lock_guard lock(ep.mu);
    while (!ep.idle.empty() && !found) {
      Conn c = ep.idle.back();
      ep.idle.pop_back();
      // A connection the node closed (restart, idle timeout) shows EOF or an error here. One
      // used in the last kProbeAfterIdleMs is not probed (a system call per request in a hot
      // loop): the node's idle timer cannot have closed it, and a node that restarted meanwhile
      // is met by the resend on a fresh connection (Run's io_failed), as a probe can miss it too.
      bool alive = true;
      if (probe_all || now - c.idle_since_ms >= kProbeAfterIdleMs) {
        char probe;
        ssize_t r = recv(c.fd, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
        alive = r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      }
      if (!alive || now - c.idle_since_ms > options_.pool_idle_ms) {
        stale.push_back(c.fd);
      } else {
        c.from_pool = true;
        found = c;
      }
    }
  }
  for (int fd : stale) close(fd);
  if (found) return *found;
  return Connect(ep);
}

void TcpTransport::Return(Endpoint& ep, const Conn& conn) {
  {
    std::lock_guard lock(ep.mu);
    if (!ep.dropped && ep.idle.size() < options_.connections_per_endpoint) {
      Conn idle = conn;
      idle.idle_since_ms = NowMs();
      idle.from_pool = false;
      ep.idle.push_back(idle);
      return;
    }
  }
  close(conn.fd);
}

Status TcpTransport::Run(Endpoint& ep, Opcode op, uint64_t token, uint64_t offset, uint64_t length,
                         uint8_t* buf, uint64_t chunk, size_t max_lanes, ChecksumStream* sum,
                         const Capability* capability) {
  const bool write = op == Opcode::kWrite;
  const uint64_t chunks = length == 0 ? 1 : (length + chunk - 1) / chunk;
  std::vector<Lane> lanes(static_cast<size_t>(std::min<uint64_t>(max_lanes, chunks)));
  // One lane: its payload calls block (SO_RCVTIMEO/SO_SNDTIMEO = io_timeout_ms) a piece at a time.
  const bool lone = lanes.size() == 1;
  // Payload bytes moved per chunk, and the in-order prefix of the range hashed so far: `sum`
  // hashes each piece right after it moved (still in cache), never a second pass over the range.
  std::vector<uint64_t> moved(sum != nullptr ? chunks : 0, 0);
  uint64_t hashed = 0;
  auto note_moved = [&](const Lane& l, uint64_t bytes) {
    if (sum == nullptr) return;
    const uint64_t c = l.off / chunk;
    moved[c] = std::max(moved[c], bytes);
    while (hashed < length) {
      const uint64_t at = hashed / chunk;
      const uint64_t end = at * chunk + moved[at];
      if (end <= hashed) break;
      sum->Update(buf + hashed, end - hashed);
      hashed = end;
    }
  };
  for (Lane& l : lanes) {
    auto conn = Checkout(ep);
    if (!conn.ok()) {
      for (Lane& opened : lanes) {
        if (opened.open) Return(ep, opened.conn);
      }
      return conn.status();
    }
    l.conn = *conn;
    l.open = true;
  }

  uint64_t next = 0;
  uint64_t done = 0;
  Status error;  // the first error; once set, no further chunk is started
  auto describe = [&](const Lane& l) {
    return std::string(OpName(op)) + " of [" + std::to_string(offset + l.off) + ", +" +
           std::to_string(l.len) + ") at " + ep.name + ": ";
  };
  auto record = [&](Status st) {
    if (error.ok()) error = std::move(st);
  };
  auto start_chunk = [&](Lane& l) {
    if (!error.ok() || next >= chunks) {
      l.phase = Lane::kIdle;
      return;
    }
    l.off = next * chunk;
    l.len = length == 0 ? 0 : std::min(chunk, length - l.off);
    ++next;
    l.req = RequestHeader{};
    l.req.opcode = capability == nullptr ? op : write ? Opcode::kCapWrite : Opcode::kCapRead;
    l.req.request_id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
    l.req.segment_token = capability == nullptr ? token : 0;
    l.req.offset = offset + l.off;
    l.req.length = l.len;
    std::memcpy(l.prefix, &l.req, sizeof(RequestHeader));
    l.prefix_len = sizeof(RequestHeader);
    if (capability != nullptr) {
      std::memcpy(l.prefix + sizeof(RequestHeader), capability, sizeof(Capability));
      l.prefix_len += sizeof(Capability);
    }
    l.sent = 0;
    l.got = 0;
    l.phase = Lane::kSend;
  };
  auto drop = [&](Lane& l) {
    close(l.conn.fd);
    l.open = false;
    l.phase = Lane::kIdle;
  };
  // A pooled connection that proves dead before answering (the node restarted) is replaced and
  // the chunk resent on the fresh one; any other failure ends the request.
  auto io_failed = [&](Lane& l, int err, const char* what) {
    bool stale =
        l.conn.from_pool && !l.answered && (err == kEof || err == ECONNRESET || err == EPIPE);
    drop(l);
    if (!stale) {
      record(Status(ErrorCode::TRANSFER_FAIL, describe(l) + what + ErrnoText(err)));
      return;
    }
    auto fresh = Connect(ep);
    if (!fresh.ok()) {
      record(fresh.status());
      return;
    }
    l.conn = *fresh;
    l.open = true;
    l.sent = 0;
    l.got = 0;
    l.phase = Lane::kSend;
  };
  auto refused = [&](Lane& l, ErrorCode code) {
    record(Status(code, "node " + ep.name + " refused " + OpName(op) + " of [" +
                            std::to_string(offset + l.off) + ", +" + std::to_string(l.len) +
                            ") with " +
                            (capability ? std::string("a capability")
                                        : "segment token " + std::to_string(token)) +
                            ": " + RefusalText(code, capability != nullptr)));
  };
  // A node refuses a WRITE at its header, answers and closes without reading the payload: a
  // send cut off by that close finds the refusal waiting to be read.
  auto refusal_waiting = [&](Lane& l) {
    ResponseHeader rh;
    const ssize_t r = recv(l.conn.fd, &rh, sizeof(rh), MSG_DONTWAIT);
    if (r != static_cast<ssize_t>(sizeof(rh)) || rh.magic != kResponseMagic ||
        rh.request_id != l.req.request_id || rh.status == 0 || rh.length != 0) {
      return false;
    }
    refused(l, ErrorCodeFromInt(rh.status));
    drop(l);
    return true;
  };
  auto protocol_failed = [&](Lane& l, const std::string& what) {
    drop(l);
    record(Status(ErrorCode::TRANSFER_FAIL, describe(l) + "malformed response: " + what));
  };

  // Moves a lane as far as its socket allows; returns the poll events it waits for (0: idle).
  auto advance = [&](Lane& l) -> short {
    while (l.phase != Lane::kIdle) {
      if (l.phase == Lane::kSend) {
        const uint64_t head = l.prefix_len;
        const uint64_t payload = write ? l.len : 0;
        iovec iov[2];
        size_t n = 0;
        if (l.sent < head) iov[n++] = {l.prefix + l.sent, head - l.sent};
        const uint64_t payload_sent = l.sent > head ? l.sent - head : 0;
        if (payload > payload_sent) {
          const uint64_t left = payload - payload_sent;
          iov[n++] = {buf + l.off + payload_sent, lone ? std::min(left, kPiece) : left};
        }
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = n;
        ssize_t r = sendmsg(l.conn.fd, &msg, lone ? MSG_NOSIGNAL : MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
          if (errno == EINTR) continue;
          if ((errno == EAGAIN || errno == EWOULDBLOCK) && lone) {
            io_failed(l, ETIMEDOUT, "send timed out: ");
            continue;
          }
          if (errno == EAGAIN || errno == EWOULDBLOCK) return POLLOUT;
          const int err = errno;
          if (write && (err == EPIPE || err == ECONNRESET) && refusal_waiting(l)) continue;
          io_failed(l, err, "send failed: ");
          continue;
        }
        l.sent += static_cast<uint64_t>(r);
        if (write && l.sent > head) note_moved(l, l.sent - head);
        if (l.sent == head + payload) {
          l.phase = Lane::kRecvHeader;
          // The answer cannot be there yet: lanes wait in poll, skipping a recv bound to fail;
          // a lone lane waits in its blocking recv (SO_RCVTIMEO), one system call fewer.
          if (!lone) return POLLIN;
        }
      } else if (l.phase == Lane::kRecvHeader) {
        // A READ's header and payload in one call: after the header, the stream holds this
        // response's payload or nothing (a refusal has none), so reading ahead into the chunk
        // is safe.
        constexpr uint64_t kHeader = sizeof(ResponseHeader);
        iovec iov[2] = {{reinterpret_cast<uint8_t*>(&l.resp) + l.got, kHeader - l.got},
                        {buf + l.off, op == Opcode::kRead ? l.len : 0}};
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = op == Opcode::kRead && l.len > 0 ? 2 : 1;
        // Awake first, briefly, for an answer that is not there yet: a same-host node's comes
        // within the spin, and the blocking receive then finds it without a wake-up.
        if (lone && l.got == 0) granary::net::SpinUntilReadable(l.conn.fd, options_.spin_wait_us);
        ssize_t r = recvmsg(l.conn.fd, &msg, lone ? 0 : MSG_DONTWAIT);
        if (r <= 0) {
          if (r < 0 && errno == EINTR) continue;
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && lone) {
            io_failed(l, ETIMEDOUT, ("timed out (no progress for " +
                                     std::to_string(options_.io_timeout_ms) + " ms): ")
                                        .c_str());
            continue;
          }
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return POLLIN;
          io_failed(l, r == 0 ? kEof : errno, "no response: ");
          continue;
        }
        l.answered = true;
        l.got += static_cast<uint64_t>(r);
        if (l.got < kHeader) continue;
        const uint64_t payload_got = l.got - kHeader;
        if (l.resp.magic != kResponseMagic || l.resp.request_id != l.req.request_id) {
          protocol_failed(l, "bad magic or request id");
          continue;
        }
        if (l.resp.status != 0) {
          if (l.resp.length != 0) {
            protocol_failed(l, "an error with a payload");
            continue;
          }
          refused(l, ErrorCodeFromInt(l.resp.status));
          // A refused READ leaves the connection in sync; a refused WRITE's is closed by the node.
          if (write) {
            drop(l);
          } else {
            l.phase = Lane::kIdle;
          }
          continue;
        }
        const uint64_t expected = op == Opcode::kRead ? l.len : 0;
        if (l.resp.length != expected) {
          protocol_failed(l, "length " + std::to_string(l.resp.length) + ", expected " +
                                 std::to_string(expected));
          continue;
        }
        l.got = payload_got;
        if (op == Opcode::kRead) note_moved(l, l.got);
        if (l.got < expected) {
          l.phase = Lane::kRecvPayload;
        } else {
          ++done;
          start_chunk(l);
        }
      } else {  // kRecvPayload
        const uint64_t left = l.len - l.got;
        ssize_t r = lone ? recv(l.conn.fd, buf + l.off + l.got, std::min(left, kPiece), MSG_WAITALL)
                         : recv(l.conn.fd, buf + l.off + l.got, left, MSG_DONTWAIT);
        if (r <= 0) {
          if (r < 0 && errno == EINTR) continue;
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && lone) {
            io_failed(l, ETIMEDOUT, ("no progress for " + std::to_string(options_.io_timeout_ms) +
                                     " ms after " + std::to_string(l.got) + " payload bytes: ")
                                        .c_str());
            continue;
          }
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return POLLIN;
          std::string what = "connection lost after " + std::to_string(l.got) + " payload bytes: ";
          io_failed(l, r == 0 ? kEof : errno, what.c_str());
          continue;
        }
        l.got += static_cast<uint64_t>(r);
        note_moved(l, l.got);
        if (l.got == l.len) {
          ++done;
          start_chunk(l);
        }
      }
    }
    return 0;
  };

  for (Lane& l : lanes) start_chunk(l);
  std::vector<short> want(lanes.size());
  for (size_t i = 0; i < lanes.size(); ++i) want[i] = advance(lanes[i]);
  std::vector<pollfd> pfds;
  std::vector<size_t> polled;
  while (true) {
    pfds.clear();
    polled.clear();
    for (size_t i = 0; i < lanes.size(); ++i) {
      if (want[i] == 0) continue;
      pfds.push_back({lanes[i].conn.fd, want[i], 0});
      polled.push_back(i);
    }
    if (pfds.empty()) break;
    int rc = poll(pfds.data(), pfds.size(), options_.io_timeout_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) {
      // No lane moved for io_timeout_ms: whatever is in flight is abandoned with its connection.
      for (size_t i : polled) {
        record(Status(
            ErrorCode::TRANSFER_FAIL,
            describe(lanes[i]) + (rc == 0 ? "timed out (no progress for " +
                                                std::to_string(options_.io_timeout_ms) + " ms)"
                                          : std::string("poll failed: ") + std::strerror(errno))));
        drop(lanes[i]);
      }
      break;
    }
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (pfds[k].revents != 0) want[polled[k]] = advance(lanes[polled[k]]);
    }
  }
  for (Lane& l : lanes) {
    if (l.open) Return(ep, l.conn);
  }
  if (error.ok() && sum != nullptr && hashed != length) {
    return Status(ErrorCode::INTERNAL_ERROR, std::string(OpName(op)) + " at " + ep.name +
                                                 " hashed " + std::to_string(hashed) + " of " +
                                                 std::to_string(length) + " bytes");
  }
  if (error.ok() && done != chunks) {
    return Status(ErrorCode::INTERNAL_ERROR, std::string(OpName(op)) + " at " + ep.name +
                                                 " ended with " + std::to_string(done) + " of " +
                                                 std::to_string(chunks) + " requests done");
  }
  return error;
}

Status TcpTransport::Transfer(Opcode op, const RemoteRange& range, uint8_t* buf,
                              ChecksumStream* sum) {
  if (range.length > UINT64_MAX - range.offset) {
    return Status(ErrorCode::INVALID_PARAMS, "range offset + length overflows");
  }
  auto ep = GetEndpoint(range.endpoint);
  if (!ep.ok()) return ep.status();
  if (range.length == 0) return Status::Ok();  // nothing to hash either
  const bool stripe =
      range.length > options_.stripe_threshold && options_.connections_per_endpoint > 1;
  const uint64_t chunk = stripe
                             ? std::clamp<uint64_t>(options_.stripe_chunk, 4096, kMaxRequestBytes)
                             : kMaxRequestBytes;
  return Run(**ep, op, range.segment_token, range.offset, range.length, buf, chunk,
             stripe ? options_.connections_per_endpoint : 1, sum,
             range.capability ? &*range.capability : nullptr);
}

Status TcpTransport::Read(const RemoteRange& range, std::span<std::byte> dst,
                          ChecksumStream* checksum) {
  if (dst.size() != range.length) {
    return Status(ErrorCode::INVALID_PARAMS, "read buffer is " + std::to_string(dst.size()) +
                                                 " bytes but the range is " +
                                                 std::to_string(range.length));
  }
  return Transfer(Opcode::kRead, range, reinterpret_cast<uint8_t*>(dst.data()), checksum);
}

Status TcpTransport::Write(const RemoteRange& range, std::span<const std::byte> src,
                           ChecksumStream* checksum) {
  if (src.size() != range.length) {
    return Status(ErrorCode::INVALID_PARAMS, "write buffer is " + std::to_string(src.size()) +
                                                 " bytes but the range is " +
                                                 std::to_string(range.length));
  }
  // Run() only sends from a WRITE's buffer, never stores into it.
  return Transfer(Opcode::kWrite, range,
                  const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(src.data())), checksum);
}

Status TcpTransport::Ping(const std::string& endpoint) {
  auto ep = GetEndpoint(endpoint);
  if (!ep.ok()) return ep.status();
  return Run(**ep, Opcode::kPing, 0, 0, 0, nullptr, 1, 1);
}

void TcpTransport::DropEndpoint(const std::string& endpoint) {
  std::shared_ptr<Endpoint> ep;
  {
    std::lock_guard lock(mu_);
    auto it = endpoints_.find(endpoint);
    if (it == endpoints_.end()) return;
    ep = std::move(it->second);
    endpoints_.erase(it);
  }
  std::lock_guard lock(ep->mu);
  ep->dropped = true;
  for (Conn& c : ep->idle) close(c.fd);
  ep->idle.clear();
}

size_t TcpTransport::IdleConnections(const std::string& endpoint) {
  std::lock_guard lock(mu_);
  auto it = endpoints_.find(endpoint);
  if (it == endpoints_.end()) return 0;
  std::lock_guard ep_lock(it->second->mu);
  return it->second->idle.size();
}

}  // namespace granary::transfer
