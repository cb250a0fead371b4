// granary-bench limits, the limits a same-host client meets before any Granary code runs: the
// loopback TCP round trip of a small message (the floor of every control call), the time of one
// large answer to a small request (the floor of a get of one object over TCP), and the cost
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

bool RecvAll(int fd, char* p, size_t n, int flags = 0) {
  while (n > 0) {
    ssize_t r = recv(fd, p, n, flags);
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
// `client` sends request_bytes, a thread on `server` answers with answer_bytes once the whole
// request is in, for `seconds`; each sample is one request to the answer's last byte. The client
// receives its answer with plain recv()s (wait_all false) or one recv(MSG_WAITALL) of the rest.
RoundTrip RequestAnswer(int client, int server, size_t request_bytes, size_t answer_bytes,
                        double seconds, bool wait_all = false) {
  RoundTrip out;
  std::thread answerer([server, request_bytes, answer_bytes] {
    std::vector<char> request(request_bytes);
    std::vector<char> answer(answer_bytes, 'a');
    while (RecvAll(server, request.data(), request.size()) &&
           SendAll(server, answer.data(), answer.size())) {
    }
    close(server);
  });
  std::vector<char> request(request_bytes, 'r');
  std::vector<char> answer(answer_bytes, 'b');  // written once: no first-touch faults timed
  std::vector<double> us;
  constexpr size_t kMaxSamples = 2'000'000;  // bounds the loop whatever the machine's speed
  const auto start = Clock::now();
  while (SecondsSince(start) < seconds && us.size() < kMaxSamples) {
    const auto t = Clock::now();
    if (!SendAll(client, request.data(), request.size()) ||
        !RecvAll(client, answer.data(), answer.size(), wait_all ? MSG_WAITALL : 0)) {
      break;
    }
    us.push_back(SecondsSince(t) * 1e6);
  }
  shutdown(client, SHUT_RDWR);
  close(client);
  answerer.join();
  if (us.empty()) return out;
  std::sort(us.begin(), us.end());
  out.p50_us = us[us.size() / 2];
  out.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  out.samples = us.size();
  return out;
}

// A connected pair over 127.0.0.1, TCP_NODELAY on both ends; false if the machine refuses.
bool LoopbackPair(int* client, int* server) {
  sockaddr_in addr{};
  int listener = ListenLoopback(1, &addr);
  if (listener < 0) return false;
  *client = socket(AF_INET, SOCK_STREAM, 0);
  const bool connected =
      *client >= 0 && connect(*client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  *server = connected ? accept(listener, nullptr, nullptr) : -1;
  close(listener);
  if (*server < 0) {  // one way out for every failure: close what was opened
    if (*client >= 0) close(*client);
    return false;
  }
  const int one = 1;
  setsockopt(*client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(*server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return true;
}
}  // namespace

RoundTrip LoopbackRoundTrip(size_t message_bytes, double seconds) {
  int client, server;
  if (!LoopbackPair(&client, &server)) return {};
  return RequestAnswer(client, server, message_bytes, message_bytes, seconds);
}

RoundTrip LoopbackAnswer(size_t answer_bytes, double seconds) {
  RoundTrip best;
  for (bool wait_all : {false, true}) {
    int client, server;
    if (!LoopbackPair(&client, &server)) break;  // keep what the first reader measured
    const double half = seconds / 2;
    RoundTrip r = RequestAnswer(client, server, 64, answer_bytes, half, wait_all);
    if (r.samples > 0 && (best.samples == 0 || r.p50_us < best.p50_us)) best = r;
  }
  return best;
}

RoundTrip UnixRoundTrip(size_t message_bytes, double seconds) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return {};
  return RequestAnswer(pair[0], pair[1], message_bytes, message_bytes, seconds);
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
