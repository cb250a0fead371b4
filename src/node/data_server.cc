// node::DataServer's requests (data_server.h): the I/O threads' loop, each request driven from
// its header to its answer, and the metrics. Connections (listen, accept, deadlines, close,
// stop): data_server_conns.cc; disk requests: data_server_disk.cc; fences: data_server_fence.cc.
#include "node/data_server.h"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"
#include "common/tsan.h"
#include "security/capability.h"
#include "transfer/iovec.h"
#include "transfer/protocol.h"

namespace granary::node {

namespace {

using transfer::Opcode;
using transfer::RequestHeader;
using transfer::ResponseHeader;
using Phase = DataConn::Phase;

constexpr size_t kDrainChunk = 64 * 1024;  // the scratch: a fenced payload or new body bytes, per recv
constexpr uint64_t kFirstBodyChunk = 4096;  // a body's first allocation; then it doubles

// Where bytes land before anything is allocated for them (a body's next bytes) or that are
// discarded (a fenced WRITE's payload): one per I/O thread, nothing held per connection.
std::array<uint8_t, kDrainChunk>& Scratch() {
  thread_local std::array<uint8_t, kDrainChunk> scratch;
  return scratch;
}
// Socket calls one turn may make before the connection goes back to epoll (fairness: a fast
// peer with a 256 MiB READ must not keep an I/O thread from the others).
constexpr int kStepsPerTurn = 64;
constexpr int kEventsPerWait = 64;

bool IsCapability(Opcode op) { return op == Opcode::kCapRead || op == Opcode::kCapWrite; }

bool WellFormed(const RequestHeader& h) {
  bool opcode_ok = h.opcode == Opcode::kRead || h.opcode == Opcode::kWrite ||
                   h.opcode == Opcode::kPing || h.opcode == Opcode::kDiskRead ||
                   h.opcode == Opcode::kDiskStage || h.opcode == Opcode::kStageRelease ||
                   h.opcode == Opcode::kStageInfo || h.opcode == Opcode::kCapRead ||
                   h.opcode == Opcode::kCapWrite;
  // A capability names its mount by its key: a token beside it would be a second claim.
  if (IsCapability(h.opcode) && h.segment_token != 0) return false;
  uint64_t max_length = transfer::kMaxRequestBytes;
  switch (h.opcode) {
    case Opcode::kDiskRead:
    case Opcode::kDiskStage:
      max_length = transfer::kMaxDiskReadBody;
      break;
    case Opcode::kStageRelease:
      max_length = transfer::kMaxStageReleaseBody;
      break;
    case Opcode::kStageInfo:
      max_length = 0;
      break;
    default:
      break;
  }
  return h.magic == transfer::kRequestMagic && h.version == transfer::kProtocolVersion &&
         opcode_ok && h.reserved == 0 && h.length <= max_length;
}

bool WouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK; }

// The op label of each opcode; a capability request counts as the READ or WRITE it asks for.
size_t OpIndex(Opcode op) {
  switch (op) {
    case Opcode::kRead:
    case Opcode::kCapRead:
      return 0;
    case Opcode::kWrite:
    case Opcode::kCapWrite:
      return 1;
    case Opcode::kPing:
      return 2;
    case Opcode::kDiskRead:
      return 3;
    case Opcode::kDiskStage:
      return 4;
    case Opcode::kStageRelease:
      return 5;
    case Opcode::kStageInfo:
      return 6;
  }
  return 2;  // not reached: StartRequest admits only the opcodes above
}
constexpr const char* kOpNames[] = {"read",       "write",         "ping",      "disk_read",
                                    "disk_stage", "stage_release", "stage_info"};
constexpr const char* kErrorReasonNames[] = {
    "stale_mount", "out_of_range", "capability", "bad_frame",   "timeout", "fenced",
    "body_limit",  "peer_closed",  "disk_refused", "disk_entry", "staging"};

// Answer times from 100 us to ~13 s (a 64 MiB READ over a slow link), doubling.
std::vector<double> RequestSecondsBounds() { return ExponentialBounds(0.0001, 2, 18); }

}  // namespace

