// granary-bench kv: object put and get, Granary next to Redis and memcached, in one run.
//
// For each value size and client count, every target in turn: `clients` threads, each with its
// own connection (its own granary::Client, hiredis context or memcached socket), put new keys for
// --seconds (or until --budget bytes are written), then get the keys just written, into a
// preallocated buffer, for --seconds. One object per call; latency is per call (p50/p99/p999).
// Throughput is printed as a fraction of the matching machine limit (memcpy for granary-shm,
// loopback TCP with as many streams as clients for the others) and each Granary figure as a ratio
// to Redis and memcached measured in the same run. granary-shm waits for its clients' background
// warm-up of the segment mappings before its cases (and reports it); granary-shm-cold turns the
// warm-up off, so its puts pay every first touch (its limit: `limits`' "shm first write").
// Where 4 MiB gets ran, a closing block sets each TCP target's get against one 4 MiB answer over
// loopback (`limits`' tcp_answer_4MiB): one object per call at best, which a stream overstates.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/units.h"
#include "tools/bench/bench.h"
#include "tools/bench/timed_run.h"
#include "tools/bench/kv_target.h"

namespace granary::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The machine's ceilings: from suite 1's JSON when given, else measured now (1 s each).
class Limits {
 public:
  explicit Limits(const std::string& json_path) {
    if (json_path.empty()) return;
    std::ifstream in(json_path);
    auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      std::fprintf(stderr, "granary-bench: cannot read limits from %s; measuring\n", json_path.c_str());
      return;
    }
    for (auto& [name, value] : j.items()) {
      if (value.is_number()) known_[name] = value.get<double>();
    }
  }
  // 4 MiB-block memcpy on as many threads as `clients` can use at once (min(clients, cores)).
  double Memcpy(int clients = 1) {
    const int threads = MemcpyThreadsFor(clients);
    return Get(MemcpyLimitName(threads), [threads] { return MemcpyGBps(4 << 20, 1.0, threads); });
  }
  // A first write pass through a new mapping of written shared memory: the cold client's ceiling.
  double FirstWrite() {
    return Get("shm_first_write", [] { return FirstAccessLimits(512 << 20).first_write_gbps; });
  }
  double Tcp(int streams) {
    return Get("tcp_" + std::to_string(streams) + "_streams",
               [streams] { return LoopbackTcpGBps(streams, 1.0); });
  }
  // One 4 MiB answer to a small request (LoopbackAnswer): one object per call's ceiling over TCP.
  double TcpAnswer4MiB() {
    return Get("tcp_answer_4MiB", [] {
      const RoundTrip r = LoopbackAnswer(4 << 20, 1.0);
      return r.p50_us > 0 ? (4 << 20) / r.p50_us / 1e3 : -1;
    });
  }
  const std::map<std::string, double>& used() const { return used_; }

 private:
  template <typename Measure>
  double Get(const std::string& name, Measure measure) {
    auto it = known_.find(name);
    double v = it != known_.end() ? it->second : measure();
    known_[name] = used_[name] = v;
    return v;
  }
  std::map<std::string, double> known_, used_;
};

Result<std::unique_ptr<KvTarget>> Connect(const KvBenchOptions& o, const std::string& target) {
  const int64_t cache = o.location_cache_ms;
  if (target == "granary-shm") return ConnectGranary(o.master, true, true, cache);
  if (target == "granary-shm-cold") return ConnectGranary(o.master, true, /*warm=*/false, cache);
  if (target == "granary-tcp") return ConnectGranary(o.master, false, true, cache);
  if (target == "redis") return ConnectRedis(o.redis);
  return ConnectMemcached(o.memcached);
}

bool Configured(const KvBenchOptions& o, const std::string& target) {
  if (target.rfind("granary", 0) == 0) return !o.master.empty();
  if (target == "redis") return !o.redis.empty();
  return !o.memcached.empty();
}

std::vector<std::byte> RandomValue(uint64_t size) {
  std::vector<std::byte> value(size);
  std::mt19937_64 rng(size);
  for (size_t i = 0; i + 8 <= size; i += 8) {
    uint64_t r = rng();
    std::memcpy(value.data() + i, &r, 8);
  }
  return value;
}

}  // namespace

