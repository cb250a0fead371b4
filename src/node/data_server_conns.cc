// node::DataServer's connections (data_server.h): listening, accepting, finding a connection by
// its key, the deadlines the acceptor enforces (and their budget), closing, stopping, and the
// server's stats. The requests themselves are driven in data_server.cc.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "node/data_server.h"

namespace granary::node {

namespace {
using Phase = DataConn::Phase;
constexpr int kAcceptsPerWake = 256;
}  // namespace

Status DataServer::Start() {
  std::lock_guard lock(mu_);
  if (started_ || stopping_) {
    return Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                  "data server already started or stopped");
  }
  if (base_ == nullptr && size_ > 0) {
    return Status(ErrorCode::INVALID_PARAMS, "data server given a null segment");
  }
  if (options_.max_connections == 0 || options_.idle_timeout_ms <= 0 ||
      options_.request_timeout_ms <= 0 || options_.io_threads == 0 ||
      options_.disk_threads == 0 || options_.min_transfer_rate == 0) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "data server needs max_connections, io_threads, disk_threads, "
                  "idle_timeout_ms, request_timeout_ms and min_transfer_rate >= 1");
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
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1;
    // Lets a restarted node rebind past TIME_WAIT; Linux still refuses a port someone listens on.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
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
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  stop_event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event stop_ev{};
  stop_ev.events = EPOLLIN;  // level-triggered: every I/O thread sees it
  stop_ev.data.u64 = kStopEventKey;
  if (epoll_fd_ < 0 || stop_event_fd_ < 0 || pipe2(wake_pipe_, O_CLOEXEC) != 0 ||
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, stop_event_fd_, &stop_ev) != 0) {
    int err = errno;
    close(fd);
    for (int* f : {&epoll_fd_, &stop_event_fd_, &wake_pipe_[0], &wake_pipe_[1]}) {
      if (*f >= 0) close(*f);
      *f = -1;
    }
    return Status(ErrorCode::INTERNAL_ERROR,
                  std::string("data server cannot set up epoll: ") + std::strerror(err));
  }
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < options_.max_connections + 64) {
    GLOG_WARN("data server: {} connections allowed but only {} descriptors (RLIMIT_NOFILE)",
              options_.max_connections, static_cast<uint64_t>(files.rlim_cur));
  }
  listen_fd_ = fd;
  port_ = bound;
  started_ = true;
  for (size_t i = 0; i < options_.io_threads; ++i) {
    io_threads_.emplace_back(&DataServer::IoLoop, this, &fence_slots_[i]);
  }
  for (size_t i = 0; i < options_.disk_threads; ++i) {
    disk_threads_.emplace_back(&DataServer::DiskLoop, this);
  }
  acceptor_ = std::thread(&DataServer::AcceptLoop, this);
  GLOG_INFO("data server listening on {}:{} (segment {} bytes, max {} connections, {} I/O threads)",
            options_.host, bound, size_, options_.max_connections, options_.io_threads);
  return Status::Ok();
}

int64_t DataServer::BudgetNs(uint64_t bytes) const {
  // In double: a DISK_READ may announce up to 1024 GiB, whose nanoseconds overflow an int64.
  const double ns = options_.request_timeout_ms * 1e6 +
                    static_cast<double>(bytes) * 1e9 / static_cast<double>(options_.min_transfer_rate);
  return ns >= 4e18 ? int64_t{4'000'000'000'000'000'000} : static_cast<int64_t>(ns);
}