DataServer::DataServer(uint8_t* base, uint64_t size, uint64_t segment_token, Options options)
    : base_(base),
      size_(size),
      token_(segment_token),
      fence_slots_(std::make_unique<FenceSlot[]>(std::max<size_t>(options.io_threads, 1))),
      options_(std::move(options)) {
  metrics_ = options_.metrics;
  if (metrics_ == nullptr) {
    own_metrics_ = std::make_unique<MetricsRegistry>();
    metrics_ = own_metrics_.get();
  }
  RegisterMetrics();
}

void DataServer::RegisterMetrics() {
  static_assert(std::size(kOpNames) == kOpKinds);
  static_assert(std::size(kErrorReasonNames) == kErrorReasons);
  for (size_t i = 0; i < kOpKinds; ++i) {
    const Labels op = {{"op", kOpNames[i]}};
    op_series_[i].requests = metrics_->AddCounter(
        "granary_node_requests_total", "well-formed data-plane requests (all over TCP)", op);
    op_series_[i].bytes = metrics_->AddCounter(
        "granary_node_bytes_total",
        "payload bytes moved: read and disk_read sent, write stored, disk_stage staged in shm", op);
    op_series_[i].seconds = metrics_->AddHistogram(
        "granary_node_request_seconds",
        "time from a request's first header byte to its answer's last byte, answered OK",
        RequestSecondsBounds(), op);
  }
  for (size_t i = 0; i < kErrorReasons; ++i) {
    error_series_[i] = metrics_->AddCounter("granary_node_request_errors_total",
                                            "data-plane requests refused or cut off, by reason",
                                            {{"reason", kErrorReasonNames[i]}});
  }
  connections_accepted_ = metrics_->AddCounter("granary_node_connections_total",
                                               "data-plane connections accepted");
  connections_rejected_ = metrics_->AddCounter(
      "granary_node_connections_rejected_total",
      "data-plane connections closed on accept (max_connections reached)");
  metrics_->AddGaugeCallback("granary_node_connections", "data-plane connections open", [this] {
    return std::vector<std::pair<Labels, double>>{
        {{}, static_cast<double>(open_connections_.load(std::memory_order_relaxed))}};
  });
  metrics_->AddGaugeCallback(
      "granary_node_request_body_bytes_held", "bytes held for request bodies not yet complete",
      [this] {
        return std::vector<std::pair<Labels, double>>{
            {{}, static_cast<double>(body_bytes_held_.load(std::memory_order_relaxed))}};
      });
}

DataServer::OpSeries& DataServer::Op(Opcode opcode) { return op_series_[OpIndex(opcode)]; }

void DataServer::ObserveAnswered(DataConn& c) {
  Op(c.request.opcode).seconds->Observe(static_cast<double>(MonotonicNs() - c.request_start_ns) /
                                        1e9);
}

DataServer::~DataServer() { Stop(); }

void DataServer::IoLoop(FenceSlot* slot) {
  epoll_event events[kEventsPerWait];
  while (!io_stopping_.load(std::memory_order_acquire)) {
    int n = epoll_wait(epoll_fd_, events, kEventsPerWait, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      GLOG_ERROR("data server epoll_wait failed: {}", std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kStopEventKey) return;
      ConnPtr conn = Find(events[i].data.u64);
      if (conn == nullptr) continue;  // closed at its deadline after the event fired
      std::lock_guard lock(conn->mu);
      if (conn->closed) continue;
      Next next = Drive(*conn, *slot);
      if (next == Next::kClose) {
        Close(*conn);
      } else if (next != Next::kHandedOff) {
        Rearm(*conn, next);
      }
    }
  }
}

// Bytes of `c` already received, then the socket: recv()'s contract.
ssize_t DataServer::Receive(DataConn& c, void* into, size_t n) {
  if (c.HasAhead()) {
    const size_t take = std::min<size_t>(n, c.ahead_len - c.ahead_pos);
    std::memcpy(into, c.ahead + c.ahead_pos, take);
    c.ahead_pos = static_cast<uint8_t>(c.ahead_pos + take);
    return static_cast<ssize_t>(take);
  }
  return recv(c.fd, into, n, 0);
}

void DataServer::Rearm(DataConn& c, Next next) {
  UpdateDeadline(c);
  epoll_event ev{};
  // Bytes read ahead wait in `c`, not the socket, which may stay silent: resume once it can be
  // written to (at once, unless the peer stopped reading its answers).
  if (c.HasAhead()) next = Next::kWrite;
  ev.events = (next == Next::kWrite ? EPOLLOUT : EPOLLIN) | EPOLLONESHOT;
  ev.data.u64 = c.id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev) != 0) Close(c);
}

