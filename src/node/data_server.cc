#include "node/data_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "common/logging.h"
#include "common/tsan.h"
#include "transfer/iovec.h"
#include "transfer/protocol.h"

namespace granary::node {

namespace {

using transfer::Opcode;
using transfer::RequestHeader;
using transfer::ResponseHeader;

constexpr size_t kDrainChunk = 64 * 1024;  // scratch for a refused WRITE's payload

// Receives exactly n bytes. MSG_WAITALL keeps large payloads to few calls; the loop resumes after
// a timeout that still made progress, so only a peer silent for a whole SO_RCVTIMEO fails.
// *got (optional) says how far it came, to tell a clean close at a frame boundary from a cut.
bool RecvAll(int fd, void* buf, size_t n, size_t* got = nullptr) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = recv(fd, p + done, n - done, MSG_WAITALL);
    if (r > 0) {
      done += static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // 0: peer closed; EAGAIN: idle timeout; anything else: broken connection
    }
  }
  if (got != nullptr) *got = done;
  return done == n;
}

// Sends the iovecs completely (MSG_NOSIGNAL: a vanished peer is an error, not SIGPIPE).
bool SendAll(int fd, iovec* iov, int iovcnt) {
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    ssize_t r = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    transfer::ConsumeIov(&iov, &iovcnt, static_cast<size_t>(r));
  }
  return true;
}

bool SendResponse(int fd, uint64_t request_id, ErrorCode status, const uint8_t* payload,
                  uint64_t length) {
  ResponseHeader rh;
  rh.status = static_cast<int32_t>(status);
  rh.request_id = request_id;
  rh.length = length;
  iovec iov[2] = {{&rh, sizeof(rh)}, {const_cast<uint8_t*>(payload), length}};
  return SendAll(fd, iov, length > 0 ? 2 : 1);
}

bool WellFormed(const RequestHeader& h) {
  bool opcode_ok = h.opcode == Opcode::kRead || h.opcode == Opcode::kWrite ||
                   h.opcode == Opcode::kPing || h.opcode == Opcode::kDiskRead ||
                   h.opcode == Opcode::kDiskStage || h.opcode == Opcode::kStageRelease ||
                   h.opcode == Opcode::kStageInfo;
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

void SetTimeout(int fd, int option, int ms) {
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = static_cast<suseconds_t>(ms % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, option, &tv, sizeof(tv));
}

}  // namespace

DataServer::DataServer(uint8_t* base, uint64_t size, uint64_t segment_token, Options options)
    : base_(base), size_(size), token_(segment_token), options_(std::move(options)) {}

DataServer::~DataServer() { Stop(); }

Status DataServer::Start() {
  std::lock_guard lock(mu_);
  if (started_ || stopping_) {
    return Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                  "data server already started or stopped");
  }
  if (base_ == nullptr && size_ > 0) {
    return Status(ErrorCode::INVALID_PARAMS, "data server given a null segment");
  }
  if (options_.max_connections == 0 || options_.idle_timeout_ms <= 0) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "data server needs max_connections >= 1 and idle_timeout_ms > 0");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(options_.port);
  if (int rc = getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "data server cannot resolve host '" + options_.host + "': " + gai_strerror(rc));
  }
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1;
    // Lets a restarted node rebind past TIME_WAIT; Linux still refuses a port someone listens on.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 512) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    return Status(ErrorCode::TRANSFER_FAIL,
                  "data server cannot listen on " + options_.host + ":" + port + ": " + last_error);
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  uint16_t bound = addr.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (pipe2(wake_pipe_, O_CLOEXEC) != 0) {
    int err = errno;
    close(fd);
    return Status(ErrorCode::INTERNAL_ERROR, std::string("pipe2 failed: ") + std::strerror(err));
  }
  listen_fd_ = fd;
  port_ = bound;
  started_ = true;
  acceptor_ = std::thread(&DataServer::AcceptLoop, this);
  GLOG_INFO("data server listening on {}:{} (segment {} bytes, max {} connections)", options_.host,
            bound, size_, options_.max_connections);
  return Status::Ok();
}

void DataServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      GLOG_ERROR("data server poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;  // Stop()
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    ReapFinished();
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        GLOG_WARN("data server cannot accept: {}; retrying shortly", std::strerror(errno));
        poll(&fds[1], 1, 100);  // back off, but wake at once for Stop()
      }
      continue;  // EINTR, ECONNABORTED, EAGAIN...: just try again
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    SetTimeout(fd, SO_RCVTIMEO, options_.idle_timeout_ms);
    SetTimeout(fd, SO_SNDTIMEO, options_.idle_timeout_ms);

    std::lock_guard lock(mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    if (open_connections_.load() >= options_.max_connections) {
      rejected_connections_++;  // counted first: a test may look as soon as it sees the close
      close(fd);
      GLOG_DEBUG("data server refused a connection: {} open", options_.max_connections);
      continue;
    }
    auto conn = std::make_unique<Conn>();
    conn->fd = fd;
    conn->id = next_conn_id_.fetch_add(1, std::memory_order_relaxed);
    Conn* raw = conn.get();
    conns_.push_back(std::move(conn));
    open_connections_++;
    try {
      raw->thread = std::thread(&DataServer::Serve, this, raw);
    } catch (const std::system_error& e) {
      GLOG_WARN("data server cannot start a connection thread: {}", e.what());
      rejected_connections_++;
      close(fd);
      conns_.pop_back();
      open_connections_--;
    }
  }
}

void DataServer::ReapFinished() {
  std::list<std::unique_ptr<Conn>> finished;
  {
    std::lock_guard lock(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      auto next = std::next(it);
      if ((*it)->done) finished.splice(finished.end(), conns_, it);
      it = next;
    }
  }
  for (auto& conn : finished) {
    if (conn->thread.joinable()) conn->thread.join();
  }
}

void DataServer::Serve(Conn* conn) {
  const int fd = conn->fd;  // stable until this thread closes it below
  std::vector<uint8_t> scratch;
  while (true) {
    RequestHeader h;
    size_t got = 0;
    if (!RecvAll(fd, &h, sizeof(h), &got)) {
      if (got > 0) errors_++;  // cut or stalled mid-header
      break;
    }
    if (!WellFormed(h)) {
      rejected_frames_++;
      GLOG_DEBUG(
          "data server closing a connection after a malformed header (magic {:#x}, "
          "version {}, opcode {}, reserved {}, length {})",
          h.magic, h.version, static_cast<int>(h.opcode), h.reserved, h.length);
      break;
    }
    requests_++;
    if (h.opcode == Opcode::kPing) {
      if (!SendResponse(fd, h.request_id, ErrorCode::OK, nullptr, 0)) break;
      continue;
    }
    if (h.opcode == Opcode::kDiskRead) {
      if (!ServeDiskRead(fd, h)) break;
      continue;
    }
    if (h.opcode == Opcode::kDiskStage) {
      if (!ServeDiskStage(fd, conn->id, h)) break;
      continue;
    }
    if (h.opcode == Opcode::kStageRelease) {
      if (!ServeStageRelease(fd, conn->id, h)) break;
      continue;
    }
    if (h.opcode == Opcode::kStageInfo) {
      if (!ServeStageInfo(fd, h)) break;
      continue;
    }
    // Token first: with a stale token the range means nothing here. Overflow-safe range check.
    ErrorCode refusal = ErrorCode::OK;
    const uint64_t current = token_.load(std::memory_order_acquire);
    if (h.segment_token == 0 || h.segment_token != current) {  // 0: not mounted yet
      refusal = ErrorCode::SEGMENT_NOT_FOUND;
    } else if (h.offset > size_ || h.length > size_ - h.offset) {
      refusal = ErrorCode::INVALID_PARAMS;
    }
    const bool is_write = h.opcode == Opcode::kWrite;
    if (refusal != ErrorCode::OK) {
      errors_++;
      if (is_write) {
        // Drain the payload so the next header is read where it starts.
        if (scratch.empty()) scratch.resize(kDrainChunk);
        uint64_t left = h.length;
        bool ok = true;
        while (left > 0 && ok) {
          size_t n = static_cast<size_t>(std::min<uint64_t>(left, scratch.size()));
          ok = RecvAll(fd, scratch.data(), n);
          left -= n;
        }
        if (!ok) break;
      }
      if (!SendResponse(fd, h.request_id, refusal, nullptr, 0)) break;
      continue;
    }
    uint8_t* range = base_ + h.offset;
    if (is_write) {
      bool received;
      {
        ScopedSegmentWrite payload;  // segment bytes: ordered by the master, not here (common/tsan.h)
        received = RecvAll(fd, range, h.length);
      }
      if (!received) {
        errors_++;  // the put stays uncommitted; the client reports the failure
        break;
      }
      bytes_written_ += h.length;
      if (!SendResponse(fd, h.request_id, ErrorCode::OK, nullptr, 0)) break;
    } else {
      bool sent;
      {
        ScopedSegmentRead payload;  // segment bytes: ordered by the master, not here (common/tsan.h)
        sent = SendResponse(fd, h.request_id, ErrorCode::OK, range, h.length);
      }
      if (!sent) {
        errors_++;
        break;
      }
      bytes_read_ += h.length;
    }
  }
  // The client may have died between staging and release: its slots go back now, not at the TTL.
  if (ShmStaging* staging = staging_.load(std::memory_order_acquire)) {
    staging->ReleaseOwner(conn->id);
  }
  std::lock_guard lock(mu_);
  close(conn->fd);
  conn->fd = -1;
  conn->done = true;
  open_connections_--;
}

