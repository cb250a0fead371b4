// granary-bench limits: what this machine can do at best, so every Granary figure can be read as
// a fraction of it. Single-thread memcpy, loopback TCP (one and several streams), and sequential
// disk write and read with O_DIRECT (the page cache bypassed), and 64 KiB random reads at
// queue depth 32.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/copy.h"
#include "disk/disk_io.h"
#include "tools/bench/bench.h"

namespace granary::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : size(n) {
    data = static_cast<char*>(std::aligned_alloc(4096, n));
    std::memset(data, 0x5a, n);  // fault every page in before timing
  }
  ~AlignedBuffer() { std::free(data); }
  char* data;
  size_t size;
};

}  // namespace

// memcpy of `chunk`-byte blocks across two 256 MiB buffers (larger than any cache), on `threads`
// threads at once, each with its own buffers; the total GB/s.
double MemcpyGBps(size_t chunk, double seconds, int threads) {
  constexpr size_t kSpan = 256 << 20;
  std::vector<uint64_t> bytes(threads, 0);
  std::vector<double> took(threads, 0);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      AlignedBuffer src(kSpan), dst(kSpan);
      auto start = Clock::now();
      while (Seconds(start) < seconds) {
        for (size_t off = 0; off + chunk <= kSpan; off += chunk) {
          std::memcpy(dst.data + off, src.data + off, chunk);
        }
        bytes[t] += kSpan / chunk * chunk;
      }
      took[t] = Seconds(start);
    });
  }
  for (auto& w : workers) w.join();
  double total = 0;
  for (int t = 0; t < threads; ++t) total += bytes[t] / took[t];
  return total / 1e9;
}

namespace {

// How a limit's reader receives: plain 1 MiB read()s (one wake per socket-buffer's worth), or
// recv(MSG_WAITALL) of `piece` bytes (one wake per piece; what a client receiving a known length
// straight into its buffer can do).
struct ReadStyle {
  size_t piece;
  bool wait_all;
};

// `streams` connections over 127.0.0.1, each sending 1 MiB writes for `seconds`.
double LoopbackTcpGBpsWith(int streams, double seconds, ReadStyle style) {
  sockaddr_in addr{};
  int listener = ListenLoopback(streams, &addr);
  if (listener < 0) return -1;
  constexpr size_t kChunk = 1 << 20;
  std::vector<uint64_t> received(streams, 0);
  std::vector<std::thread> readers;
  std::vector<int> senders;
  for (int i = 0; i < streams; ++i) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(s);
      close(listener);
      for (int fd : senders) close(fd);
      for (auto& r : readers) r.join();
      return -1;
    }
    senders.push_back(s);
    int r = accept(listener, nullptr, nullptr);
    readers.emplace_back([r, i, style, &received] {
      std::vector<char> buf(style.piece);
      ssize_t n;
      while ((n = recv(r, buf.data(), buf.size(), style.wait_all ? MSG_WAITALL : 0)) > 0) {
        received[i] += n;
      }
      close(r);
    });
  }
  close(listener);
  auto start = Clock::now();
  std::vector<std::thread> writers;
  for (int fd : senders) {
    writers.emplace_back([fd, seconds, start] {
      std::vector<char> buf(kChunk, 'x');
      while (Seconds(start) < seconds) {
        if (write(fd, buf.data(), buf.size()) <= 0) break;
      }
      shutdown(fd, SHUT_WR);
    });
  }
  for (auto& w : writers) w.join();
  for (auto& r : readers) r.join();
  double elapsed = Seconds(start);
  for (int fd : senders) close(fd);
  uint64_t total = 0;
  for (uint64_t b : received) total += b;
  return total / elapsed / 1e9;
}

}  // namespace

// The best of three readers (1 MiB read(), MSG_WAITALL of 256 KiB and of 4 MiB), `seconds`
// each: a limit must bound what any client can do, and a reader that sleeps until a whole piece
// is in (as memcached's client and Granary's do) beats plain reads on a loaded 2-core box.
double LoopbackTcpGBps(int streams, double seconds) {
  double best = -1;
  for (ReadStyle style : {ReadStyle{1 << 20, false}, ReadStyle{256 << 10, true},
                          ReadStyle{4 << 20, true}}) {
    best = std::max(best, LoopbackTcpGBpsWith(streams, seconds, style));
  }
  return best;
}

