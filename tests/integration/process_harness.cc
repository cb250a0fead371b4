#include "process_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace granary::it {

namespace {

using Clock = std::chrono::steady_clock;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// Closes a descriptor on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

}  // namespace

std::string BinaryPath(const std::string& name) {
#ifdef GRANARY_BIN_DIR
  return std::string(GRANARY_BIN_DIR) + "/" + name;
#else
  return name;
#endif
}

namespace {

// Binds 127.0.0.1:port (0: the kernel's pick) without SO_REUSEADDR; the bound port, or 0.
uint16_t BindLoopback(uint16_t port) {
  Fd sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (sock.fd < 0) {
    std::perror("PickFreePort: socket");
    std::abort();
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::bind(sock.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return 0;
  socklen_t len = sizeof(addr);
  if (::getsockname(sock.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  return ntohs(addr.sin_port);
}

// The lowest port of the kernel's ephemeral range (32768 when it cannot be read).
int EphemeralLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (in >> low >> high && low > 0) return low;
  return 32768;
}

}  // namespace

uint16_t PickFreePort() {
  // Below 10000 live well-known services; a range under 2000 ports is too crowded to pick from.
  constexpr int kFloor = 10000;
  static std::mutex mu;
  static std::set<uint16_t> handed_out;
  static std::mt19937 rng(static_cast<uint32_t>(::getpid()) ^
                          static_cast<uint32_t>(Clock::now().time_since_epoch().count()));
  static const int ceiling = EphemeralLow();
  std::lock_guard<std::mutex> lock(mu);
  if (ceiling - kFloor >= 2000) {
    std::uniform_int_distribution<int> pick(kFloor, ceiling - 1);
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const auto port = static_cast<uint16_t>(pick(rng));
      if (handed_out.count(port) != 0) continue;
      if (BindLoopback(port) == port) {
        handed_out.insert(port);
        return port;
      }
    }
  }
  for (int attempt = 0; attempt < 100; ++attempt) {
    const uint16_t port = BindLoopback(0);
    if (port == 0) {
      std::perror("PickFreePort: bind");
      std::abort();
    }
    if (handed_out.insert(port).second) return port;
  }
  std::fprintf(stderr, "PickFreePort: no port left\n");
  std::abort();
}

bool WaitUntil(const std::function<bool()>& predicate, Millis timeout, Millis interval) {
  const auto deadline = Clock::now() + timeout;
  // The loop is bounded by the deadline; the extra evaluation at the end makes a predicate that
  // became true during the last sleep count.
  while (Clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(interval);
  }
  return predicate();
}

// ---- TempDir ----

TempDir::TempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/" + prefix + "-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    std::perror("TempDir: mkdtemp");
    std::abort();
  }
  path_ = buf.data();
}

TempDir::~TempDir() {
  if (std::getenv("GRANARY_IT_KEEP_TMP") != nullptr) {
    std::fprintf(stderr, "[harness] kept %s\n", path_.c_str());
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::WriteFile(const std::string& name, const std::string& contents) const {
  std::string path = File(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  return path;
}

// ---- ExitStatus ----

std::string ExitStatus::ToString() const {
  if (exited) return "exited with code " + std::to_string(code);
  return "killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
}

// ---- ChildProcess ----

ChildProcess::~ChildProcess() { KillAndReap(); }

bool ChildProcess::Start(const std::string& binary, const std::vector<std::string>& args,
                         const std::string& log_path, std::string* error,
                         const std::string& stdin_path) {
  if (Running()) {
    *error = "already running (pid " + std::to_string(pid_) + ")";
    return false;
  }
  pid_ = -1;
  status_.reset();
  log_path_ = log_path;

  // Everything the child needs is prepared before fork: between fork and exec in a
  // multi-threaded parent only async-signal-safe calls are allowed.
  std::vector<std::string> argv_storage;
  argv_storage.push_back(binary);
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  Fd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644));
  if (log.fd < 0) {
    *error = Errno("open " + log_path);
    return false;
  }
  Fd in(::open(stdin_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.fd < 0) {
    *error = Errno("open " + stdin_path);
    return false;
  }
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    *error = Errno("pipe2");
    return false;
  }
  Fd report_read(report[0]);
  Fd report_write(report[1]);
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    *error = Errno("fork");
    return false;
  }
  if (pid == 0) {
    // Child. Die with the test process, even if it crashes.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
    }
    if (::dup2(in.fd, STDIN_FILENO) < 0 || ::dup2(log.fd, STDOUT_FILENO) < 0 ||
        ::dup2(log.fd, STDERR_FILENO) < 0) {
      int err = errno;
      (void)!::write(report_write.fd, &err, sizeof(err));
      ::_exit(127);
    }
    ::execv(argv[0], argv.data());
    int err = errno;
    (void)!::write(report_write.fd, &err, sizeof(err));
    ::_exit(127);
  }

  // Parent: the pipe closes on exec (CLOEXEC), so a read of 0 bytes means exec succeeded.
  ::close(report_write.fd);
  report_write.fd = -1;
  pid_ = pid;
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(report_read.fd, &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    *error = "exec " + binary + ": " + std::strerror(child_errno);
    Wait(Millis(2000));
    return false;
  }
  return true;
}

bool ChildProcess::Reap(bool block_briefly) {
  if (pid_ <= 0 || status_) return status_.has_value();
  int wstatus = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &wstatus, block_briefly ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    ExitStatus s;
    if (WIFEXITED(wstatus)) {
      s.exited = true;
      s.code = WEXITSTATUS(wstatus);
    } else if (WIFSIGNALED(wstatus)) {
      s.signal = WTERMSIG(wstatus);
    }
    status_ = s;
    return true;
  }
  if (r < 0) {  // not our child any more (should not happen): treat as gone
    status_ = ExitStatus{};
    return true;
  }
  return false;
}

