#include "tools/cli/top.h"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <vector>

#include "common/http_client.h"
#include "etcd/endpoints.h"
#include "tools/cli/top_view.h"

namespace granary::top {

namespace {

// granary-master --http-port's default: for a master too old to report its port.
constexpr uint16_t kDefaultMasterHttpPort = 9003;
constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;
constexpr int kExitFailure = 3;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string WallClock() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%H:%M:%S UTC", &utc);
  return buf;
}

// "host:port" or "[v6]:port", one of them.
Result<etcd::HostPort> OneHostPort(const std::string& address) {
  auto parsed = etcd::ParseEndpoints(address);
  if (!parsed.ok()) return parsed.status();
  if (parsed->size() != 1) {
    return Status(ErrorCode::INVALID_PARAMS, "'" + address + "' is not one HOST:PORT");
  }
  return (*parsed)[0];
}

// Takes one sample per call; keeps the client between calls, and drops it after a failure so the
// next call connects again (to the new leader, with etcd://).
class Sampler {
 public:
  explicit Sampler(const TopOptions& options) : options_(options) {}

  Sample Take() {
    Sample s;
    s.at_s = NowSeconds();
    s.clock = WallClock();
    s.master = options_.client.master_address;
    if (!client_) {
      auto connected = Client::Connect(options_.client);
      if (!connected.ok()) {
        s.error = connected.status().ToString();
        return s;
      }
      client_ = std::move(*connected);
    }
    auto segments = client_->ListSegments();
    if (!segments.ok()) {
      s.error = segments.status().ToString();
      client_.reset();
      return s;
    }
    for (const auto& seg : *segments) {
      s.segments.push_back({seg.name, seg.size, seg.used_bytes, seg.replicas, seg.draining,
                            seg.drain_remaining_objects, seg.drain_remaining_bytes});
    }
    std::sort(s.segments.begin(), s.segments.end(),
              [](const SegmentRow& a, const SegmentRow& b) { return a.name < b.name; });
    std::string grpc_address = options_.client.master_address;
    uint16_t http_port = 0;  // as the answering master reports it (0: an older master)
    if (auto cluster = client_->Cluster(); cluster.ok()) {
      http_port = cluster->leader_http_port;
      if (cluster->ha) {
        s.role = "leader " + cluster->leader_id + ", term " + std::to_string(cluster->term);
        if (cluster->serving_alone) s.role += ", no sync standby";
        grpc_address = cluster->leader_address;
      } else {
        s.role = "no HA";
      }
    }
    ReadCounters(grpc_address, http_port, &s);
    return s;
  }