Result<std::vector<DiskReadService::Entry>> DataServer::ParseDiskBatch(
    const RequestHeader& h, std::span<const uint8_t> body, const char* op, bool has_tier,
    const Status& missing) {
  if (h.offset != 0 || h.segment_token != 0) {
    return Status(ErrorCode::INVALID_PARAMS,
                  std::string(op) + " with an offset or a segment token");
  }
  if (!has_tier) return Status(ErrorCode::OBJECT_NOT_FOUND, "this node has no disk tier");
  if (!missing.ok()) return missing;
  return DiskReadService::Parse(body);
}

bool DataServer::StartDiskBatch(int fd, const RequestHeader& h, const char* op,
                                const Result<std::vector<DiskReadService::Entry>>& entries,
                                bool* serve) {
  *serve = false;
  if (!entries.ok()) {
    errors_++;
    GLOG_DEBUG("data server refused a {}: {}", op, entries.status().ToString());
    return SendResponse(fd, h.request_id, entries.status().code(), nullptr, 0);
  }
  ResponseHeader head;
  head.status = 0;
  head.request_id = h.request_id;
  head.length = entries->size();
  iovec iov{&head, sizeof(head)};
  if (!SendAll(fd, &iov, 1)) return false;
  *serve = true;
  return true;
}

// The body is read whole (it is small: kMaxDiskReadBody) before anything is answered, so a
// refusal leaves the connection in sync.
bool DataServer::ServeDiskRead(int fd, const RequestHeader& h) {
  std::vector<uint8_t> body(h.length);
  if (!RecvAll(fd, body.data(), body.size())) {
    errors_++;
    return false;
  }
  DiskReadService* reads = disk_reads_.load(std::memory_order_acquire);
  Result<std::vector<DiskReadService::Entry>> entries =
      ParseDiskBatch(h, body, "DISK_READ", reads != nullptr, Status::Ok());
  bool serve = false;
  if (!StartDiskBatch(fd, h, "DISK_READ", entries, &serve)) return false;
  if (!serve) return true;
  return reads->Serve(*entries, [&](uint32_t index, ErrorCode code,
                                    std::span<const std::byte> bytes) {
    if (code != ErrorCode::OK) errors_++;
    disk_bytes_read_ += bytes.size();  // counted first: the client may look once it has them
    if (!SendResponse(fd, index, code, reinterpret_cast<const uint8_t*>(bytes.data()),
                      bytes.size())) {
      errors_++;
      return false;
    }
    return true;
  });
}

// DISK_STAGE: DISK_READ's body and framing, but an OK entry's payload is where its bytes are.
bool DataServer::ServeDiskStage(int fd, uint64_t conn_id, const RequestHeader& h) {
  std::vector<uint8_t> body(h.length);
  if (!RecvAll(fd, body.data(), body.size())) {
    errors_++;
    return false;
  }
  DiskReadService* reads = disk_reads_.load(std::memory_order_acquire);
  ShmStaging* staging = staging_.load(std::memory_order_acquire);
  Result<std::vector<DiskReadService::Entry>> entries = ParseDiskBatch(
      h, body, "DISK_STAGE", reads != nullptr,
      staging != nullptr ? Status::Ok()
                         : Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                                  "this node has no staging region"));
  bool serve = false;
  if (!StartDiskBatch(fd, h, "DISK_STAGE", entries, &serve)) return false;
  if (!serve) return true;
  const uint64_t token = staging->token();
  return reads->ServeStaged(
      *entries, staging, conn_id,
      [&](uint32_t index, ErrorCode code, const ShmStaging::Grant* grant) {
        transfer::StagedSlot slot;
        if (code == ErrorCode::OK) {
          slot.region_token = token;
          slot.offset = grant->offset;
          slot.length = (*entries)[index].size;
          slot.slot = grant->slot;
          slot.generation = grant->generation;
          disk_bytes_staged_ += slot.length;
        } else {
          errors_++;
        }
        const bool ok = code == ErrorCode::OK;
        if (!SendResponse(fd, index, code, reinterpret_cast<const uint8_t*>(&slot),
                          ok ? sizeof(slot) : 0)) {
          errors_++;
          return false;
        }
        return true;
      });
}