bool DataServer::GrowBody(DataConn& c, uint64_t arrived) {
  const uint64_t size = c.body.size();
  const uint64_t want = std::min<uint64_t>(
      c.request.length, std::max({kFirstBodyChunk, size * 2, c.done + arrived}));
  const uint64_t more = want - c.body_charged;
  uint64_t held = body_bytes_held_.load(std::memory_order_relaxed);
  do {
    if (held + more > options_.max_body_bytes_held) {
      shed_bodies_++;
      CountError(ErrorReason::kBodyLimit);
      GLOG_DEBUG("data server: closing a connection whose request body would pass the {} bytes "
                 "all partial bodies may hold",
                 options_.max_body_bytes_held);
      return false;
    }
  } while (!body_bytes_held_.compare_exchange_weak(held, held + more, std::memory_order_relaxed));
  c.body_charged = want;
  c.body.resize(want);
  return true;
}

void DataServer::FreeBody(DataConn& c) {
  body_bytes_held_.fetch_sub(c.body_charged, std::memory_order_relaxed);
  c.body_charged = 0;
  c.body = {};
}

void DataServer::Respond(DataConn& c, ErrorCode status, const uint8_t* payload, uint64_t length) {
  c.response = ResponseHeader{};
  c.response.status = static_cast<int32_t>(status);
  c.response.request_id = c.request.request_id;
  c.response.length = length;
  c.payload = payload;
  c.payload_len = length;
  c.sent = 0;
  c.phase = Phase::kSend;
}

