// granary-bench limits, the two limits a same-host client meets before any Granary code runs:
// the loopback TCP round trip of a small message (the floor of every control call), and the cost
// of a process's first access to pages of shared memory another mapping already wrote (what a
// client pays the first time it writes into a node's segment).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/populate.h"
#include "tools/bench/bench.h"

namespace granary::bench {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

bool SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool RecvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

int ListenLoopback(int backlog, sockaddr_in* addr) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  *addr = sockaddr_in{};
  addr->sin_family = AF_INET;
  addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(*addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(addr), sizeof(*addr)) != 0 ||
      listen(listener, backlog) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(addr), &len) != 0) {
    close(listener);
    return -1;
  }
  return listener;
}

namespace {
// Ping-pong of message_bytes between `client` and an echo thread on `server`, for `seconds`.
RoundTrip PingPong(int client, int server, size_t message_bytes, double seconds) {
  RoundTrip out;
  std::thread echo([server, message_bytes] {
    std::vector<char> buf(message_bytes);
    while (RecvAll(server, buf.data(), buf.size()) && SendAll(server, buf.data(), buf.size())) {
    }
    close(server);
  });
  std::vector<char> buf(message_bytes, 'r');
  std::vector<double> us;
  constexpr size_t kMaxSamples = 2'000'000;  // bounds the loop whatever the machine's speed
  const auto start = Clock::now();
  while (SecondsSince(start) < seconds && us.size() < kMaxSamples) {
    const auto t = Clock::now();
    if (!SendAll(client, buf.data(), buf.size()) || !RecvAll(client, buf.data(), buf.size())) break;
    us.push_back(SecondsSince(t) * 1e6);
  }
  shutdown(client, SHUT_RDWR);
  close(client);
  echo.join();
  if (us.empty()) return out;
  std::sort(us.begin(), us.end());
  out.p50_us = us[us.size() / 2];
  out.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  out.samples = us.size();
  return out;
}
}  // namespace

RoundTrip LoopbackRoundTrip(size_t message_bytes, double seconds) {
  sockaddr_in addr{};
  int listener = ListenLoopback(1, &addr);
  if (listener < 0) return {};
  int client = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(client);
    close(listener);
    return {};
  }
  int server = accept(listener, nullptr, nullptr);
  close(listener);
  const int one = 1;
  setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return PingPong(client, server, message_bytes, seconds);
}

RoundTrip UnixRoundTrip(size_t message_bytes, double seconds) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return {};
  return PingPong(pair[0], pair[1], message_bytes, seconds);
}

FirstAccess FirstAccessLimits(uint64_t bytes) {
  FirstAccess out;
  constexpr size_t kBlock = 4 << 20;
  bytes = std::max<uint64_t>(kBlock, bytes / kBlock * kBlock);
  const std::string name = "/granary-bench-first-access-" + std::to_string(getpid());
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    out.error = std::string("shm_open: ") + std::strerror(errno);
    return out;
  }
  shm_unlink(name.c_str());  // the descriptor keeps the file; nothing is left behind on a crash
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    out.error = std::string("ftruncate: ") + std::strerror(errno);
    close(fd);
    return out;
  }
  auto map = [&] {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  };
  std::vector<char> src(kBlock, 'a');
  auto write_pass = [&](char* p) {
    const auto t = Clock::now();
    for (uint64_t off = 0; off < bytes; off += kBlock) std::memcpy(p + off, src.data(), kBlock);
    return bytes / SecondsSince(t) / 1e9;
  };
  // The node's side: its own mapping writes every page (what --prefault does), then goes away.
  if (char* p = map()) {
    write_pass(p);
    munmap(p, bytes);
  }
  if (char* p = map()) {  // a client's new mapping, written at once
    out.first_write_gbps = write_pass(p);
    out.second_write_gbps = write_pass(p);
    munmap(p, bytes);
  }
  if (char* p = map()) {  // a client's new mapping, warmed first as the client does
    const auto t = Clock::now();
    const bool populated = madvise(p, bytes, MADV_POPULATE_READ) == 0;
    out.warm_seconds_per_gib = populated ? SecondsSince(t) * double(1 << 30) / bytes : -1;
    out.write_after_warm_gbps = write_pass(p);
    munmap(p, bytes);
  }
  if (char* p = map()) {  // the same warm-up by a read of one byte per page
    const auto t = Clock::now();
    uint64_t sum = 0;
    for (uint64_t off = 0; off < bytes; off += 4096) sum += static_cast<unsigned char>(p[off]);
    out.touch_seconds_per_gib = SecondsSince(t) * double(1 << 30) / bytes;
    out.touch_checksum = sum;  // keeps the reads
    munmap(p, bytes);
  }
  close(fd);
  out.bytes = bytes;
  return out;
}

}  // namespace granary::bench
