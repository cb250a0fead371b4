// granary-bench transfer: object put and get through a running store, per path and size.
//
// Paths: "shm" (this host: the client memcpys through the node's shared memory) and "tcp" (the
// same client with shared memory off, so every byte crosses loopback TCP to the node process).
// Each put is the full protocol (put-start, copy, put-end with checksum); each get too
// (replica list, copy, checksum verify, finish-read), into a preallocated buffer. The machine's
// memcpy and loopback-TCP bandwidth are measured in the same run so figures read as fractions.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/units.h"
#include "granary/client.h"
#include "tools/bench/bench.h"
#include "tools/bench/timed_run.h"

namespace granary::bench {
namespace {

using Clock = std::chrono::steady_clock;


}  // namespace

int RunTransferBench(const TransferBenchOptions& o) {
  std::printf("== limits, measured now ==\n");
  const double memcpy_gbps = MemcpyGBps(4 << 20, 1.0);
  const double tcp1_gbps = LoopbackTcpGBps(1, 1.0);
  const double tcp4_gbps = LoopbackTcpGBps(4, 1.0);
  std::printf("memcpy (4 MiB blocks) %.2f GB/s; loopback TCP 1 stream %.2f GB/s, 4 streams %.2f GB/s\n",
              memcpy_gbps, tcp1_gbps, tcp4_gbps);

  nlohmann::json json;
  json["limits"] = {{"memcpy_4MiB_gbps", memcpy_gbps},
                    {"tcp_1_stream_gbps", tcp1_gbps},
                    {"tcp_4_streams_gbps", tcp4_gbps}};
  json["results"] = nlohmann::json::array();

  // Half the store, so puts measure copying, not eviction.
  uint64_t budget = 0;
  {
    ClientOptions co;
    co.master_address = o.master;
    auto probe = Client::Connect(co);
    if (!probe.ok()) {
      std::fprintf(stderr, "granary-bench: %s\n", probe.status().ToString().c_str());
      return 1;
    }
    auto segments = (*probe)->ListSegments();
    if (!segments.ok() || segments->empty()) {
      std::fprintf(stderr, "granary-bench: no segment mounted at %s\n", o.master.c_str());
      return 1;
    }
    for (const auto& s : *segments) budget += s.free_bytes;
    budget /= 2;
  }

  std::printf("\n%u object(s) per call; latency is per call\n", o.batch);
  std::printf("%-4s %-6s %-4s %8s %9s %8s %10s %10s %7s\n", "path", "size", "op", "objs/s",
              "GB/s", "of limit", "p50(us)", "p99(us)", "errors");
  const std::string run_tag = std::to_string(Clock::now().time_since_epoch().count() % 1000000007);
  int failures = 0;
  for (const auto& path : o.paths) {
    ClientOptions co;
    co.master_address = o.master;
    co.use_shared_memory = path == "shm";
    auto connected = Client::Connect(co);
    if (!connected.ok()) return 1;
    Client& client = **connected;
    for (const auto& size_text : o.sizes) {
      auto parsed = ParseSize(size_text);
      if (!parsed.ok() || *parsed == 0) {
        std::fprintf(stderr, "granary-bench: bad size %s\n", size_text.c_str());
        return 2;
      }
      const uint64_t size = *parsed;
      std::vector<std::byte> value(size);
      std::mt19937_64 rng(size);
      for (size_t i = 0; i + 8 <= size; i += 8) {
        uint64_t r = rng();
        std::memcpy(value.data() + i, &r, 8);
      }
      // TCP objects above the client's stripe threshold (4 MiB) go over 4 connections.
      const double limit = path == "shm" ? memcpy_gbps : size > (4u << 20) ? tcp4_gbps : tcp1_gbps;
      const std::string prefix = "bench-transfer/" + run_tag + "/" + path + "/" + size_text + "/";
      const uint32_t b = o.batch;
      const uint64_t max_calls = std::max<uint64_t>(budget / size / b, 1);
      auto key = [&](uint64_t n) { return prefix + std::to_string(n); };

      Measured put = RunTimed(o.threads, o.seconds, max_calls, [&](int, uint64_t i) {
        if (b == 1) return client.Put(key(i), value);
        std::vector<std::string> keys;
        for (uint32_t k = 0; k < b; ++k) keys.push_back(key(i * b + k));
        for (const Status& s : client.BatchPut(keys, std::vector<ByteSpan>(b, value))) {
          if (!s.ok()) return s;
        }
        return Status::Ok();
      });
      // Reads cycle over a working set written just now (at most 64 calls' worth, within budget).
      const uint64_t sets = std::max<uint64_t>(std::min<uint64_t>({put.calls, 64, max_calls}), 1);
      std::vector<std::vector<std::byte>> buffers(o.threads * b, std::vector<std::byte>(size));
      Measured get = RunTimed(o.threads, o.seconds, UINT64_MAX, [&](int t, uint64_t i) {
        uint64_t set = i % sets;
        if (b == 1) {
          auto got = client.GetInto(key(set), buffers[t]);
          return got.ok() ? Status::Ok() : got.status();
        }
        std::vector<std::string> keys;
        std::vector<MutableByteSpan> dst;
        for (uint32_t k = 0; k < b; ++k) {
          keys.push_back(key(set * b + k));
          dst.emplace_back(buffers[t * b + k]);
        }
        for (const auto& got : client.BatchGetInto(keys, dst)) {
          if (!got.ok()) return got.status();
        }
        return Status::Ok();
      });
      (void)client.RemoveByRegex("^" + prefix, true);

      for (auto [op, m] : {std::pair{"put", put}, {"get", get}}) {
        double gbps = static_cast<double>(m.calls * size * b) / m.seconds / 1e9;
        std::printf("%-4s %-6s %-4s %8.0f %9.2f %7.0f%% %10.0f %10.0f %7llu\n", path.c_str(),
                    size_text.c_str(), op, m.calls * b / m.seconds, gbps, 100 * gbps / limit, m.p50_us,
                    m.p99_us, static_cast<unsigned long long>(m.errors));
        if (m.errors) {
          std::printf("     first error: %s\n", m.first_error.c_str());
          failures++;
        }
        json["results"].push_back({{"path", path}, {"size", size}, {"op", op},
                                   {"threads", o.threads}, {"batch", b},
                                   {"objects_per_s", m.calls * b / m.seconds},
                                   {"gbps", gbps}, {"fraction_of_limit", gbps / limit},
                                   {"p50_us", m.p50_us}, {"p99_us", m.p99_us},
                                   {"errors", m.errors}});
      }
    }
  }
  if (!o.json_path.empty()) std::ofstream(o.json_path) << json.dump(2) << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace granary::bench
