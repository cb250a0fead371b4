// granary-bench diskrecover: the time a node's disk store (src/disk) takes to open again with
// `objects` objects on it, per backend, in this process (no node or master):
//   crash: a child process writes the objects and exits without closing the store (as kill -9
//          would leave it: no shutdown index, buckets as the last write left them);
//   clean: the same store opened once more after the crash open closed it cleanly.
// Each open must list every object, else the case is an error. With --keep DIR the last backend's
// store is left in DIR (disk.sh then starts a node on it to time the registration with a master).
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

disk::DiskStoreOptions StoreOptions(const std::string& dir, disk::DiskBackend backend,
                                    uint64_t objects, uint64_t size) {
  disk::DiskStoreOptions so;
  so.dir = dir;
  so.backend = backend;
  so.disk_size = objects * (disk::AlignUp(size) + 8192) + (64ull << 20);
  return so;
}

// In a child process: writes the objects and leaves without closing anything (_exit).
int WriteAndCrash(const disk::DiskStoreOptions& so, uint64_t objects, uint64_t size,
                  uint32_t batch) {
  auto store = disk::DiskStore::Open(so);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    return 1;
  }
  std::vector<std::byte> value(size);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i + 8 <= value.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(value.data() + i, &x, 8);
  }
  std::vector<std::string> keys;
  for (uint64_t first = 0; first < objects; first += batch) {
    keys.clear();
    std::vector<disk::ObjectWrite> writes;
    for (uint64_t i = first; i < std::min<uint64_t>(objects, first + batch); ++i) {
      keys.push_back("recover/" + std::to_string(i));
    }
    for (const auto& k : keys) writes.push_back(disk::ObjectWrite{k, 1, value, {}});
    for (const auto& r : (*store)->Write(writes)) {
      if (!r.ok()) {
        std::fprintf(stderr, "write: %s\n", r.status().ToString().c_str());
        return 1;
      }
    }
  }
  return 0;
}

struct OpenTiming {
  double seconds = -1;
  uint64_t objects = 0;
  std::string error;
};

// Opens the store, times it, checks it lists `objects`, and closes it cleanly.
OpenTiming TimeOpen(const disk::DiskStoreOptions& so, uint64_t objects) {
  OpenTiming t;
  const auto t0 = Clock::now();
  auto store = disk::DiskStore::Open(so);
  t.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!store.ok()) {
    t.error = store.status().ToString();
    return t;
  }
  t.objects = (*store)->ListObjects().size();
  if (t.objects != objects) {
    t.error = "listed " + std::to_string(t.objects) + " of " + std::to_string(objects);
  }
  return t;
}

}  // namespace

int RunDiskRecoveryBench(const DiskRecoveryBenchOptions& o) {
  auto size = ParseSize(o.size);
  if (!size.ok() || *size == 0) {
    std::fprintf(stderr, "granary-bench: bad --size %s\n", o.size.c_str());
    return 2;
  }
  nlohmann::json json = nlohmann::json::array();
  std::printf("%-8s %9s %8s %10s %14s %14s\n", "backend", "objects", "size", "write s",
              "crash open s", "clean open s");
  int failures = 0;
  for (size_t b = 0; b < o.backends.size(); ++b) {
    auto backend = disk::ParseBackend(o.backends[b]);
    if (!backend.ok()) return 2;
    const bool keep = !o.keep.empty() && b + 1 == o.backends.size();
    std::string dir;
    if (keep) {
      dir = o.keep;
      std::filesystem::create_directories(dir);
    } else {
      std::string templ = o.dir + "/granary-bench-recover.XXXXXX";
      if (!mkdtemp(templ.data())) {
        std::fprintf(stderr, "granary-bench: cannot create a directory in %s\n", o.dir.c_str());
        return 1;
      }
      dir = templ;
    }
    const disk::DiskStoreOptions so = StoreOptions(dir, *backend, o.objects, *size);
    std::fflush(nullptr);
    const auto w0 = Clock::now();
    const pid_t child = fork();
    if (child == 0) _exit(WriteAndCrash(so, o.objects, *size, o.batch));
    int wstatus = 0;
    std::string error;
    if (child < 0 || waitpid(child, &wstatus, 0) != child || !WIFEXITED(wstatus) ||
        WEXITSTATUS(wstatus) != 0) {
      error = "the writer failed";
    }
    const double write_s = std::chrono::duration<double>(Clock::now() - w0).count();
    OpenTiming crash, clean;
    if (error.empty()) {
      crash = TimeOpen(so, o.objects);
      error = crash.error;
    }
    if (error.empty()) {
      clean = TimeOpen(so, o.objects);
      error = clean.error;
    }
    std::printf("%-8s %9llu %8s %10.2f %14.3f %14.3f\n", o.backends[b].c_str(),
                static_cast<unsigned long long>(o.objects), FormatSize(*size).c_str(), write_s,
                crash.seconds, clean.seconds);
    if (!error.empty()) std::printf("  error: %s\n", error.c_str());
    failures += !error.empty();
    json.push_back({{"backend", o.backends[b]},
                    {"objects", o.objects},
                    {"size", *size},
                    {"write_s", write_s},
                    {"crash_open_s", crash.seconds},
                    {"clean_open_s", clean.seconds},
                    {"error", error}});
    if (!keep) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
  if (!o.json_path.empty()) std::ofstream(o.json_path) << json.dump(2) << "\n";
  return failures ? 1 : 0;
}

}  // namespace granary::bench