int RunKvBench(const KvBenchOptions& o) {
  Limits limits(o.limits_json);
  std::vector<std::string> targets;
  for (const auto& t : o.targets) {
    if (Configured(o, t)) targets.push_back(t);
    else std::printf("skipping %s: no address given\n", t.c_str());
  }
  const double memcpy_gbps = limits.Memcpy();
  std::printf("limits: memcpy (4 MiB blocks) %.2f GB/s", memcpy_gbps);
  for (int c : o.clients) std::printf("; loopback TCP %d stream(s) %.2f GB/s", c, limits.Tcp(c));
  std::printf("\nclients are threads of this process, each with its own connection; one object per "
              "call; at most %s written per case\n\n", FormatSize(o.budget).c_str());
  std::printf("%-16s %-6s %-3s %3s %9s %7s %8s %9s %9s %9s %6s\n", "target", "size", "op", "cl",
              "objs/s", "GB/s", "of limit", "p50(us)", "p99(us)", "p999(us)", "errors");

  nlohmann::json json;
  json["clients_are"] = "threads of one process, each with its own connection";
  json["budget_bytes"] = o.budget;
  json["seconds_per_case"] = o.seconds;
  json["results"] = nlohmann::json::array();
  const std::string run_tag = std::to_string(Clock::now().time_since_epoch().count() % 1000000007);
  int failures = 0;
  for (const auto& size_text : o.sizes) {
    auto parsed = ParseSize(size_text);
    if (!parsed.ok() || *parsed == 0) {
      std::fprintf(stderr, "granary-bench: bad size %s\n", size_text.c_str());
      return 2;
    }
    const uint64_t size = *parsed;
    const std::vector<std::byte> value = RandomValue(size);
    for (int clients : o.clients) {
      for (const auto& target : targets) {
        std::vector<std::unique_ptr<KvTarget>> conns;
        for (int c = 0; c < clients; ++c) {
          auto conn = Connect(o, target);
          if (!conn.ok()) {
            std::fprintf(stderr, "granary-bench: %s: %s\n", target.c_str(),
                         conn.status().ToString().c_str());
            return 1;
          }
          conns.push_back(std::move(*conn));
        }
        // Connect returned at once; the warm-up of the clients' mappings runs behind it. The
        // cases start once it is done (granary-shm-cold: none, every first touch is paid).
        const auto connected = Clock::now();
        KvTarget::Warmup warm;
        for (auto& conn : conns) {
          KvTarget::Warmup w = conn->WaitWarm(120);
          warm.bytes += w.bytes;
          warm.seconds += w.seconds;
          warm.done &= w.done;
        }
        const double warm_wall = std::chrono::duration<double>(Clock::now() - connected).count();
        if (warm.bytes > 0) {
          std::printf("    (%s x%d: warm-up of the mappings %s in %.3f s of populating, %.3f s/GiB;"
                      " ready %.3f s after Connect returned%s)\n",
                      target.c_str(), clients, FormatSize(warm.bytes).c_str(), warm.seconds,
                      warm.seconds * double(1 << 30) / warm.bytes, warm_wall,
                      warm.done ? "" : "; NOT finished");
        }
        const std::string prefix = "bench-kv/" + run_tag + "/" + target + "/" +
                                   std::to_string(size) + "/" + std::to_string(clients) + "/";
        const uint64_t max_puts = std::max<uint64_t>(o.budget / size, 1);
        Measured put = RunTimed(clients, o.seconds, max_puts, [&](int t, uint64_t i) {
          return conns[t]->Put(prefix + std::to_string(i), value);
        });
        // Gets cycle over the keys just written: at least 256 MiB of them, so the caches do not
        // hold the working set, when that many were written.
        const uint64_t sets = std::max<uint64_t>(
            std::min<uint64_t>(put.calls, std::max<uint64_t>(64, (256ull << 20) / size)), 1);
        std::vector<std::vector<std::byte>> buffers(clients, std::vector<std::byte>(size));
        Measured get = RunTimed(clients, o.seconds, UINT64_MAX, [&](int t, uint64_t i) {
          auto got = conns[t]->GetInto(prefix + std::to_string(i % sets), buffers[t]);
          if (!got.ok()) return got.status();
          return *got == size ? Status::Ok() : Status(ErrorCode::INVALID_READ, "short value");
        });
        if (Status s = conns[0]->Clear(prefix, put.issued); !s.ok()) {
          std::fprintf(stderr, "granary-bench: %s: clear: %s\n", target.c_str(), s.ToString().c_str());
        }
        const bool shm = target == "granary-shm";
        const bool cold = target == "granary-shm-cold";
        // Same-host clients copy in parallel: their ceiling is memcpy on as many cores; cold
        // clients' is the first write through a new mapping.
        const double limit = cold ? limits.FirstWrite() : shm ? limits.Memcpy(clients) : limits.Tcp(clients);
        const std::string limit_name = cold  ? "shm_first_write"
                                       : shm ? MemcpyLimitName(MemcpyThreadsFor(clients))
                                             : "tcp_" + std::to_string(clients) + "_streams";
        for (auto [op, m] : {std::pair{"put", put}, {"get", get}}) {
          const double ops = m.calls / m.seconds;
          const double gbps = ops * size / 1e9;
          std::printf("%-16s %-6s %-3s %3d %9.0f %7.2f %7.0f%% %9.0f %9.0f %9.0f %6llu\n", target.c_str(),
                      size_text.c_str(), op, clients, ops, gbps, 100 * gbps / limit, m.p50_us,
                      m.p99_us, m.p999_us, static_cast<unsigned long long>(m.errors));
          if (m.errors) {
            std::printf("    first error: %s\n", m.first_error.c_str());
            failures++;
          }
          json["results"].push_back({{"target", target}, {"size", size}, {"size_text", size_text},
                                     {"op", op}, {"clients", clients}, {"objects_per_s", ops},
                                     {"gbps", gbps}, {"limit", limit_name},
                                     {"fraction_of_limit", gbps / limit}, {"samples", m.calls},
                                     {"p50_us", m.p50_us}, {"p99_us", m.p99_us},
                                     {"p999_us", m.p999_us}, {"errors", m.errors},
                                     {"warm_bytes", warm.bytes}, {"warm_seconds", warm.seconds},
                                     {"ready_after_connect_s", warm_wall}});
        }
      }
    }
  }

  // Granary against Redis and memcached, same size, op and clients, same run.
  std::printf("\nGranary throughput as a multiple of Redis and memcached (same size, op, clients)\n");
  std::printf("%-16s %-6s %-3s %3s %9s %11s\n", "target", "size", "op", "cl", "x redis", "x memcached");
  auto find = [&](const std::string& target, const nlohmann::json& like) -> double {
    for (const auto& r : json["results"]) {
      if (r["target"] == target && r["size"] == like["size"] && r["op"] == like["op"] &&
          r["clients"] == like["clients"]) {
        return r["gbps"].get<double>();
      }
    }
    return 0;
  };
  json["ratios"] = nlohmann::json::array();
  for (const auto& r : json["results"]) {
    if (r["target"].get<std::string>().rfind("granary", 0) != 0) continue;
    const double g = r["gbps"].get<double>(), redis = find("redis", r), mc = find("memcached", r);
    nlohmann::json row = {{"target", r["target"]}, {"size", r["size"]}, {"op", r["op"]},
                          {"clients", r["clients"]}};
    row["vs_redis"] = redis > 0 ? nlohmann::json(g / redis) : nlohmann::json();
    row["vs_memcached"] = mc > 0 ? nlohmann::json(g / mc) : nlohmann::json();
    std::printf("%-16s %-6s %-3s %3d %9.2f %11.2f\n", r["target"].get<std::string>().c_str(),
                r["size_text"].get<std::string>().c_str(), r["op"].get<std::string>().c_str(),
                r["clients"].get<int>(), redis > 0 ? g / redis : 0.0, mc > 0 ? g / mc : 0.0);
    json["ratios"].push_back(row);
  }
  // One client's 4 MiB gets over TCP against one 4 MiB answer to a request on a bare socket: what
  // one object per call can take at best here (a stream, the table's limit, has no request).
  bool answer_header = false;
  for (const auto& r : json["results"]) {
    if (r["size"] != (4 << 20) || r["clients"] != 1 || r["op"] != "get" ||
        r["target"] == "granary-shm" || r["target"] == "granary-shm-cold") {
      continue;
    }
    const double answer = limits.TcpAnswer4MiB();
    if (!answer_header) {
      std::printf("\n4 MiB gets, 1 client, against one 4 MiB answer on a bare loopback socket (%.2f GB/s)\n",
                  answer);
      answer_header = true;
    }
    std::printf("%-16s %5.2fx\n", r["target"].get<std::string>().c_str(),
                answer > 0 ? r["gbps"].get<double>() / answer : 0.0);
  }
  json["limits"] = limits.used();
  if (!o.json_path.empty()) std::ofstream(o.json_path) << json.dump(2) << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace granary::bench