namespace {

struct DiskResult {
  double write_gbps = -1;
  double read_gbps = -1;
  double random_read_gbps = -1;  // 64 KiB at queue depth 32
  std::string random_read_io;    // the engine that measured it
  std::string error;
};

// Random 64 KiB-aligned O_DIRECT reads of 64 KiB over the file, 32 in flight (the disk tier's
// engine: io_uring where the kernel allows it, else POSIX one at a time), for `seconds`.
void RandomReadGBps(const std::string& path, uint64_t file_bytes, double seconds, DiskResult* result) {
  constexpr uint64_t kRead = 64 << 10;
  constexpr int kDepth = 32;
  auto io = disk::MakeDiskIo(disk::IoMode::kAuto, kDepth);
  int fd = open(path.c_str(), O_RDONLY | O_DIRECT);
  if (!io.ok() || fd < 0 || file_bytes < kRead) {
    if (fd >= 0) close(fd);
    return;
  }
  result->random_read_io = std::string(disk::IoModeName((*io)->mode()));
  AlignedBuffer buf(kDepth * kRead);
  std::vector<disk::IoRequest> batch(kDepth);
  uint64_t rng = 88172645463325252ull, bytes = 0;
  auto start = Clock::now();
  while (Seconds(start) < seconds) {
    for (int i = 0; i < kDepth; ++i) {
      rng ^= rng << 13;
      rng ^= rng >> 7;
      rng ^= rng << 17;
      batch[i] = disk::IoRequest{fd, false, reinterpret_cast<std::byte*>(buf.data) + i * kRead, kRead,
                                 rng % (file_bytes / kRead) * kRead, 0};
    }
    (*io)->Run(batch);
    for (const auto& r : batch) bytes += r.result > 0 ? static_cast<uint64_t>(r.result) : 0;
  }
  result->random_read_gbps = bytes / Seconds(start) / 1e9;
  close(fd);
}

// Sequential 1 MiB O_DIRECT writes of `bytes` (then fdatasync), then reads of the same file.
DiskResult DiskGBps(const std::string& dir, uint64_t bytes, double seconds) {
  DiskResult result;
  std::string path = dir + "/granary-bench-disk.XXXXXX";
  std::vector<char> templ(path.begin(), path.end());
  templ.push_back('\0');
  int tmp = mkstemp(templ.data());
  if (tmp < 0) {
    result.error = "cannot create a file in " + dir + ": " + std::strerror(errno);
    return result;
  }
  close(tmp);
  path = templ.data();
  constexpr size_t kBlock = 1 << 20;
  AlignedBuffer buf(kBlock);
  int fd = open(path.c_str(), O_WRONLY | O_DIRECT);
  if (fd < 0) {
    result.error = "O_DIRECT not supported in " + dir + ": " + std::strerror(errno);
    unlink(path.c_str());
    return result;
  }
  auto start = Clock::now();
  uint64_t written = 0;
  while (written < bytes && write(fd, buf.data, kBlock) == static_cast<ssize_t>(kBlock)) written += kBlock;
  fdatasync(fd);
  result.write_gbps = written / Seconds(start) / 1e9;
  close(fd);
  fd = open(path.c_str(), O_RDONLY | O_DIRECT);
  start = Clock::now();
  uint64_t read_bytes = 0;
  ssize_t n;
  while ((n = read(fd, buf.data, kBlock)) > 0) read_bytes += n;
  result.read_gbps = read_bytes / Seconds(start) / 1e9;
  close(fd);
  RandomReadGBps(path, written, seconds, &result);
  unlink(path.c_str());
  if (written < bytes) result.error = "short write: " + std::to_string(written) + " bytes";
  return result;
}

}  // namespace