// Moves the connection forward until the socket would block, it must close, or its turn is up.
DataServer::Next DataServer::Drive(DataConn& c, FenceSlot& slot) {
  if (MonotonicNs() >= c.deadline_ns.load(std::memory_order_relaxed)) {
    timeouts_++;
    if (c.MidRequest()) CountError(ErrorReason::kTimeout);
    return Next::kClose;
  }
  for (int step = 0; step < kStepsPerTurn; ++step) {
    ssize_t r = 0;
    switch (c.phase) {
      case Phase::kHeader: {
        // The header, then (CAP_*) the capability that follows it.
        constexpr size_t kHeader = sizeof(RequestHeader);
        const bool in_header = c.header_got < kHeader;
        const size_t want = in_header ? kHeader : kHeader + sizeof(transfer::Capability);
        uint8_t* into = in_header ? reinterpret_cast<uint8_t*>(&c.request) + c.header_got
                                  : reinterpret_cast<uint8_t*>(&c.capability) +
                                        (c.header_got - kHeader);
        if (c.header_got == 0 && !c.HasAhead()) {
          r = recv(c.fd, c.ahead, sizeof(c.ahead), 0);
          if (r > 0) {
            c.ahead_len = static_cast<uint8_t>(r);
            c.ahead_pos = 0;
          }
        }
        if (c.header_got > 0 || c.HasAhead()) r = Receive(c, into, want - c.header_got);
        if (r > 0) {
          c.last_progress_ns = MonotonicNs();
          if (c.header_got == 0) c.request_start_ns = c.last_progress_ns;
          c.header_got += static_cast<size_t>(r);
          if (c.header_got < want) continue;
          if (c.header_got == kHeader && IsCapability(c.request.opcode) && WellFormed(c.request)) {
            continue;  // its capability follows
          }
          c.header_got = 0;
          Next next = StartRequest(c, slot);
          if (next == Next::kClose || next == Next::kHandedOff) return next;
          continue;
        }
        break;
      }
      case Phase::kBody:
      case Phase::kDrain:
      case Phase::kPayload: {
        const uint64_t left = c.request.length - c.done;
        if (c.phase == Phase::kPayload) {
          if (!EnterMount(slot, c.request.segment_token)) {
            // Remounted since the header: the rest is drained, never stored, and refused.
            fenced_++;
            CountError(ErrorReason::kFenced);
            c.drain_status = static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND);
            c.phase = Phase::kDrain;
            continue;
          }
          {
            ScopedSegmentWrite payload;  // segment bytes: ordered by the master (common/tsan.h)
            r = Receive(c, c.target + c.done, left);
          }
          LeaveMount(slot);
        } else if (c.phase == Phase::kBody) {
          if (c.done < c.body.size()) {
            r = Receive(c, c.body.data() + c.done, c.body.size() - c.done);
          } else {
            // Full (or not begun): the bytes land in scratch first, so memory is taken only
            // for bytes that came.
            auto& scratch = Scratch();
            r = Receive(c, scratch.data(), std::min<uint64_t>(left, scratch.size()));
            if (r > 0) {
              if (!GrowBody(c, static_cast<uint64_t>(r))) return Next::kClose;
              std::memcpy(c.body.data() + c.done, scratch.data(), static_cast<size_t>(r));
            }
          }
        } else {
          auto& scratch = Scratch();
          r = Receive(c, scratch.data(), std::min<uint64_t>(left, scratch.size()));
        }
        if (r > 0) {
          c.last_progress_ns = MonotonicNs();
          c.done += static_cast<uint64_t>(r);
          if (c.done < c.request.length) continue;
          if (c.phase == Phase::kPayload) {
            bytes_written_ += c.request.length;
            Op(Opcode::kWrite).bytes->Inc(c.request.length);
            Respond(c, ErrorCode::OK, nullptr, 0);
          } else if (c.phase == Phase::kDrain) {
            Respond(c, static_cast<ErrorCode>(c.drain_status), nullptr, 0);
          } else {
            Next next = FinishBody(c);
            if (next == Next::kClose || next == Next::kHandedOff) return next;
          }
          continue;
        }
        break;
      }
      case Phase::kSend: {
        iovec iov[2];
        int iovcnt = 0;
        if (c.sent < sizeof(ResponseHeader)) {
          iov[iovcnt++] = {reinterpret_cast<uint8_t*>(&c.response) + c.sent,
                           sizeof(ResponseHeader) - c.sent};
          if (c.payload_len > 0) iov[iovcnt++] = {const_cast<uint8_t*>(c.payload), c.payload_len};
        } else {
          const uint64_t off = c.sent - sizeof(ResponseHeader);
          iov[iovcnt++] = {const_cast<uint8_t*>(c.payload) + off, c.payload_len - off};
        }
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = static_cast<size_t>(iovcnt);
        const bool fenced = c.sending_segment && c.payload_len > 0;
        if (fenced && !EnterMount(slot, c.request.segment_token)) {
          // Remounted since the header: refused if nothing went out yet, else cut off (the
          // answer's header promised bytes that will not come).
          fenced_++;
          CountError(ErrorReason::kFenced);
          c.sending_segment = false;
          if (c.sent > 0) return Next::kClose;
          Respond(c, ErrorCode::SEGMENT_NOT_FOUND, nullptr, 0);
          continue;
        }
        {
          ScopedSegmentRead payload;  // segment bytes: ordered by the master (common/tsan.h)
          r = sendmsg(c.fd, &msg, MSG_NOSIGNAL);  // never SIGPIPE: a vanished peer is an error
        }
        if (fenced) LeaveMount(slot);
        if (r > 0) {
          c.last_progress_ns = MonotonicNs();
          c.sent += static_cast<uint64_t>(r);
          if (c.sent < sizeof(ResponseHeader) + c.payload_len) continue;
          if (c.sending_segment) {
            bytes_read_ += c.payload_len;
            Op(Opcode::kRead).bytes->Inc(c.payload_len);
          }
          if (c.response.status == static_cast<int32_t>(ErrorCode::OK)) ObserveAnswered(c);
          if (c.close_after_answer) return Next::kClose;
          c.sending_segment = false;
          c.payload = nullptr;
          c.out.clear();
          c.phase = Phase::kHeader;
          // A client waits for this answer before its next request, so a receive now would
          // almost always find nothing: the re-arm reports a request already there at once.
          if (!c.HasAhead()) return Next::kRead;
          continue;
        }
        if (r < 0 && WouldBlock(errno)) return Next::kWrite;
        if (r < 0 && errno == EINTR) continue;
        if (c.sending_segment) CountError(ErrorReason::kPeerClosed);
        return Next::kClose;
      }
      case Phase::kDisk:
        return Next::kHandedOff;  // not reached: a disk thread holds it
    }
    // A receive that moved nothing: would block, interrupted, or the end of the connection.
    if (r < 0 && WouldBlock(errno)) return Next::kRead;
    if (r < 0 && errno == EINTR) continue;
    // Cut mid-frame; a close between requests is clean.
    if (c.MidRequest()) CountError(ErrorReason::kPeerClosed);
    return Next::kClose;
  }
  return c.phase == Phase::kSend ? Next::kWrite : Next::kRead;  // resumes at once if ready
}

