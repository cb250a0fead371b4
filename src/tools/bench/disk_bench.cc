// granary-bench disk: the disk tier (src/disk) in this process, no node or master. For each
// backend x I/O engine x object size, in a fresh directory: write `bytes` in batches of `batch`
// objects (GB/s of values acknowledged), then read random batches of `batch` stored objects for
// `seconds` (GB/s of values read and checksum-verified). O_DIRECT throughout (where the
// filesystem takes it), so reads come from the device, not the page cache.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/units.h"
#include "disk/disk_store.h"
#include "tools/bench/bench.h"

namespace granary::bench {

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

struct DiskCase {
  double write_gbps = -1, read_gbps = -1;
  uint64_t objects = 0, read_errors = 0;
  std::string error;
};

DiskCase RunCase(const DiskBenchOptions& o, uint64_t bytes, disk::DiskBackend backend, disk::IoMode io,
                 uint64_t size) {
  DiskCase out;
  std::string templ = o.dir + "/granary-bench-disk.XXXXXX";
  if (!mkdtemp(templ.data())) {
    out.error = "cannot create a directory in " + o.dir;
    return out;
  }
  const std::string dir = templ;
  const uint64_t count = std::max<uint64_t>(o.batch, bytes / size);
  {
    disk::DiskStoreOptions so;
    so.dir = dir;
    so.backend = backend;
    so.io = io;
    so.disk_size = count * (disk::AlignUp(size) + 8192) + (64ull << 20);
    if (auto policy = disk::ParseEvictionPolicy(o.eviction); policy.ok()) so.eviction = *policy;
    auto store = disk::DiskStore::Open(so);
    if (!store.ok()) {
      out.error = store.status().ToString();
      std::filesystem::remove_all(dir);
      return out;
    }
    // One value per batch slot (distinct bytes; written again under new keys each batch).
    std::vector<std::vector<std::byte>> values(o.batch, std::vector<std::byte>(size));
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (auto& v : values) {
      for (size_t i = 0; i + 8 <= v.size(); i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::memcpy(v.data() + i, &x, 8);
      }
    }
    std::vector<std::string> keys(count);
    for (uint64_t i = 0; i < count; ++i) keys[i] = "bench/" + std::to_string(i);
    auto start = Clock::now();
    uint64_t written = 0;
    for (uint64_t first = 0; first < count; first += o.batch) {
      std::vector<disk::ObjectWrite> batch;
      for (uint64_t i = first; i < std::min<uint64_t>(count, first + o.batch); ++i) {
        batch.push_back(disk::ObjectWrite{keys[i], 1, values[i - first], {}});
      }
      for (auto& r : (*store)->Write(batch)) {
        if (!r.ok()) {
          out.error = r.status().ToString();
          break;
        }
        written += size;
      }
      if (!out.error.empty()) break;
    }
    out.write_gbps = written / SecondsSince(start) / 1e9;
    out.objects = written / size;

    std::vector<disk::AlignedBuffer> buffers;
    for (uint32_t i = 0; i < o.batch; ++i) buffers.emplace_back(disk::DiskStore::ReadBufferSize(size));
    uint64_t read = 0, rng = 2463534242ull;
    start = Clock::now();
    while (out.objects > 0 && SecondsSince(start) < o.seconds) {
      std::vector<disk::ReadRequest> reads;
      for (uint32_t i = 0; i < o.batch; ++i) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        reads.push_back(disk::ReadRequest{keys[rng % out.objects], 0, buffers[i].span()});
      }
      for (const auto& r : (*store)->Read(reads)) {
        if (r.status.ok()) read += r.size;
        else ++out.read_errors;
      }
    }
    if (out.objects > 0) out.read_gbps = read / SecondsSince(start) / 1e9;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return out;
}

}  // namespace

int RunDiskBench(const DiskBenchOptions& o) {
  nlohmann::json json = nlohmann::json::array();
  std::printf("%-8s %-9s %9s %8s %12s %12s\n", "backend", "io", "size", "objects", "write GB/s",
              "read GB/s");
  int failures = 0;
  auto bytes = ParseSize(o.bytes);
  if (!bytes.ok()) {
    std::fprintf(stderr, "%s\n", bytes.status().ToString().c_str());
    return 2;
  }
  for (const auto& backend_name : o.backends) {
    auto backend = disk::ParseBackend(backend_name);
    if (!backend.ok()) return 2;
    for (const auto& io_name : o.io) {
      auto io = disk::ParseIoMode(io_name);
      if (!io.ok()) return 2;
      for (const auto& size_text : o.sizes) {
        auto size = ParseSize(size_text);
        if (!size.ok() || *size == 0) {
          std::fprintf(stderr, "bad size '%s'\n", size_text.c_str());
          return 2;
        }
        DiskCase c = RunCase(o, *bytes, *backend, *io, *size);
        std::printf("%-8s %-9s %9s %8llu %12.2f %12.2f\n", backend_name.c_str(), io_name.c_str(),
                    FormatSize(*size).c_str(), static_cast<unsigned long long>(c.objects), c.write_gbps,
                    c.read_gbps);
        if (!c.error.empty()) std::printf("  error: %s\n", c.error.c_str());
        if (c.read_errors) std::printf("  read errors: %llu\n", static_cast<unsigned long long>(c.read_errors));
        failures += !c.error.empty() || c.read_errors > 0;
        json.push_back({{"backend", backend_name}, {"io", io_name}, {"size", *size}, {"batch", o.batch}, {"eviction", o.eviction},
                        {"objects", c.objects}, {"write_gbps", c.write_gbps}, {"read_gbps", c.read_gbps},
                        {"read_errors", c.read_errors}, {"error", c.error}});
      }
    }
  }
  if (!o.json_path.empty()) std::ofstream(o.json_path) << json.dump(2) << "\n";
  return failures ? 1 : 0;
}

}  // namespace granary::bench
