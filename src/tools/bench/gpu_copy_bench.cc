// granary-bench gpu-copy: where a same-host get into GPU memory (or a put from it) spends its
// time, without a store. A shared-memory file stands in for the node's segment (pinned with
// cudaHostRegister, as the client pins a mapped segment); objects of one size are copied between
// it and cudaMalloc'd memory by T threads, each on its own stream, in the ways the client could:
//   dma-each   a copy, then wait for it, per object
//   dma-batch  every copy of the thread's share started, one wait at the end
//   hash       the CPU hashes the segment's bytes (XXH3, as ChecksumStream), no copy
//   each       get: start the copy, hash, wait, per object (ReplicaIo::Read today);
//              put: copy, wait, hash, per object (ReplicaIo::Write today)
//   batch      get: start each copy and hash its bytes, one wait at the end;
//              put: start every copy, one wait, then hash them all
#include <sys/mman.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "gpu/cuda_runtime.h"
#include "tools/bench/bench.h"

namespace granary::bench {
namespace {

using Clock = std::chrono::steady_clock;
using gpu::CudaRuntime;

struct Case {
  std::string direction, mode;
  uint64_t object = 0;
  int threads = 0;
  double seconds = 0;
  double gbps = 0;
};

// One pass of `mode` over every object, split into contiguous shares; best time of `repeats`.
double RunCase(const CudaRuntime& cuda, bool to_device, const std::string& mode, std::byte* host,
               std::byte* device, uint64_t total, uint64_t object, int threads, int repeats,
               std::vector<CudaRuntime::Stream>& streams, uint64_t* sink, Status* failed) {
  const uint64_t objects = total / object;
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    std::barrier start(threads + 1);
    std::vector<std::thread> pool;
    std::vector<uint64_t> digests(threads, 0);
    std::vector<Status> failures(threads);
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        failures[t] = cuda.SetDevice(0);
        CudaRuntime::Stream s = streams[t];
        const uint64_t first = objects * t / threads, last = objects * (t + 1) / threads;
        auto copy = [&](uint64_t i) {
          std::byte* h = host + i * object;
          std::byte* d = device + i * object;
          return to_device ? cuda.CopyToDeviceAsync(d, h, object, s)
                           : cuda.CopyToHostAsync(h, d, object, s);
        };
        auto hash = [&](uint64_t i) {
          ChecksumStream c;
          c.Update(host + i * object, object);
          digests[t] ^= c.Digest();
        };
        start.arrive_and_wait();
        // A refused copy or wait returns at once: the case's figure would be meaningless.
        auto check = [&](const Status& st) {
          if (!st.ok() && failures[t].ok()) failures[t] = st;
        };
        for (uint64_t i = first; i < last; ++i) {
          if (mode == "dma-each") {
            check(copy(i));
            check(cuda.Synchronize(s));
          } else if (mode == "dma-batch") {
            check(copy(i));
          } else if (mode == "hash") {
            hash(i);
          } else if (mode == "each") {
            check(copy(i));
            if (to_device) {
              hash(i);
              check(cuda.Synchronize(s));
            } else {
              check(cuda.Synchronize(s));
              hash(i);
            }
          } else {  // batch
            check(copy(i));
            if (to_device) hash(i);
          }
        }
        if (mode == "dma-batch" || mode == "batch") check(cuda.Synchronize(s));
        if (mode == "batch" && !to_device) {
          for (uint64_t i = first; i < last; ++i) hash(i);
        }
      });
    }
    start.arrive_and_wait();
    const auto t0 = Clock::now();
    for (auto& th : pool) th.join();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    for (uint64_t d : digests) *sink ^= d;
    for (const Status& f : failures) {
      if (!f.ok()) {
        *failed = f;
        return 0;
      }
    }
  }
  return best;
}

}  // namespace