int RunLimits(const LimitsOptions& o) {
  nlohmann::json json;
  std::printf("%-36s %10s\n", "limit", "GB/s");
  for (size_t chunk : {size_t{64} << 10, size_t{4} << 20}) {
    double gbps = MemcpyGBps(chunk, o.seconds);
    std::string name = "memcpy_" + std::to_string(chunk >> 10) + "KiB";
    std::printf("%-36s %10.2f\n", ("memcpy, 1 thread, " + std::to_string(chunk >> 10) + " KiB blocks").c_str(), gbps);
    json[name] = gbps;
  }
  // Every core copying at once: the ceiling for several same-host clients.
  if (const int cores = MemcpyThreadsFor(1 << 30); cores > 1) {
    double gbps = MemcpyGBps(4 << 20, o.seconds, cores);
    std::printf("%-36s %10.2f\n", ("memcpy, " + std::to_string(cores) + " threads, 4096 KiB blocks").c_str(), gbps);
    json[MemcpyLimitName(cores)] = gbps;
  }
  for (int streams : o.tcp_streams) {
    double gbps = LoopbackTcpGBps(streams, o.seconds);
    std::printf("%-36s %10.2f\n", ("loopback TCP, " + std::to_string(streams) + " stream(s)").c_str(), gbps);
    json["tcp_" + std::to_string(streams) + "_streams"] = gbps;
  }
  const CopyChoice& copy = CalibrateCopy();
  std::printf("%-36s %10.2f  (vector loop %.2f; Granary uses %s)\n", "copy 64 KiB blocks, glibc memcpy",
              copy.small_memcpy_gbps, copy.small_vector_gbps, copy.memcpy_small ? "memcpy" : "the loop");
  std::printf("%-36s %10.2f  (vector loop %.2f; Granary uses %s)\n", "copy 4 MiB blocks, glibc memcpy",
              copy.large_memcpy_gbps, copy.large_vector_gbps, copy.memcpy_large ? "memcpy" : "the loop");
  std::printf("%-36s %10.2f  (streamed %.2f; Granary's puts %s)\n", "copy 4 MiB into cold memory",
              copy.cold_plain_gbps, copy.cold_stream_gbps,
              copy.stream_large_shared ? "stream" : "do not stream");
  json["copy_4MiB_cold"] = copy.cold_plain_gbps;
  json["copy_4MiB_cold_streamed"] = copy.cold_stream_gbps;
  json["copy_64KiB_memcpy"] = copy.small_memcpy_gbps;
  json["copy_64KiB_vector"] = copy.small_vector_gbps;
  json["copy_4MiB_memcpy"] = copy.large_memcpy_gbps;
  json["copy_4MiB_vector"] = copy.large_vector_gbps;
  const RoundTrip rtt = LoopbackRoundTrip(64, o.seconds);
  std::printf("%-36s %10.1f us p50, %.1f us p99\n", "loopback TCP round trip, 64 bytes",
              rtt.p50_us, rtt.p99_us);
  json["tcp_rtt_64B_p50_us"] = rtt.p50_us;
  json["tcp_rtt_64B_p99_us"] = rtt.p99_us;
  const RoundTrip answer = LoopbackAnswer(4 << 20, o.seconds);
  const double answer_gbps = answer.p50_us > 0 ? (4 << 20) / answer.p50_us / 1e3 : -1;
  std::printf("%-36s %10.2f  (%.0f us p50, %.0f us p99)\n", "loopback TCP, 4 MiB answer",
              answer_gbps, answer.p50_us, answer.p99_us);
  json["tcp_answer_4MiB"] = answer_gbps;
  json["tcp_answer_4MiB_p50_us"] = answer.p50_us;
  json["tcp_answer_4MiB_p99_us"] = answer.p99_us;
  const RoundTrip unix_rtt = UnixRoundTrip(64, o.seconds);
  std::printf("%-36s %10.1f us p50, %.1f us p99\n", "unix socket round trip, 64 bytes",
              unix_rtt.p50_us, unix_rtt.p99_us);
  json["unix_rtt_64B_p50_us"] = unix_rtt.p50_us;
  json["unix_rtt_64B_p99_us"] = unix_rtt.p99_us;
  const FirstAccess fa = FirstAccessLimits(o.first_access_bytes);
  if (!fa.error.empty()) std::printf("first access: %s\n", fa.error.c_str());
  std::printf("%-36s %10.2f\n", "shm first write, new mapping", fa.first_write_gbps);
  std::printf("%-36s %10.2f\n", "shm second write, same mapping", fa.second_write_gbps);
  std::printf("%-36s %10.2f  (warm-up MADV_POPULATE_READ %.3f s/GiB; 1 byte per page read %.3f s/GiB)\n",
              "shm write after warm-up, new mapping", fa.write_after_warm_gbps,
              fa.warm_seconds_per_gib, fa.touch_seconds_per_gib);
  json["shm_first_write"] = fa.first_write_gbps;
  json["shm_second_write"] = fa.second_write_gbps;
  json["shm_write_after_warm"] = fa.write_after_warm_gbps;
  json["shm_warm_seconds_per_gib"] = fa.warm_seconds_per_gib;
  json["shm_touch_seconds_per_gib"] = fa.touch_seconds_per_gib;
  json["shm_first_access_bytes"] = fa.bytes;
  DiskResult disk = DiskGBps(o.disk_dir, o.disk_bytes, o.seconds);
  if (!disk.error.empty()) std::printf("disk: %s\n", disk.error.c_str());
  std::printf("%-36s %10.2f\n", "disk write, O_DIRECT, 1 MiB blocks", disk.write_gbps);
  std::printf("%-36s %10.2f\n", "disk read, O_DIRECT, 1 MiB blocks", disk.read_gbps);
  json["disk_write_odirect"] = disk.write_gbps;
  json["disk_read_odirect"] = disk.read_gbps;
  std::printf("%-36s %10.2f\n", ("disk random read, 64 KiB, QD 32, " + disk.random_read_io).c_str(),
              disk.random_read_gbps);
  json["disk_random_read_64KiB_qd32"] = disk.random_read_gbps;
  json["disk_random_read_io"] = disk.random_read_io;
  json["disk_dir"] = o.disk_dir;
  if (!o.json_path.empty()) std::ofstream(o.json_path) << json.dump(2) << "\n";
  return 0;
}

}  // namespace granary::bench