// The acceptor also runs the timer: deadlines are checked every `tick`, a twentieth of the
// shorter timeout (5-200 ms), so a connection is dropped within ~5% of its deadline.
void DataServer::AcceptLoop() {
  const int shorter = std::min(options_.idle_timeout_ms, options_.request_timeout_ms);
  const int tick_ms = std::clamp(shorter / 20, 5, 200);
  int64_t next_scan = MonotonicNs() + int64_t{tick_ms} * 1'000'000;
  while (true) {
    const int64_t now = MonotonicNs();
    if (now >= next_scan) {
      ExpireDeadlines();
      next_scan = now + int64_t{tick_ms} * 1'000'000;
    }
    const int wait_ms = static_cast<int>(std::max<int64_t>(0, (next_scan - now) / 1'000'000) + 1);
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    int n = poll(fds, 2, wait_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      GLOG_ERROR("data server poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;  // Stop()
    if (fds[0].revents != 0) AcceptReady();
  }
}

void DataServer::AcceptReady() {
  for (int i = 0; i < kAcceptsPerWake; ++i) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        GLOG_WARN("data server cannot accept: {}; retrying shortly", std::strerror(errno));
        pollfd wake{wake_pipe_[0], POLLIN, 0};
        poll(&wake, 1, 100);  // back off, but wake at once for Stop()
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // EAGAIN: all taken
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

    std::lock_guard lock(mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    if (open_connections_.load() >= options_.max_connections) {
      rejected_connections_++;  // counted first: a test may look as soon as it sees the close
      connections_rejected_->Inc();
      close(fd);
      GLOG_DEBUG("data server refused a connection: {} open", options_.max_connections);
      continue;
    }
    auto conn = std::make_shared<DataConn>(fd, next_conn_id_.fetch_add(1));
    conn->last_progress_ns = MonotonicNs();
    conn->deadline_ns = conn->last_progress_ns + int64_t{options_.idle_timeout_ms} * 1'000'000;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.u64 = conn->id;
    // Registered under mu_, with the map entry: a ready event always finds its connection.
    conns_.emplace(conn->id, conn);
    open_connections_++;
    connections_accepted_->Inc();
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      GLOG_WARN("data server cannot watch a connection: {}", std::strerror(errno));
      conns_.erase(conn->id);
      open_connections_--;
      rejected_connections_++;
      connections_rejected_->Inc();
      close(fd);
    }
  }
}

DataServer::ConnPtr DataServer::Find(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second;
}

// Drops every connection past its deadline that nobody is driving (one being driven is checked
// by its driver before it waits again).
void DataServer::ExpireDeadlines() {
  const int64_t now = MonotonicNs();
  std::vector<ConnPtr> due;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, conn] : conns_) {
      if (conn->deadline_ns.load(std::memory_order_relaxed) <= now) due.push_back(conn);
    }
  }
  for (auto& conn : due) {
    std::unique_lock lock(conn->mu, std::try_to_lock);
    if (!lock.owns_lock() || conn->closed || conn->deadline_ns.load() > now) continue;
    if (conn->phase == Phase::kDisk) {  // queued (a disk thread serving it holds its lock)
      ExpireQueuedDisk(*conn);
      continue;
    }
    timeouts_++;
    // The put stays uncommitted; the client reports it.
    if (conn->MidRequest()) CountError(ErrorReason::kTimeout);
    GLOG_DEBUG("data server dropped a connection at its deadline ({})",
               conn->MidRequest() ? "mid-request" : "idle");
    Close(*conn);
  }
}

// The earlier of: idle_timeout_ms after the last byte, and (mid-request) the request's budget.
void DataServer::UpdateDeadline(DataConn& c) {
  int64_t deadline = c.last_progress_ns + int64_t{options_.idle_timeout_ms} * 1'000'000;
  if (c.MidRequest() || c.phase != Phase::kHeader) {
    const uint64_t bytes = c.header_got > 0 ? 0 : c.request.length;
    deadline = std::min(deadline, c.request_start_ns + BudgetNs(bytes));
  }
  c.deadline_ns.store(deadline, std::memory_order_relaxed);
}

void DataServer::Close(DataConn& c) {
  if (c.closed) return;
  c.closed = true;
  FreeBody(c);
  // The client may have died between staging and release: its slots go back now, not at the TTL.
  if (ShmStaging* staging = staging_.load(std::memory_order_acquire)) {
    staging->ReleaseOwner(c.id);
  }
  std::lock_guard lock(mu_);
  conns_.erase(c.id);
  close(c.fd);  // also leaves the epoll set
  open_connections_--;
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
  {
    // Wakes a disk thread blocked sending; the I/O threads never block on a peer.
    std::lock_guard lock(mu_);
    for (auto& [id, conn] : conns_) shutdown(conn->fd, SHUT_RDWR);
  }
  io_stopping_.store(true, std::memory_order_release);
  if (stop_event_fd_ >= 0) {
    uint64_t one = 1;
    ssize_t ignored = write(stop_event_fd_, &one, sizeof(one));
    (void)ignored;
  }
  for (auto& t : io_threads_) t.join();
  io_threads_.clear();
  {
    std::lock_guard lock(disk_mu_);
    disk_stopping_ = true;
    disk_queue_.clear();
  }
  disk_cv_.notify_all();
  for (auto& t : disk_threads_) t.join();
  disk_threads_.clear();
  std::vector<ConnPtr> left;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, conn] : conns_) left.push_back(conn);
  }
  for (auto& conn : left) {
    std::lock_guard lock(conn->mu);
    Close(*conn);
  }
  for (int* fd : {&listen_fd_, &wake_pipe_[0], &wake_pipe_[1], &epoll_fd_, &stop_event_fd_}) {
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
  s.timeouts = timeouts_.load();
  s.disk_bytes_read = disk_bytes_read_.load();
  s.disk_bytes_staged = disk_bytes_staged_.load();
  s.fenced = fenced_.load();
  s.shed_bodies = shed_bodies_.load();
  s.body_bytes_held = body_bytes_held_.load();
  s.capability_refusals = capability_refusals_.load();
  return s;
}

}  // namespace granary::node
