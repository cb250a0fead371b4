// granary-bench diskhit: gets served from a node's disk tier, end to end (client -> master ->
// node DISK_READ -> disk -> client), in two phases run by bench/disk.sh around a master restart:
//   --phase put: for each size, puts `bytes` of objects (through shared memory when the node is
//                on this host) and waits until every one has a disk copy (the master must run
//                with --persistence eager): the offload's GB/s is the bytes over the time from
//                the first put until the newest object has its disk copy (eager offloads the
//                oldest commit first, so the newest is the last);
//   --phase get: checks the objects are on disk only (the restarted master lost memory, the node
//                registered its disk), then runs batched gets of random keys for `seconds`:
//                GB/s, objects/s, and per-batch latency p50/p99. Every byte is verified.
//                --transport shm (default) lets a same-host client load through the node's
//                shared-memory staging region; tcp forces DISK_READ over loopback.
// The first pass over the keys (fresh: nothing cached anywhere, O_DIRECT reads) is reported apart
// from the steady state.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/units.h"
#include "granary/client.h"
#include "tools/bench/bench.h"

namespace granary::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::string KeyOf(const std::string& prefix, uint64_t size, uint64_t i) {
  return prefix + "/" + std::to_string(size) + "/" + std::to_string(i);
}

// Bytes of object i: a function of (size, i), so a mix-up shows.
void Fill(std::vector<std::byte>& out, uint64_t size, uint64_t i) {
  uint64_t x = (size * 0x9E3779B97F4A7C15ull) ^ (i + 1);
  for (size_t at = 0; at < out.size(); at += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + at, &x, std::min<size_t>(8, out.size() - at));
  }
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int RunDiskHitBench(const DiskHitBenchOptions& o) {
  ClientOptions co;
  co.master_address = o.master;
  // Puts through shared memory, so that the offload, not the put, sets the pace; gets as
  // --transport says (tcp: DISK_READ as a remote client; shm: the node's staging region).
  co.use_shared_memory = o.phase == "put" || o.transport == "shm";
  auto connected = Client::Connect(co);
  if (!connected.ok()) {
    std::fprintf(stderr, "granary-bench: %s\n", connected.status().ToString().c_str());
    return 1;
  }
  Client& client = **connected;
  nlohmann::json json;
  json["phase"] = o.phase;
  json["label"] = o.label;
  json["results"] = nlohmann::json::array();
  int rc = 0;
  if (o.phase == "get") {
    std::printf("%-8s %7s %6s %10s %10s %10s %10s %10s %10s\n", "size", "objects", "batch",
                "first GB/s", "GB/s", "objects/s", "p50 ms", "p99 ms", "errors");
  }
  for (const std::string& size_text : o.sizes) {
    auto parsed = ParseSize(size_text);
    if (!parsed.ok() || *parsed == 0) {
      std::fprintf(stderr, "granary-bench: bad size %s\n", size_text.c_str());
      return 2;
    }
    const uint64_t size = *parsed;
    const uint64_t count = std::max<uint64_t>(o.batch, o.bytes / size);
    std::vector<std::string> keys;
    for (uint64_t i = 0; i < count; ++i) keys.push_back(KeyOf(o.prefix, size, i));

    if (o.phase == "put") {
      std::vector<std::vector<std::byte>> values(o.batch, std::vector<std::byte>(size));
      const auto t0 = Clock::now();
      uint64_t failed = 0;
      for (uint64_t first = 0; first < count; first += o.batch) {
        const uint64_t n = std::min<uint64_t>(o.batch, count - first);
        std::vector<std::string> batch(keys.begin() + first, keys.begin() + first + n);
        std::vector<ByteSpan> spans;
        for (uint64_t j = 0; j < n; ++j) {
          Fill(values[j], size, first + j);
          spans.emplace_back(values[j]);
        }
        for (const Status& s : client.BatchPut(batch, spans)) failed += !s.ok();
      }
      const auto put_end = Clock::now();
      // The newest object offloaded (bounded wait), then every object checked (not timed).
      const auto deadline = Clock::now() + std::chrono::seconds(o.wait_seconds);
      while (Clock::now() < deadline) {
        auto st = client.Stat(keys.back());
        if (!st.ok() || !st->disk_replicas.empty()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      const double offload_s = Seconds(Clock::now() - t0);
      const double offload_gbps = count * size / offload_s / 1e9;
      uint64_t on_disk = 0;
      for (size_t k = 0; k < keys.size() && Clock::now() < deadline;) {
        auto st = client.Stat(keys[k]);
        if (st.ok() && !st->disk_replicas.empty()) {
          ++on_disk;
          ++k;
        } else if (!st.ok()) {
          ++k;  // lost (evicted before its offload): counted as missing
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
      std::printf("put %s: %llu objects, puts %.2f s, all on disk after %.2f s: offload %.2f GB/s;"
                  " %llu failed, %llu on disk\n",
                  size_text.c_str(), static_cast<unsigned long long>(count),
                  Seconds(put_end - t0), offload_s, offload_gbps,
                  static_cast<unsigned long long>(failed), static_cast<unsigned long long>(on_disk));
      json["results"].push_back({{"size", size},
                                 {"objects", count},
                                 {"failed", failed},
                                 {"on_disk", on_disk},
                                 {"put_s", Seconds(put_end - t0)},
                                 {"offload_s", offload_s},
                                 {"offload_gbps", offload_gbps}});
      if (on_disk < count) rc = 1;
      continue;
    }

    // get: the objects must be readable from disk only (bounded wait for the node to register).
    const auto deadline = Clock::now() + std::chrono::seconds(o.wait_seconds);
    uint64_t disk_only = 0, in_memory = 0;
    for (size_t k = 0; k < keys.size() && Clock::now() < deadline;) {
      auto st = client.Stat(keys[k]);
      if (st.ok() && !st->disk_replicas.empty()) {
        (st->replicas.empty() ? disk_only : in_memory)++;
        ++k;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    if (in_memory > 0 || disk_only < count) {
      std::fprintf(stderr, "granary-bench: %s: %llu of %llu on disk only, %llu also in memory\n",
                   size_text.c_str(), static_cast<unsigned long long>(disk_only),
                   static_cast<unsigned long long>(count),
                   static_cast<unsigned long long>(in_memory));
      rc = 1;
    }
    std::vector<std::vector<std::byte>> bufs(o.batch, std::vector<std::byte>(size));
    std::vector<std::byte> want(size);
    std::vector<uint64_t> order(count);
    for (uint64_t i = 0; i < count; ++i) order[i] = i;
    std::mt19937_64 rng(size);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<double> batch_ms;
    uint64_t bytes = 0, objects = 0, errors = 0, first_bytes = 0;
    double first_seconds = 0;
    const auto t0 = Clock::now();
    const auto end = t0 + std::chrono::duration<double>(o.seconds);
    uint64_t next = 0;
    for (int rounds = 0; rounds < 10'000'000; ++rounds) {
      const bool first_pass = next < count;
      if (!first_pass && Clock::now() >= end) break;
      std::vector<std::string> batch;
      std::vector<uint64_t> ids;
      for (uint32_t j = 0; j < o.batch; ++j) {
        const uint64_t id = next < count ? order[next] : rng() % count;
        ++next;
        ids.push_back(id);
        batch.push_back(keys[id]);
      }
      std::vector<MutableByteSpan> dst;
      for (auto& b : bufs) dst.emplace_back(b);
      const auto b0 = Clock::now();
      auto got = client.BatchGetInto(batch, std::vector<MutableByteSpan>(dst.begin(),
                                                                         dst.begin() + batch.size()));
      const auto b1 = Clock::now();
      batch_ms.push_back(Seconds(b1 - b0) * 1e3);
      uint64_t batch_bytes = 0;
      for (size_t j = 0; j < batch.size(); ++j) {
        if (!got[j].ok() || *got[j] != size) {
          ++errors;
          continue;
        }
        Fill(want, size, ids[j]);
        if (std::memcmp(want.data(), bufs[j].data(), size) != 0) {
          ++errors;
          continue;
        }
        batch_bytes += size;
        ++objects;
      }
      bytes += batch_bytes;
      if (first_pass) {
        first_bytes += batch_bytes;
        first_seconds += Seconds(b1 - b0);
      }
    }
    const double wall = Seconds(Clock::now() - t0);
    std::sort(batch_ms.begin(), batch_ms.end());
    const double get_seconds = [&] {
      double s = 0;
      for (double ms : batch_ms) s += ms / 1e3;
      return s;
    }();
    const double gbps = get_seconds > 0 ? bytes / get_seconds / 1e9 : 0;
    const double first_gbps = first_seconds > 0 ? first_bytes / first_seconds / 1e9 : 0;
    std::printf("%-8s %7llu %6u %10.2f %10.2f %10.0f %10.2f %10.2f %10llu\n", size_text.c_str(),
                static_cast<unsigned long long>(count), o.batch, first_gbps, gbps,
                get_seconds > 0 ? objects / get_seconds : 0, Percentile(batch_ms, 50),
                Percentile(batch_ms, 99), static_cast<unsigned long long>(errors));
    json["results"].push_back({{"size", size},
                               {"objects", count},
                               {"batch", o.batch},
                               {"first_pass_gbps", first_gbps},
                               {"gbps", gbps},
                               {"objects_per_s", get_seconds > 0 ? objects / get_seconds : 0},
                               {"batch_p50_ms", Percentile(batch_ms, 50)},
                               {"batch_p99_ms", Percentile(batch_ms, 99)},
                               {"errors", errors},
                               {"wall_s", wall},
                               {"disk_bytes_read", client.Stats().disk_bytes_read},
                               {"disk_bytes_read_shm", client.Stats().disk_bytes_read_shm},
                               {"transport", o.transport}});
    if (errors > 0) rc = 1;
  }
  if (o.phase == "get") {
    const ClientStats st = client.Stats();
    std::printf("transport %s: %llu bytes loaded from disk, %llu of them through shared memory\n",
                o.transport.c_str(), static_cast<unsigned long long>(st.disk_bytes_read),
                static_cast<unsigned long long>(st.disk_bytes_read_shm));
  }
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << json.dump(2) << "\n";
  }
  return rc;
}

}  // namespace granary::bench