// STAGE_RELEASE: each ref is judged alone; only this connection's handed slots are freed.
bool DataServer::ServeStageRelease(int fd, uint64_t conn_id, const RequestHeader& h) {
  std::vector<uint8_t> body(h.length);
  if (!RecvAll(fd, body.data(), body.size())) {
    errors_++;
    return false;
  }
  ShmStaging* staging = staging_.load(std::memory_order_acquire);
  transfer::StageReleaseBody rb;
  ErrorCode refusal = ErrorCode::OK;
  if (staging == nullptr) {
    refusal = ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  } else if (h.offset != 0 || h.segment_token != 0 || body.size() < sizeof(rb)) {
    refusal = ErrorCode::INVALID_PARAMS;
  } else {
    std::memcpy(&rb, body.data(), sizeof(rb));
    if (rb.reserved != 0 || rb.count == 0 || rb.count > transfer::kMaxStageRelease ||
        body.size() != sizeof(rb) + uint64_t{rb.count} * sizeof(transfer::SlotRef)) {
      refusal = ErrorCode::INVALID_PARAMS;
    }
  }
  if (refusal != ErrorCode::OK) {
    errors_++;
    return SendResponse(fd, h.request_id, refusal, nullptr, 0);
  }
  std::vector<int32_t> codes(rb.count);
  for (uint32_t i = 0; i < rb.count; ++i) {
    transfer::SlotRef ref;
    std::memcpy(&ref, body.data() + sizeof(rb) + i * sizeof(ref), sizeof(ref));
    const ErrorCode code = ref.reserved != 0 ? ErrorCode::INVALID_PARAMS
                                             : staging->Release(ref.slot, ref.generation, conn_id);
    if (code != ErrorCode::OK) errors_++;
    codes[i] = static_cast<int32_t>(code);
  }
  return SendResponse(fd, h.request_id, ErrorCode::OK, reinterpret_cast<const uint8_t*>(codes.data()),
                      codes.size() * sizeof(int32_t));
}

bool DataServer::ServeStageInfo(int fd, const RequestHeader& h) {
  ShmStaging* staging = staging_.load(std::memory_order_acquire);
  if (staging == nullptr || disk_reads_.load(std::memory_order_acquire) == nullptr) {
    errors_++;
    return SendResponse(fd, h.request_id, ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, nullptr, 0);
  }
  transfer::StageInfo info;
  info.region_token = staging->token();
  info.data_bytes = staging->data_bytes();
  info.slot_count = staging->slot_count();
  info.name_len = static_cast<uint32_t>(staging->name().size());
  std::vector<uint8_t> payload(sizeof(info) + info.name_len);
  std::memcpy(payload.data(), &info, sizeof(info));
  std::memcpy(payload.data() + sizeof(info), staging->name().data(), info.name_len);
  return SendResponse(fd, h.request_id, ErrorCode::OK, payload.data(), payload.size());
}

void DataServer::Stop() {
  std::lock_guard stop_lock(stop_mu_);
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  if (wake_pipe_[1] >= 0) {
    char c = 1;
    ssize_t ignored = write(wake_pipe_[1], &c, 1);
    (void)ignored;
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::list<std::unique_ptr<Conn>> conns;
  {
    std::lock_guard lock(mu_);
    // Wakes every thread blocked in recv/send; each then closes its own descriptor.
    for (auto& conn : conns_) {
      if (conn->fd >= 0) shutdown(conn->fd, SHUT_RDWR);
    }
    conns.swap(conns_);
  }
  for (auto& conn : conns) {
    if (conn->thread.joinable()) conn->thread.join();
  }
  for (int* fd : {&listen_fd_, &wake_pipe_[0], &wake_pipe_[1]}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

DataServer::Stats DataServer::stats() const {
  Stats s;
  s.requests = requests_.load();
  s.bytes_read = bytes_read_.load();
  s.bytes_written = bytes_written_.load();
  s.errors = errors_.load();
  s.open_connections = open_connections_.load();
  s.rejected_frames = rejected_frames_.load();
  s.rejected_connections = rejected_connections_.load();
  s.disk_bytes_read = disk_bytes_read_.load();
  s.disk_bytes_staged = disk_bytes_staged_.load();
  return s;
}

}  // namespace granary::node