// A whole header arrived: checked before any memory is touched.
DataServer::Next DataServer::StartRequest(DataConn& c, FenceSlot& slot) {
  const RequestHeader& h = c.request;
  if (!WellFormed(h)) {
    rejected_frames_++;
    error_series_[static_cast<size_t>(ErrorReason::kBadFrame)]->Inc();
    GLOG_DEBUG(
        "data server closing a connection after a malformed header (magic {:#x}, "
        "version {}, opcode {}, reserved {}, length {})",
        h.magic, h.version, static_cast<int>(h.opcode), h.reserved, h.length);
    return Next::kClose;
  }
  requests_++;
  Op(h.opcode).requests->Inc();
  c.done = 0;
  switch (h.opcode) {
    case Opcode::kPing:
      Respond(c, ErrorCode::OK, nullptr, 0);
      return Next::kRead;
    case Opcode::kStageInfo:
      ServeStageInfo(c);
      return Next::kRead;
    case Opcode::kDiskRead:
    case Opcode::kDiskStage:
    case Opcode::kStageRelease:
      // Read whole (small: kMaxDiskReadBody) before anything is answered, so a refusal leaves
      // the connection in sync; held only as it arrives (GrowBody).
      FreeBody(c);
      c.phase = Phase::kBody;
      return h.length == 0 ? FinishBody(c) : Next::kRead;
    default:
      break;
  }
  // Token first: with a stale token the range means nothing here. Overflow-safe range check.
  // The memory is the accepting mount's, read inside the fence so the two belong together.
  ErrorCode refusal = ErrorCode::OK;
  uint8_t* base = nullptr;
  if (options_.require_capabilities && !IsCapability(h.opcode)) {
    capability_refusals_++;
    CountError(ErrorReason::kCapability);
    Respond(c, ErrorCode::PERMISSION_DENIED, nullptr, 0);
    c.close_after_answer = h.opcode == Opcode::kWrite && h.length > 0;
    return Next::kRead;
  }
  if (IsCapability(h.opcode)) {
    // Served from here on as the READ or WRITE of the mount whose key the capability passed.
    refusal = AdmitCapability(c, slot);
    if (refusal != ErrorCode::OK) {
      capability_refusals_++;
      CountError(ErrorReason::kCapability);
      Respond(c, refusal, nullptr, 0);
      c.close_after_answer = c.request.opcode == Opcode::kCapWrite && h.length > 0;
      return Next::kRead;
    }
  }
  if (!EnterMount(slot, h.segment_token)) {  // token 0 ("not mounted yet") included
    refusal = ErrorCode::SEGMENT_NOT_FOUND;
  } else {
    base = base_.load(std::memory_order_acquire);
    LeaveMount(slot);
    if (h.offset > size_ || h.length > size_ - h.offset) refusal = ErrorCode::INVALID_PARAMS;
  }
  const bool is_write = h.opcode == Opcode::kWrite;
  if (refusal != ErrorCode::OK) {
    CountError(refusal == ErrorCode::SEGMENT_NOT_FOUND ? ErrorReason::kStaleMount
                                                       : ErrorReason::kOutOfRange);
    Respond(c, refusal, nullptr, 0);
    // A refused WRITE's payload is never waited for (a peer may announce one and send nothing):
    // the answer goes out at once, then the connection closes.
    c.close_after_answer = is_write && h.length > 0;
    return Next::kRead;
  }
  if (is_write) {
    c.phase = Phase::kPayload;
    c.target = base + h.offset;
    if (h.length == 0) Respond(c, ErrorCode::OK, nullptr, 0);
    return Next::kRead;
  }
  Respond(c, ErrorCode::OK, base + h.offset, h.length);
  c.sending_segment = true;
  return Next::kRead;
}

}  // namespace granary::node