 private:
  void ReadCounters(const std::string& grpc_address, uint16_t http_port, Sample* s) const {
    etcd::HostPort http;
    if (!options_.http.empty()) {
      auto given = OneHostPort(options_.http);
      if (!given.ok()) {
        s->metrics_error = "--http: " + given.status().message();
        return;
      }
      http = *given;
    } else {
      auto master = OneHostPort(grpc_address);
      if (!master.ok() || grpc_address.rfind("etcd://", 0) == 0) {
        s->metrics_error = "no master HTTP address known: give --http HOST:PORT";
        return;
      }
      http = {master->host, http_port != 0 ? http_port : kDefaultMasterHttpPort};
    }
    const int timeout_ms = std::clamp(options_.client.rpc_timeout_ms, 100, 5'000);
    auto text = HttpGet(http.host, http.port, "/metrics", timeout_ms);
    if (!text.ok()) {
      s->metrics_error = text.status().message() + " (--http HOST:PORT)";
      return;
    }
    auto metrics = MetricsText::Parse(*text);
    if (!metrics.ok()) {
      s->metrics_error = metrics.status().message();
      return;
    }
    s->counters = CountersFrom(*metrics);
  }

  const TopOptions& options_;
  std::unique_ptr<Client> client_;
};

// The terminal in "live" mode: keys without Enter nor echo, the alternate screen, no cursor.
// Restores all of it when destroyed.
class LiveTerminal {
 public:
  LiveTerminal() {
    keys_ = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_) == 0;
    if (keys_) {
      termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);  // ISIG stays: Ctrl-C is SIGINT
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    std::fputs("\x1b[?1049h\x1b[?25l", stdout);  // alternate screen, hide the cursor
    std::fflush(stdout);
  }
  ~LiveTerminal() {
    std::fputs("\x1b[?25h\x1b[?1049l", stdout);
    std::fflush(stdout);
    if (keys_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  LiveTerminal(const LiveTerminal&) = delete;
  LiveTerminal& operator=(const LiveTerminal&) = delete;

  void Draw(const std::vector<std::string>& lines) {
    std::string out = "\x1b[H";  // home; each line clears its rest, then everything below
    for (const auto& l : lines) out += l + "\x1b[K\n";
    out += "\x1b[J";
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  }

  // Waits until `deadline` (NowSeconds()); true if the user asked to quit meanwhile.
  bool WaitForQuit(double deadline) {
    while (!g_stop.load()) {
      const double left = deadline - NowSeconds();
      if (left <= 0) return false;
      const int ms = static_cast<int>(std::min(left * 1000, 200.0)) + 1;
      if (!keys_) {
        poll(nullptr, 0, ms);
        continue;
      }
      pollfd in{STDIN_FILENO, POLLIN, 0};
      if (poll(&in, 1, ms) <= 0) continue;  // timeout, or a signal (checked above)
      char c = 0;
      while (read(STDIN_FILENO, &c, 1) == 1) {
        if (c == 'q' || c == 'Q') return true;
      }
    }
    return true;
  }

  static void Size(size_t* rows, size_t* cols) {
    winsize ws{};
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
      *rows = ws.ws_row;
      *cols = ws.ws_col;
    }
  }

 private:
  bool keys_ = false;
  termios saved_{};
};

// Batch mode's wait: true if a signal asked to stop.
bool SleepUntil(double deadline) {
  while (!g_stop.load()) {
    const double left = deadline - NowSeconds();
    if (left <= 0) return false;
    poll(nullptr, 0, static_cast<int>(std::min(left * 1000, 200.0)) + 1);
  }
  return true;
}

}  // namespace

int RunTop(const TopOptions& options) {
  if (!(options.interval_s > 0)) {
    std::fprintf(stderr, "granary top: -d must be more than 0 seconds\n");
    return kExitUsage;
  }
  if (!options.http.empty()) {
    if (auto http = OneHostPort(options.http); !http.ok()) {
      std::fprintf(stderr, "granary top: --http: %s\n", http.status().message().c_str());
      return kExitUsage;
    }
  }
  struct sigaction action {};
  action.sa_handler = OnSignal;  // no SA_RESTART: a wait returns at once
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  const bool live = !options.batch && isatty(STDOUT_FILENO);
  std::unique_ptr<LiveTerminal> terminal;
  if (live) terminal = std::make_unique<LiveTerminal>();
  Sampler sampler(options);
  std::vector<std::string> last_frame;
  std::unique_ptr<Sample> before;  // the last sample that succeeded
  bool failed = false;
  bool quit = false;
  double next = NowSeconds();
  for (uint64_t frame = 0; options.iterations == 0 || frame < options.iterations; ++frame) {
    if (frame > 0) {
      next += options.interval_s;
      // A sample slower than the interval: the next one starts right away, not in a burst.
      next = std::max(next, NowSeconds());
      quit = live ? terminal->WaitForQuit(next) : SleepUntil(next);
      if (quit) break;
    }
    Sample now = sampler.Take();
    failed |= !now.error.empty();
    ViewOptions view;
    view.interval_s = options.interval_s;
    if (live) {
      size_t rows = 24, cols = 80;
      LiveTerminal::Size(&rows, &cols);
      view.width = std::min<size_t>(cols, 80);
      view.max_rows = rows > 12 ? rows - 10 : 2;  // the lines above the table, and one spare
    }
    last_frame = RenderFrame(before.get(), now, view);
    if (live) {
      terminal->Draw(last_frame);
    } else {
      if (frame > 0) std::fputs("\n", stdout);
      for (const auto& l : last_frame) std::printf("%s\n", l.c_str());
      std::fflush(stdout);
      if (!now.error.empty()) std::fprintf(stderr, "granary top: %s\n", now.error.c_str());
    }
    if (now.error.empty()) before = std::make_unique<Sample>(std::move(now));
  }
  if (live) {
    terminal.reset();  // back to the normal screen: leave the last frame there to read
    for (const auto& l : last_frame) std::printf("%s\n", l.c_str());
  }
  if (quit) return kExitOk;
  return failed ? kExitFailure : kExitOk;
}

}  // namespace granary::top
