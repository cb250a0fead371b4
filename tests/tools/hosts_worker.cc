// The several-hosts test's client process; see hosts_worker.h.
#include "hosts_worker.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "granary/client.h"
#include "test_pattern.h"

namespace granary::hosts {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;
constexpr int kExitRpc = 3;
constexpr int kExitWrong = 4;

using Clock = std::chrono::steady_clock;

std::string KeyOf(const ObjectsOptions& o, size_t j) { return o.prefix + "/" + std::to_string(j); }

uint64_t SizeOf(const ObjectsOptions& o, const std::string& key) {
  const uint64_t span = o.max_size - o.min_size + 1;
  return o.min_size + testdata::SeedOf(key) % span;
}

void Fnv(uint64_t& h, const std::vector<std::byte>& bytes) {
  for (std::byte b : bytes) {
    h ^= static_cast<uint8_t>(b);
    h *= 0x100000001b3ull;
  }
}

void PrintStats(const Client& client, uint64_t bytes, double seconds) {
  const ClientStats s = client.Stats();
  std::printf(
      "stats shm_written=%llu shm_read=%llu tcp_written=%llu tcp_read=%llu shm_mappings=%llu "
      "maps_shm=%d bytes=%llu seconds=%.3f\n",
      static_cast<unsigned long long>(s.shm_bytes_written),
      static_cast<unsigned long long>(s.shm_bytes_read),
      static_cast<unsigned long long>(s.tcp_bytes_written),
      static_cast<unsigned long long>(s.tcp_bytes_read),
      static_cast<unsigned long long>(s.shm_mappings), MapsSharedSegment() ? 1 : 0,
      static_cast<unsigned long long>(bytes), seconds);
}

// Every object has `replicas` memory replicas on distinct segments; prints replicas per segment.
int CheckPlacement(Client& client, const ObjectsOptions& o, const std::vector<std::string>& keys) {
  std::map<std::string, size_t> per_segment;
  for (const auto& key : keys) {
    auto st = client.Stat(key);
    if (!st.ok()) {
      std::fprintf(stderr, "stat %s: %s\n", key.c_str(), st.status().ToString().c_str());
      return kExitRpc;
    }
    std::set<std::string> segments;
    for (const auto& r : st->replicas) segments.insert(r.segment_name);
    if (st->replicas.size() != o.replicas || segments.size() != o.replicas) {
      std::fprintf(stderr, "%s: %zu replicas on %zu segments, wanted %u on distinct segments\n",
                   key.c_str(), st->replicas.size(), segments.size(), o.replicas);
      return kExitWrong;
    }
    for (const auto& s : segments) ++per_segment[s];
  }
  for (const auto& [segment, n] : per_segment) std::printf("placement %s %zu\n", segment.c_str(), n);
  return kExitOk;
}

}  // namespace

bool MapsSharedSegment() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/dev/shm/granary-") != std::string::npos) return true;
  }
  return false;
}

int RunObjects(const ObjectsOptions& o) {
  if (o.objects == 0 || o.min_size == 0 || o.min_size > o.max_size || o.batch == 0) {
    std::fprintf(stderr, "objects: need objects > 0 and 0 < min-size <= max-size\n");
    return kExitUsage;
  }
  ClientOptions options;
  options.master_address = o.master;
  options.segment_size = 0;
  options.use_shared_memory = o.use_shm;
  options.rpc_timeout_ms = 10'000;
  options.io_timeout_ms = 10'000;
  auto connected = Client::Connect(options);
  if (!connected.ok()) {
    std::fprintf(stderr, "connect %s: %s\n", o.master.c_str(),
                 connected.status().ToString().c_str());
    return kExitRpc;
  }
  Client& client = **connected;

  std::vector<std::string> keys;
  for (size_t j = 0; j < o.objects; ++j) keys.push_back(KeyOf(o, j));
  if (o.mode == ObjectsOptions::Mode::kStat) return CheckPlacement(client, o, keys);
  uint64_t digest = 0xcbf29ce484222325ull;
  uint64_t bytes = 0;
  const auto start = Clock::now();
  for (size_t first = 0; first < keys.size(); first += o.batch) {
    const size_t n = std::min(o.batch, keys.size() - first);
    std::vector<std::string> batch(keys.begin() + first, keys.begin() + first + n);
    std::vector<std::vector<std::byte>> expected;
    for (const auto& key : batch) expected.push_back(testdata::Pattern(key, SizeOf(o, key)));
    if (o.mode == ObjectsOptions::Mode::kPut) {
      std::vector<ByteSpan> spans;
      for (const auto& e : expected) spans.emplace_back(e);
      ReplicateConfig config;
      config.replica_num = o.replicas;
      auto put = client.BatchPut(batch, spans, config);
      for (size_t x = 0; x < n; ++x) {
        if (!put[x].ok()) {
          std::fprintf(stderr, "put %s: %s\n", batch[x].c_str(), put[x].ToString().c_str());
          return kExitRpc;
        }
        Fnv(digest, expected[x]);
        bytes += expected[x].size();
      }
      continue;
    }
    std::vector<std::vector<std::byte>> got;
    std::vector<MutableByteSpan> buffers;
    for (const auto& e : expected) got.emplace_back(e.size(), std::byte{0});
    for (auto& g : got) buffers.emplace_back(g);
    auto results = client.BatchGetInto(batch, buffers);
    for (size_t x = 0; x < n; ++x) {
      if (!results[x].ok()) {
        std::fprintf(stderr, "get %s: %s\n", batch[x].c_str(),
                     results[x].status().ToString().c_str());
        return kExitRpc;
      }
      if (*results[x] != expected[x].size()) {
        std::fprintf(stderr, "get %s: %llu bytes, expected %zu\n", batch[x].c_str(),
                     static_cast<unsigned long long>(*results[x]), expected[x].size());
        return kExitWrong;
      }
      const int64_t diff = testdata::FirstDifference(got[x], expected[x]);
      if (diff >= 0) {
        std::fprintf(stderr, "get %s: wrong byte at offset %lld\n", batch[x].c_str(),
                     static_cast<long long>(diff));
        return kExitWrong;
      }
      Fnv(digest, got[x]);
      bytes += got[x].size();
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (o.mode == ObjectsOptions::Mode::kPut) {
    if (int rc = CheckPlacement(client, o, keys); rc != kExitOk) return rc;
  }
  std::printf("digest %016llx\n", static_cast<unsigned long long>(digest));
  PrintStats(client, bytes, seconds);
  client.Close();
  return kExitOk;
}

int RunConnectRtt(const std::string& endpoint, int count) {
  const size_t colon = endpoint.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (colon == std::string::npos || count < 1 ||
      inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    std::fprintf(stderr, "rtt: want --endpoint IPV4:PORT and --count >= 1\n");
    return kExitUsage;
  }
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1))));
  std::vector<double> ms;
  for (int i = 0; i < count; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return kExitRpc;
    const auto t0 = Clock::now();
    int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = poll(&p, 1, 3000) == 1 ? 0 : -1;
      int err = 0;
      socklen_t len = sizeof(err);
      if (rc == 0 && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)) rc = -1;
    }
    const auto t1 = Clock::now();
    close(fd);
    if (rc != 0) {
      std::fprintf(stderr, "rtt: connect to %s failed\n", endpoint.c_str());
      return kExitRpc;
    }
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("rtt_ms min=%.3f median=%.3f max=%.3f\n", ms.front(), ms[ms.size() / 2], ms.back());
  return kExitOk;
}

}  // namespace granary::hosts