bool ChildProcess::Running() {
  if (pid_ <= 0) return false;
  return !Reap(false);
}

bool ChildProcess::Kill(int sig) {
  if (!Running()) return false;
  return ::kill(pid_, sig) == 0;
}

bool ChildProcess::WaitStopped(Millis timeout) {
  auto all_stopped = [this] {
    const std::string tasks = "/proc/" + std::to_string(pid_) + "/task";
    std::error_code ec;
    size_t threads = 0;
    for (const auto& entry : std::filesystem::directory_iterator(tasks, ec)) {
      std::string stat = ReadFile(entry.path().string() + "/stat");
      size_t paren = stat.rfind(')');  // the name may hold spaces and parentheses
      if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
      char state = stat[paren + 2];
      if (state != 'T' && state != 't') return false;
      ++threads;
    }
    return !ec && threads > 0;
  };
  return pid_ > 0 && WaitUntil(all_stopped, timeout, Millis(1));
}

std::optional<ExitStatus> ChildProcess::Wait(Millis timeout) {
  if (pid_ <= 0) return std::nullopt;
  WaitUntil([this] { return Reap(false); }, timeout, Millis(5));
  return status_;
}

void ChildProcess::KillAndReap() {
  if (!Running()) return;
  ::kill(pid_, SIGKILL);
  // SIGKILL cannot be caught; the process is gone once the kernel has torn it down.
  if (!Wait(Millis(10'000))) {
    std::fprintf(stderr, "[harness] pid %d did not die after SIGKILL within 10 s\n", pid_);
  }
}

std::string ChildProcess::LogContents(size_t max_bytes) const {
  std::string all = ReadFile(log_path_);
  if (all.size() <= max_bytes) return all;
  return "[... " + std::to_string(all.size() - max_bytes) + " bytes cut ...]\n" +
         all.substr(all.size() - max_bytes);
}

std::optional<ExitStatus> RunCommand(const std::string& binary, const std::vector<std::string>& args,
                                     const std::string& log_path, Millis timeout,
                                     std::string* error, const std::string& stdin_path) {
  ChildProcess child;
  if (!child.Start(binary, args, log_path, error, stdin_path)) return std::nullopt;
  auto status = child.Wait(timeout);
  if (!status) {
    *error = binary + " did not finish within " + std::to_string(timeout.count()) + " ms";
    child.KillAndReap();
  }
  return status;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// ---- HTTP ----

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Decodes a chunked body; false if malformed.
bool Dechunk(const std::string& in, std::string* out) {
  size_t pos = 0;
  out->clear();
  while (pos < in.size()) {
    size_t eol = in.find("\r\n", pos);
    if (eol == std::string::npos) return false;
    size_t len = std::strtoul(in.substr(pos, eol - pos).c_str(), nullptr, 16);
    pos = eol + 2;
    if (len == 0) return true;
    if (pos + len > in.size()) return false;
    out->append(in, pos, len);
    pos += len + 2;
  }
  return false;
}

}  // namespace

HttpResult HttpGet(uint16_t port, const std::string& path, Millis timeout) {
  HttpResult result;
  const auto deadline = Clock::now() + timeout;
  auto remaining_ms = [&] {
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    return static_cast<int>(std::max<int64_t>(left, 0));
  };

  Fd sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (sock.fd < 0) {
    result.error = Errno("socket");
    return result;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(sock.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) {
      result.error = Errno("connect");
      return result;
    }
    pollfd p{sock.fd, POLLOUT, 0};
    if (::poll(&p, 1, remaining_ms()) <= 0) {
      result.error = "connect timed out";
      return result;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(sock.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      result.error = std::string("connect: ") + std::strerror(err);
      return result;
    }
  }

  const std::string request =
      "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = ::send(sock.fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{sock.fd, POLLOUT, 0};
      if (::poll(&p, 1, remaining_ms()) <= 0) {
        result.error = "send timed out";
        return result;
      }
      continue;
    }
    result.error = Errno("send");
    return result;
  }

  std::string raw;
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = ::recv(sock.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      raw.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) break;  // the server closed: the whole reply is in
    if (errno == EAGAIN || errno == EINTR) {
      if (remaining_ms() == 0) {
        result.error = "reply timed out after " + std::to_string(raw.size()) + " bytes";
        return result;
      }
      pollfd p{sock.fd, POLLIN, 0};
      ::poll(&p, 1, remaining_ms());
      continue;
    }
    result.error = Errno("recv");
    return result;
  }

  size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos || raw.compare(0, 5, "HTTP/") != 0) {
    result.error = "malformed reply: " + raw.substr(0, 200);
    return result;
  }
  std::string head = raw.substr(0, head_end);
  std::string body = raw.substr(head_end + 4);
  size_t sp = head.find(' ');
  if (sp == std::string::npos) {
    result.error = "malformed status line";
    return result;
  }
  int status = std::atoi(head.c_str() + sp + 1);
  bool chunked = false;
  std::istringstream lines(head);
  std::string line;
  std::getline(lines, line);  // status line
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = Lower(line.substr(0, colon));
    std::string value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    if (name == "content-type") result.content_type = value;
    if (name == "transfer-encoding" && Lower(value).find("chunked") != std::string::npos) {
      chunked = true;
    }
  }
  if (chunked) {
    std::string decoded;
    if (!Dechunk(body, &decoded)) {
      result.error = "malformed chunked body";
      return result;
    }
    body = std::move(decoded);
  }
  result.status = status;
  result.body = std::move(body);
  return result;
}

}  // namespace granary::it