int RunGpuCopyBench(const GpuCopyBenchOptions& o) {
  const CudaRuntime& cuda = CudaRuntime::Instance();
  if (!cuda.available()) {
    std::fprintf(stderr, "gpu-copy: CUDA is not available: %s\n", cuda.why_not().c_str());
    return 1;
  }
  const uint64_t total = o.bytes;
  for (uint64_t object : o.objects) {
    if (object == 0 || object > total) {
      std::fprintf(stderr, "gpu-copy: every object size must be 1..--bytes\n");
      return 2;
    }
  }
  int fd = memfd_create("granary-gpu-copy", 0);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(total)) != 0) {
    std::perror("gpu-copy: memfd");
    return 1;
  }
  void* map = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    std::perror("gpu-copy: mmap");
    return 1;
  }
  auto* host = static_cast<std::byte*>(map);
  for (uint64_t i = 0; i < total; i += 4096) host[i] = std::byte(i >> 12);
  const auto r0 = Clock::now();
  Status pinned = cuda.RegisterHost(host, total);
  const double register_s = std::chrono::duration<double>(Clock::now() - r0).count();
  std::printf("gpu-copy: %.2f GiB shared memory, cudaHostRegister %s in %.3f s\n",
              total / double(1 << 30), pinned.ok() ? "ok" : pinned.ToString().c_str(), register_s);
  (void)cuda.SetDevice(0);
  auto dev = cuda.AllocateDevice(total);
  if (!dev.ok()) {
    std::fprintf(stderr, "gpu-copy: %s\n", dev.status().ToString().c_str());
    return 1;
  }
  auto* device = static_cast<std::byte*>(*dev);
  int max_threads = 1;
  for (int t : o.threads) max_threads = std::max(max_threads, t);
  std::vector<CudaRuntime::Stream> streams;
  for (int t = 0; t < max_threads; ++t) {
    auto stream = cuda.CreateStream();
    if (!stream.ok()) {
      std::fprintf(stderr, "gpu-copy: %s\n", stream.status().ToString().c_str());
      return 1;
    }
    streams.push_back(*stream);
  }

  std::vector<Case> cases;
  uint64_t sink = 0;
  std::printf("%-5s %-10s %10s %4s %10s %8s\n", "dir", "mode", "object", "thr", "ms", "GB/s");
  for (const std::string& dir : o.directions) {
    for (uint64_t object : o.objects) {
      for (int threads : o.threads) {
        for (const std::string& mode : o.modes) {
          Status failed;
          double s = RunCase(cuda, dir == "h2d", mode, host, device, total / object * object,
                             object, threads, o.repeats, streams, &sink, &failed);
          if (!failed.ok()) {
            std::fprintf(stderr, "gpu-copy: %s %s: %s\n", dir.c_str(), mode.c_str(),
                         failed.ToString().c_str());
            return 1;
          }
          Case c{dir, mode, object, threads, s, (total / object * object) / s / 1e9};
          std::printf("%-5s %-10s %10llu %4d %10.2f %8.2f\n", dir.c_str(), mode.c_str(),
                      static_cast<unsigned long long>(object), threads, s * 1e3, c.gbps);
          std::fflush(stdout);
          cases.push_back(c);
        }
      }
    }
  }
  if (!o.json_path.empty()) {
    std::ofstream j(o.json_path);
    j << "{\"bytes\": " << total << ", \"register_s\": " << register_s
      << ", \"registered\": " << (pinned.ok() ? "true" : "false") << ", \"cases\": [";
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      j << (i ? ", " : "") << "{\"direction\": \"" << c.direction << "\", \"mode\": \"" << c.mode
        << "\", \"object\": " << c.object << ", \"threads\": " << c.threads
        << ", \"seconds\": " << c.seconds << ", \"gbps\": " << c.gbps << "}";
    }
    j << "], \"sink\": " << (sink & 1) << "}\n";
  }
  for (auto s : streams) cuda.DestroyStream(s);
  cuda.FreeDevice(device);
  if (pinned.ok()) (void)cuda.UnregisterHost(host);
  munmap(map, total);
  return 0;
}

}  // namespace granary::bench
