#include "etcd_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <list>

namespace granary::it {

namespace {

std::string Url(uint16_t port) { return "http://127.0.0.1:" + std::to_string(port); }

}  // namespace

// ---- EtcdServer ----

EtcdServer::EtcdServer(EtcdOptions options)
    : options_(std::move(options)), dir_("granary-it-etcd") {}

EtcdServer::EtcdServer(EtcdOptions options, uint16_t client_port, uint16_t peer_port,
                       std::string initial_cluster, std::string cluster_token)
    : options_(std::move(options)),
      dir_("granary-it-etcd"),
      client_port_(client_port),
      peer_port_(peer_port),
      initial_cluster_(std::move(initial_cluster)),
      cluster_token_(std::move(cluster_token)) {}

EtcdServer::~EtcdServer() { child_.KillAndReap(); }

std::string EtcdServer::Log() const {
  std::string out;
  for (int i = 1; i <= launches_; ++i) {
    const std::string path = dir_.File("etcd-" + std::to_string(i) + ".log");
    out += "----- " + options_.name + " " + path + " -----\n" + ReadFile(path);
  }
  if (out.size() > 64 * 1024) out = "[...]\n" + out.substr(out.size() - 64 * 1024);
  return out;
}

::testing::AssertionResult EtcdServer::Start() {
  ::testing::AssertionResult launched = Launch();
  if (!launched) return launched;
  return WaitHealthy();
}

::testing::AssertionResult EtcdServer::Launch() {
  if (client_port_ == 0) {
    client_port_ = PickFreePort();
    do {
      peer_port_ = PickFreePort();
    } while (peer_port_ == client_port_);
  }
  if (initial_cluster_.empty()) initial_cluster_ = options_.name + "=" + Url(peer_port_);
  if (cluster_token_.empty()) cluster_token_ = "granary-it-" + std::to_string(client_port_);
  // On a restart the data directory holds the member's WAL: etcd then ignores the --initial-*
  // flags and rejoins as the member it was.
  const std::vector<std::string> args = {
      "--name=" + options_.name,
      "--data-dir=" + data_dir(),
      "--listen-client-urls=" + Url(client_port_),
      "--advertise-client-urls=" + Url(client_port_),
      "--listen-peer-urls=" + Url(peer_port_),
      "--initial-advertise-peer-urls=" + Url(peer_port_),
      "--initial-cluster=" + initial_cluster_,
      "--initial-cluster-state=new",
      "--initial-cluster-token=" + cluster_token_,
      "--heartbeat-interval=" + std::to_string(options_.heartbeat_ms),
      "--election-timeout=" + std::to_string(options_.election_ms),
      "--logger=zap",
      "--log-level=warn",
  };

  ++launches_;
  const std::string log = dir_.File("etcd-" + std::to_string(launches_) + ".log");
  std::string error;
  if (!child_.Start(kEtcdBinary, args, log, &error)) {
    return ::testing::AssertionFailure() << "cannot start " << kEtcdBinary << ": " << error;
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult EtcdServer::WaitHealthy(Millis timeout) {
  // etcd answers {"health":"true"} once it has a leader and a quorum read succeeds.
  HttpResult last;
  const bool healthy = WaitUntil(
      [&] {
        if (!child_.Running()) return true;  // stop waiting: it died
        last = HttpGet(client_port_, "/health", Millis(1000));
        return last.status == 200 && last.body.find("\"health\":\"true\"") != std::string::npos;
      },
      timeout, Millis(25));
  if (!child_.Running()) {
    return ::testing::AssertionFailure()
           << "etcd " << options_.name << " "
           << (child_.exit_status() ? child_.exit_status()->ToString() : "ended")
           << " during start-up\n"
           << Log();
  }
  if (!healthy) {
    return ::testing::AssertionFailure()
           << "etcd " << options_.name << " not healthy within " << timeout.count()
           << " ms (last /health: " << last.status << " " << last.body << last.error << ")\n"
           << Log();
  }
  return ::testing::AssertionSuccess();
}

void EtcdServer::Kill() { child_.KillAndReap(); }

::testing::AssertionResult EtcdServer::Restart() {
  Kill();
  return Start();
}

std::optional<ExitStatus> EtcdServer::Stop(Millis timeout) {
  if (!child_.Kill(SIGTERM)) return child_.exit_status();
  return child_.Wait(timeout);
}

bool EtcdServer::Pause() { return child_.Kill(SIGSTOP) && child_.WaitStopped(Millis(5000)); }

bool EtcdServer::Resume() { return child_.Kill(SIGCONT); }

// ---- EtcdCluster ----

EtcdCluster::EtcdCluster(EtcdOptions options, int members) {
  std::vector<uint16_t> ports;  // client and peer port of each member, all distinct
  while (ports.size() < static_cast<size_t>(2 * members)) {
    const uint16_t port = PickFreePort();
    if (std::find(ports.begin(), ports.end(), port) == ports.end()) ports.push_back(port);
  }
  std::string initial_cluster;
  for (int i = 0; i < members; ++i) {
    if (i > 0) initial_cluster += ",";
    initial_cluster += "etcd" + std::to_string(i) + "=" + Url(ports[2 * i + 1]);
  }
  const std::string token = "granary-it-cluster-" + std::to_string(ports[0]);
  for (int i = 0; i < members; ++i) {
    EtcdOptions member = options;
    member.name = "etcd" + std::to_string(i);
    members_.push_back(std::make_unique<EtcdServer>(member, ports[2 * i], ports[2 * i + 1],
                                                    initial_cluster, token));
  }
}

::testing::AssertionResult EtcdCluster::Start() {
  for (auto& m : members_) {
    ::testing::AssertionResult launched = m->Launch();
    if (!launched) return launched;
  }
  for (auto& m : members_) {
    ::testing::AssertionResult healthy = m->WaitHealthy();
    if (!healthy) return healthy << "\n" << Log();
  }
  return ::testing::AssertionSuccess();
}

std::string EtcdCluster::endpoints() const {
  std::string out;
  for (const auto& m : members_) out += (out.empty() ? "" : ";") + m->endpoint();
  return out;
}

std::string EtcdCluster::Log() const {
  std::string out;
  for (const auto& m : members_) out += m->Log();
  return out;
}

std::optional<std::string> Etcdctl(const std::string& endpoints,
                                   const std::vector<std::string>& args, std::string* error) {
  TempDir dir("granary-it-etcdctl");
  std::vector<std::string> full = {"--endpoints=" + endpoints, "--command-timeout=5s"};
  full.insert(full.end(), args.begin(), args.end());
  const std::string log = dir.File("etcdctl.log");
  auto status = RunCommand(kEtcdctlBinary, full, log, Millis(10'000), error);
  if (!status) return std::nullopt;
  std::string output = ReadFile(log);
  if (!status->Succeeded()) {
    *error = "etcdctl " + status->ToString() + ": " + output;
    return std::nullopt;
  }
  return output;
}

// ---- TcpProxy ----

namespace {

constexpr size_t kChunk = 64 * 1024;
constexpr int kPollMs = 50;

void CloseWithReset(int fd) {
  if (fd < 0) return;
  linger lin{1, 0};  // a zero linger time makes close() send RST instead of FIN
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lin, sizeof(lin));
  ::close(fd);
}

}  // namespace

// One client connection and its upstream connection.
struct TcpProxy::Link {
  int client = -1;
  int upstream = -1;
  bool connected = false;   // the upstream connect() has completed
  std::string to_upstream;  // read from the client, not yet written upstream
  std::string to_client;
  bool dead = false;

  ~Link() {
    if (client >= 0) ::close(client);
    if (upstream >= 0) ::close(upstream);
  }
};

TcpProxy::TcpProxy(std::string upstream) {
  const size_t colon = upstream.rfind(':');
  upstream_host_ = upstream.substr(0, colon);
  upstream_port_ = static_cast<uint16_t>(std::stoi(upstream.substr(colon + 1)));
}

TcpProxy::~TcpProxy() { Stop(); }

bool TcpProxy::Start(std::string* error) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (listen_fd_ < 0 || wake_fd_ < 0) {
    *error = std::string("socket/eventfd: ") + std::strerror(errno);
    return false;
  }
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;  // the kernel's pick: free by construction, no race with PickFreePort
  socklen_t len = sizeof(addr);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    *error = std::string("bind/listen: ") + std::strerror(errno);
    return false;
  }
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { Run(); });
  return true;
}

void TcpProxy::Stop() {
  if (thread_.joinable()) {
    stop_.store(true);
    Wake();
    thread_.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

void TcpProxy::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

bool TcpProxy::SetMode(Mode mode) {
  std::unique_lock lock(mu_);
  mode_ = mode;
  const uint64_t generation = ++wanted_;
  lock.unlock();
  Wake();
  lock.lock();
  return applied_cv_.wait_for(lock, std::chrono::seconds(2),
                              [&] { return applied_ >= generation; });
}

void TcpProxy::Run() {
  std::list<Link> links;
  sockaddr_in upstream{};
  upstream.sin_family = AF_INET;
  upstream.sin_port = htons(upstream_port_);
  ::inet_pton(AF_INET, upstream_host_.c_str(), &upstream.sin_addr);

  while (!stop_.load()) {
    Mode mode;
    {
      std::lock_guard lock(mu_);
      mode = mode_;
      if (mode == Mode::kReset) {
        for (Link& l : links) {
          CloseWithReset(l.client);
          CloseWithReset(l.upstream);
          l.client = l.upstream = -1;
        }
        links.clear();
      }
      open_.store(links.size());
      applied_ = wanted_;
    }
    applied_cv_.notify_all();

    // What to wait for: the wake-up, new connections, and in kForward every link's bytes. A
    // blackholed link is left out of poll() entirely (a peer's hang-up would wake it for ever).
    std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    std::vector<Link*> polled;
    if (mode == Mode::kForward) {
      for (Link& l : links) {
        short c = 0, u = 0;
        if (l.to_upstream.empty()) c |= POLLIN;  // read no more than the other side can take
        if (!l.to_client.empty()) c |= POLLOUT;
        if (!l.connected) {
          u |= POLLOUT;
        } else {
          if (l.to_client.empty()) u |= POLLIN;
          if (!l.to_upstream.empty()) u |= POLLOUT;
        }
        fds.push_back({l.client, c, 0});
        fds.push_back({l.upstream, u, 0});
        polled.push_back(&l);
      }
    }
    if (::poll(fds.data(), fds.size(), kPollMs) < 0 && errno != EINTR) break;

    if (fds[0].revents & POLLIN) {
      uint64_t drained;
      (void)!::read(wake_fd_, &drained, sizeof(drained));
    }
    if (fds[1].revents & POLLIN) {
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (client >= 0) {
        accepted_.fetch_add(1);
        if (mode == Mode::kReset) {
          CloseWithReset(client);
        } else {
          Link& l = links.emplace_back();
          l.client = client;
          l.upstream = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
          const int one = 1;
          ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          ::setsockopt(l.upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          const int rc =
              ::connect(l.upstream, reinterpret_cast<sockaddr*>(&upstream), sizeof(upstream));
          if (rc == 0) {
            l.connected = true;
          } else if (errno != EINPROGRESS) {
            l.dead = true;
          }
        }
      }
    }

    // One read or write per ready descriptor per turn: every turn is bounded.
    char buf[kChunk];
    for (size_t i = 0; i < polled.size(); ++i) {
      Link& l = *polled[i];
      const short cre = fds[2 + 2 * i].revents;
      const short ure = fds[3 + 2 * i].revents;
      if (!l.connected && (ure & (POLLOUT | POLLERR | POLLHUP))) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(l.upstream, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          l.dead = true;
          continue;
        }
        l.connected = true;
        continue;
      }
      auto pump = [&](int from, short revents, std::string& into) {
        if (!(revents & (POLLIN | POLLHUP | POLLERR))) return;
        const ssize_t n = ::recv(from, buf, sizeof(buf), 0);
        if (n > 0) {
          into.append(buf, static_cast<size_t>(n));
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          l.dead = true;
        }
      };
      // Tried whenever bytes wait (not only on POLLOUT): what was read this turn goes out now.
      auto flush = [&](int to, std::string& from) {
        if (from.empty()) return;
        const ssize_t n = ::send(to, from.data(), from.size(), MSG_NOSIGNAL);
        if (n > 0) {
          from.erase(0, static_cast<size_t>(n));
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          l.dead = true;
        }
      };
      pump(l.client, cre, l.to_upstream);
      if (l.connected) pump(l.upstream, ure, l.to_client);
      if (l.connected) flush(l.upstream, l.to_upstream);
      flush(l.client, l.to_client);
    }
    // A link whose one side ended ends whole: HTTP/2 never half-closes a connection.
    links.remove_if([](const Link& l) { return l.dead; });
  }
  links.clear();
  open_.store(0);
}

}  // namespace granary::it
