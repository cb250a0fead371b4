// Tests of transfer::TcpTransport against a real node::DataServer (and a few fake servers that
// stall or answer garbage).
#include "transfer/tcp_transport.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "node/data_server.h"

namespace granary {
namespace {

using node::DataServer;
using transfer::RemoteRange;
using transfer::TcpTransport;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kSegSize = 80 * kMiB;
constexpr uint64_t kToken = 77;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void FillRandom(std::vector<std::byte>& buf, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  size_t i = 0;
  for (; i + 8 <= buf.size(); i += 8) {
    x += 0x9E3779B97F4A7C15ULL;  // splitmix64
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    std::memcpy(buf.data() + i, &z, 8);
  }
  for (; i < buf.size(); ++i) buf[i] = static_cast<std::byte>(x >> (i % 8 * 8));
}

// A listening socket that accepts and then does `behaviour` with each connection.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(int)> behaviour) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd_, 16);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, behaviour] {
      while (true) {
        int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        behaviour(c);
        accepted_.push_back(c);
      }
    });
  }
  ~FakeServer() {
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
    for (int c : accepted_) close(c);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_;
  uint16_t port_;
  std::thread thread_;
  std::vector<int> accepted_;
};

// A node answering READs on any number of connections at once, one thread each: every request
// gets a well-formed answer of `length` bytes (byte i of the range = its offset's low byte),
// except the one at `bad_offset`, which gets its header and half its payload, then the connection
// is closed (`hang_up`) or left silent. The destructor shuts every socket and joins.
class StripeFakeNode {
 public:
  StripeFakeNode(uint64_t bad_offset, bool hang_up) : bad_offset_(bad_offset), hang_up_(hang_up) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd_, 16);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] {
      while (true) {
        int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        std::lock_guard lock(mu_);
        conns_.push_back(c);
        handlers_.emplace_back([this, c] { Serve(c); });
      }
    });
  }
  ~StripeFakeNode() {
    shutdown(fd_, SHUT_RDWR);
    acceptor_.join();
    for (int c : conns_) shutdown(c, SHUT_RDWR);  // wakes handlers blocked in recv
    for (auto& h : handlers_) h.join();
    for (int c : conns_) close(c);
    close(fd_);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  int bad_requests() const { return bad_requests_.load(); }

 private:
  void Serve(int fd) {
    transfer::RequestHeader req;
    while (recv(fd, &req, sizeof(req), MSG_WAITALL) == sizeof(req)) {
      transfer::ResponseHeader rh;
      rh.request_id = req.request_id;
      rh.length = req.length;
      std::vector<uint8_t> payload(req.length);
      for (uint64_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(req.offset + i);
      const bool bad = req.offset == bad_offset_;
      if (bad) bad_requests_++;
      if (send(fd, &rh, sizeof(rh), MSG_NOSIGNAL) != sizeof(rh)) return;
      const size_t n = bad ? payload.size() / 2 : payload.size();
      if (send(fd, payload.data(), n, MSG_NOSIGNAL) != static_cast<ssize_t>(n)) return;
      if (bad && hang_up_) {
        shutdown(fd, SHUT_RDWR);
        return;
      }
      if (bad) {
        char c;
        recv(fd, &c, 1, 0);  // silent until the test ends (or the client hangs up)
        return;
      }
    }
  }

  const uint64_t bad_offset_;
  const bool hang_up_;
  int fd_;
  uint16_t port_;
  std::atomic<int> bad_requests_{0};
  std::mutex mu_;
  std::vector<int> conns_;
  std::vector<std::thread> handlers_;
  std::thread acceptor_;
};

uint16_t ClosedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Ranges past 64 KiB cut into 64 KiB requests over up to `lanes` connections.
TcpTransport::Options Striped64KiB(size_t lanes) {
  TcpTransport::Options options;
  options.stripe_threshold = 64 * kKiB;
  options.stripe_chunk = 64 * kKiB;
  options.connections_per_endpoint = lanes;
  return options;
}

class TcpTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    segment_.assign(kSegSize, 0);
    StartServer(0);
  }
  void StartServer(uint16_t port) {
    DataServer::Options options;
    options.port = port;
    server_ = std::make_unique<DataServer>(segment_.data(), kSegSize, kToken, options);
    Status s = server_->Start();
    ASSERT_TRUE(s.ok()) << s.ToString();
    endpoint_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  RemoteRange Range(uint64_t offset, uint64_t length, uint64_t token = kToken) {
    return RemoteRange{endpoint_, token, offset, length};
  }

  // Writes random bytes through `t`, checks them in the server's memory (and that the bytes just
  // outside the range are untouched), reads them back through `t` and compares.
  void RoundTrip(TcpTransport& t, uint64_t offset, uint64_t length, uint64_t seed) {
    SCOPED_TRACE("length " + std::to_string(length));
    std::vector<std::byte> src(length);
    FillRandom(src, seed);
    const uint8_t before = offset > 0 ? segment_[offset - 1] : 0;
    const uint8_t after = offset + length < kSegSize ? segment_[offset + length] : 0;
    Status w = t.Write(Range(offset, length), src);
    ASSERT_TRUE(w.ok()) << w.ToString();
    ASSERT_EQ(std::memcmp(segment_.data() + offset, src.data(), length), 0);
    if (offset > 0) {
      EXPECT_EQ(segment_[offset - 1], before);
    }
    if (offset + length < kSegSize) {
      EXPECT_EQ(segment_[offset + length], after);
    }
    std::vector<std::byte> dst(length, std::byte{0xEE});
    Status r = t.Read(Range(offset, length), dst);
    ASSERT_TRUE(r.ok()) << r.ToString();
    ASSERT_TRUE(dst == src);
  }

  std::vector<uint8_t> segment_;
  std::unique_ptr<DataServer> server_;
  std::string endpoint_;
};

TEST_F(TcpTransportTest, RoundTripsOfAllSizes) {
  TcpTransport t;
  uint64_t seed = 1;
  for (uint64_t size : {uint64_t{1}, 4 * kKiB, kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB}) {
    RoundTrip(t, 12345, size, seed++);
  }
  EXPECT_GT(t.IdleConnections(endpoint_), 1u) << "striped requests should have used the pool";
  EXPECT_LE(t.IdleConnections(endpoint_), 4u);
  EXPECT_TRUE(t.Ping(endpoint_).ok());
}

// Waiting awake for answers (spin_wait_us) changes when the caller looks, never what it gets:
// every size round-trips exactly, and a node that never answers still fails: a spin asked longer
// than io_timeout_ms is cut to it, and the blocking receive's timeout follows (at most twice it).
TEST_F(TcpTransportTest, SpinningWaitersGetExactBytesAndStillTimeOut) {
  TcpTransport::Options options;
  options.spin_wait_us = 1000;
  TcpTransport t(options);
  uint64_t seed = 7;
  for (uint64_t size : {uint64_t{1}, 4 * kKiB, 64 * kKiB, kMiB, 4 * kMiB, 16 * kMiB}) {
    RoundTrip(t, 4096, size, seed++);
  }
  FakeServer silent([](int) {});
  options.io_timeout_ms = 300;
  options.spin_wait_us = 5'000'000;  // 5 s asked: 300 ms spun
  TcpTransport quiet(options);
  std::vector<std::byte> buf(4096);
  const auto start = Clock::now();
  Status s = quiet.Read(RemoteRange{silent.endpoint(), kToken, 0, buf.size()}, buf);
  EXPECT_EQ(s.code(), ErrorCode::TRANSFER_FAIL);
  EXPECT_NE(s.message().find("timed out"), std::string::npos) << s.ToString();
  EXPECT_GE(SecondsSince(start), 0.25);
  EXPECT_LT(SecondsSince(start), 2.0);
}

TEST_F(TcpTransportTest, StripedWithUnevenLastChunk) {
  const TcpTransport::Options options = Striped64KiB(3);
  TcpTransport t(options);
  RoundTrip(t, 7, kMiB + 123, 42);  // 17 chunks, the last one short, over 3 lanes
  RoundTrip(t, kSegSize - 100 * kKiB, 100 * kKiB, 43);  // 2 chunks, ends at the segment's end
  EXPECT_LE(t.IdleConnections(endpoint_), 3u);
}

// Read and Write hash the range as it moves: the digest must be exactly that of the bytes, in
// order, whether the range goes on one connection or striped over several (chunks arrive out
// of order then), with an uneven last chunk.
TEST_F(TcpTransportTest, ChecksumWhileMovingHashesExactlyTheRangeInOrder) {
  TcpTransport::Options striped_small;
  striped_small.stripe_threshold = 64 * kKiB;
  striped_small.stripe_chunk = 64 * kKiB;
  striped_small.connections_per_endpoint = 3;
  TcpTransport plain;
  TcpTransport striped(striped_small);
  uint64_t seed = 500;
  for (TcpTransport* t : {&plain, &striped}) {
    for (uint64_t size : {uint64_t{1}, 300 * kKiB + 5, kMiB + 123, 4 * kMiB, 16 * kMiB + 1}) {
      SCOPED_TRACE("size " + std::to_string(size) + (t == &striped ? " striped" : ""));
      std::vector<std::byte> src(size);
      FillRandom(src, seed++);
      const uint64_t want = Checksum(std::span<const std::byte>(src));
      ChecksumStream put_sum;
      ASSERT_TRUE(t->Write(Range(999, size), src, &put_sum).ok());
      EXPECT_EQ(put_sum.Digest(), want);
      std::vector<std::byte> dst(size, std::byte{0xEE});
      ChecksumStream get_sum;
      Status r = t->Read(Range(999, size), dst, &get_sum);
      ASSERT_TRUE(r.ok()) << r.ToString();
      EXPECT_EQ(get_sum.Digest(), want);
      EXPECT_TRUE(dst == src);
    }
  }
}

// A node that promises a payload, sends part of it and stalls: the blocking receive of a
// one-connection read gives up after io_timeout_ms, it never waits forever.
TEST_F(TcpTransportTest, PayloadStalledMidwayTimesOut) {
  FakeServer staller([](int fd) {
    transfer::RequestHeader req;
    if (recv(fd, &req, sizeof(req), MSG_WAITALL) != sizeof(req)) return;
    transfer::ResponseHeader rh;
    rh.request_id = req.request_id;
    rh.length = req.length;
    send(fd, &rh, sizeof(rh), MSG_NOSIGNAL);
    std::vector<char> half(req.length / 2, 'x');
    send(fd, half.data(), half.size(), MSG_NOSIGNAL);  // then silence, connection open
  });
  TcpTransport::Options options;
  options.io_timeout_ms = 300;
  TcpTransport t(options);
  std::vector<std::byte> buf(kMiB);
  const auto start = Clock::now();
  Status s = t.Read(RemoteRange{staller.endpoint(), kToken, 0, buf.size()}, buf);
  EXPECT_EQ(s.code(), ErrorCode::TRANSFER_FAIL) << s.ToString();
  EXPECT_NE(s.message().find("no progress for 300 ms"), std::string::npos) << s.ToString();
  EXPECT_GE(SecondsSince(start), 0.25);
  EXPECT_LT(SecondsSince(start), 2.0);
  EXPECT_EQ(t.IdleConnections(staller.endpoint()), 0u);
}

TEST_F(TcpTransportTest, ConcurrentReadersAndWritersFromEightThreads) {
  TcpTransport::Options options;
  options.stripe_threshold = 2 * kMiB;
  TcpTransport t(options);
  constexpr int kThreads = 8;
  constexpr uint64_t kRegion = 8 * kMiB;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const uint64_t sizes[] = {4 * kKiB, kMiB, 3 * kMiB + 5, 8 * kMiB};
      for (int iter = 0; iter < 8; ++iter) {
        uint64_t size = sizes[(i + iter) % 4];
        uint64_t offset = i * kRegion + (kRegion - size) / 2;
        std::vector<std::byte> src(size);
        FillRandom(src, 1000 + i * 100 + iter);
        std::vector<std::byte> dst(size);
        if (!t.Write(Range(offset, size), src).ok() || !t.Read(Range(offset, size), dst).ok() ||
            dst != src) {
          failures++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(TcpTransportTest, ServerStoppedMidUseFailsWithoutHanging) {
  TcpTransport::Options options;
  options.io_timeout_ms = 5000;
  TcpTransport t(options);
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0};
  auto worker = std::async(std::launch::async, [&] {
    std::vector<std::byte> buf(16 * kMiB);
    int ok = 0;
    while (!stop) {
      Status s = t.Read(Range(0, buf.size()), buf);
      if (!s.ok()) return std::make_pair(ok, s);
      ++ok;
      ++reads;
    }
    return std::make_pair(ok, Status::Ok());
  });
  // Stop only once reads are flowing (a loaded machine under ASan may need more than 100 ms).
  for (int i = 0; i < 1000 && reads.load() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto stopped_at = Clock::now();
  server_->Stop();
  ASSERT_EQ(worker.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto [ok, status] = worker.get();
  stop = true;
  EXPECT_GT(ok, 0) << "reads before the stop should have worked";
  EXPECT_EQ(status.code(), ErrorCode::TRANSFER_FAIL) << status.ToString();
  EXPECT_LT(SecondsSince(stopped_at), 2.0);
  // And later calls fail fast (connection refused), never partial success.
  std::vector<std::byte> small(4096);
  const auto again = Clock::now();
  EXPECT_EQ(t.Read(Range(0, 4096), small).code(), ErrorCode::TRANSFER_FAIL);
  EXPECT_EQ(t.Write(Range(0, 4096), small).code(), ErrorCode::TRANSFER_FAIL);
  EXPECT_EQ(t.Ping(endpoint_).code(), ErrorCode::TRANSFER_FAIL);
  EXPECT_LT(SecondsSince(again), 1.0);
}

TEST_F(TcpTransportTest, PooledConnectionsSurviveANodeRestart) {
  TcpTransport t;
  std::vector<std::byte> buf(64 * kKiB);
  ASSERT_TRUE(t.Read(Range(0, buf.size()), buf).ok());
  ASSERT_EQ(t.IdleConnections(endpoint_), 1u);
  const uint16_t port = server_->port();
  server_->Stop();
  StartServer(port);  // same endpoint; the pooled connection is dead
  FillRandom(buf, 5);
  Status s = t.Write(Range(0, buf.size()), buf);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(std::memcmp(segment_.data(), buf.data(), buf.size()), 0);
}

// After a node restart every pooled connection is dead, and one used in the last 100 ms is taken
// unprobed: a STAGE_INFO's retry (as a DISK_READ's) probes them all rather than taking the next
// dead one, and reaches the restarted node.
TEST_F(TcpTransportTest, ARetryAfterANodeRestartProbesEveryPooledConnection) {
  const TcpTransport::Options options = Striped64KiB(4);
  TcpTransport t(options);
  std::vector<std::byte> buf(512 * kKiB);
  ASSERT_TRUE(t.Read(Range(0, buf.size()), buf).ok());
  ASSERT_GE(t.IdleConnections(endpoint_), 2u);
  const uint16_t port = server_->port();
  server_->Stop();
  StartServer(port);  // same endpoint; every pooled connection is dead
  auto info = t.StageInfo(endpoint_);
  EXPECT_NE(info.status().code(), ErrorCode::TRANSFER_FAIL) << info.status().ToString();
}

// A pooled connection that passes the liveness probe but dies before answering (the node went
// away between probe and request) is replaced once; a fresh connection that dies is an error.
TEST_F(TcpTransportTest, DeadPooledConnectionIsReplacedOnceNotForever) {
  std::atomic<int> connections{0};
  std::atomic<bool> fresh_ones_die{false};
  auto answer = [](int fd) {
    transfer::RequestHeader req;
    if (recv(fd, &req, sizeof(req), MSG_WAITALL) != sizeof(req)) return false;
    transfer::ResponseHeader rh;
    rh.request_id = req.request_id;
    return send(fd, &rh, sizeof(rh), MSG_NOSIGNAL) == sizeof(rh);
  };
  FakeServer flaky([&](int fd) {
    int n = connections++;
    if (n == 0 || !fresh_ones_die) answer(fd);  // the first connection answers one ping...
    transfer::RequestHeader req;
    recv(fd, &req, sizeof(req), MSG_WAITALL);  // ...then takes the next request and hangs up
    shutdown(fd, SHUT_RDWR);
  });
  TcpTransport t;
  ASSERT_TRUE(t.Ping(flaky.endpoint()).ok());
  ASSERT_EQ(t.IdleConnections(flaky.endpoint()), 1u);
  Status s = t.Ping(flaky.endpoint());
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(connections.load(), 2);

  fresh_ones_die = true;  // the pooled second connection dies, and so does its replacement
  s = t.Ping(flaky.endpoint());
  EXPECT_EQ(s.code(), ErrorCode::TRANSFER_FAIL) << s.ToString();
  EXPECT_EQ(connections.load(), 3) << "exactly one replacement, no retry loop";
}

TEST_F(TcpTransportTest, UnreachableEndpointFailsWithinConnectTimeout) {
  TcpTransport::Options options;
  options.connect_timeout_ms = 300;
  TcpTransport t(options);
  std::vector<std::byte> buf(16);
  // A closed port is refused at once.
  RemoteRange closed{"127.0.0.1:" + std::to_string(ClosedPort()), kToken, 0, 16};
  auto start = Clock::now();
  EXPECT_EQ(t.Read(closed, buf).code(), ErrorCode::TRANSFER_FAIL);
  EXPECT_LT(SecondsSince(start), 1.0);
  // A black-holed address either times out at connect_timeout_ms or is unreachable at once.
  RemoteRange blackhole{"10.255.255.1:9", kToken, 0, 16};
  start = Clock::now();
  Status s = t.Read(blackhole, buf);
  EXPECT_EQ(s.code(), ErrorCode::TRANSFER_FAIL) << s.ToString();
  EXPECT_LT(SecondsSince(start), 1.5);
  EXPECT_NE(s.message().find("10.255.255.1:9"), std::string::npos) << s.ToString();
  // Malformed endpoints are the caller's mistake.
  EXPECT_EQ(t.Ping("no-port").code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(t.Ping("127.0.0.1:99999").code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(t.Ping("127.0.0.1:").code(), ErrorCode::INVALID_PARAMS);
}

// A listener that never accepts and whose accept queue is full drops new SYNs, so connect()
// hangs: the transport must give up at connect_timeout_ms.
TEST_F(TcpTransportTest, ConnectTimeoutIsEnforced) {
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 0), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::vector<int> fillers;
  bool full = false;
  for (int i = 0; i < 8 && !full; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    fillers.push_back(fd);
    connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    pollfd pfd{fd, POLLOUT, 0};
    full = poll(&pfd, 1, 100) == 0;  // this one did not complete: the queue is full
  }
  if (full) {
    TcpTransport::Options options;
    options.connect_timeout_ms = 300;
    TcpTransport t(options);
    const std::string endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    const auto start = Clock::now();
    Status s = t.Ping(endpoint);
    EXPECT_EQ(s.code(), ErrorCode::TRANSFER_FAIL);
    EXPECT_NE(s.message().find("connect timed out after 300 ms"), std::string::npos)
        << s.ToString();
    EXPECT_GE(SecondsSince(start), 0.25);
    EXPECT_LT(SecondsSince(start), 1.5);
  }
  for (int fd : fillers) close(fd);
  close(listener);
  if (!full) GTEST_SKIP() << "could not fill the accept queue on this kernel";
}

TEST_F(TcpTransportTest, StalledServerTimesOut) {
  // Accepts, reads nothing, answers nothing.
  FakeServer silent([](int) {});
  TcpTransport::Options options;
  options.io_timeout_ms = 300;
  TcpTransport t(options);
  std::vector<std::byte> buf(4096);
  auto start = Clock::now();
  Status s = t.Read(RemoteRange{silent.endpoint(), kToken, 0, buf.size()}, buf);
  EXPECT_EQ(s.code(), ErrorCode::TRANSFER_FAIL);
  EXPECT_NE(s.message().find("timed out"), std::string::npos) << s.ToString();
  EXPECT_GE(SecondsSince(start), 0.25);
  EXPECT_LT(SecondsSince(start), 2.0);
  // A large write blocks in send once the socket buffers fill; it times out too.
  std::vector<std::byte> big(32 * kMiB);
  start = Clock::now();
  EXPECT_EQ(t.Write(RemoteRange{silent.endpoint(), kToken, 0, big.size()}, big).code(),
            ErrorCode::TRANSFER_FAIL);
  EXPECT_LT(SecondsSince(start), 3.0);
}

// An I/O timeout of 0 counts as 1 ms (a zero SO_RCVTIMEO would wait forever): a silent node
// fails the read at once, not when the node hangs up 3 s later.
TEST_F(TcpTransportTest, AZeroIoTimeoutStillTimesOut) {
  FakeServer silent([](int fd) {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    shutdown(fd, SHUT_RDWR);
  });
  TcpTransport::Options options;
  options.io_timeout_ms = 0;
  TcpTransport t(options);
  std::vector<std::byte> buf(4096);
  const auto start = Clock::now();
  Status s = t.Read(RemoteRange{silent.endpoint(), kToken, 0, buf.size()}, buf);
  EXPECT_EQ(s.code(), ErrorCode::TRANSFER_FAIL) << s.ToString();
  EXPECT_NE(s.message().find("timed out"), std::string::npos) << s.ToString();
  EXPECT_LT(SecondsSince(start), 2.0);
}

TEST_F(TcpTransportTest, GarbageResponseIsTransferFail) {
  FakeServer liar([](int fd) {
    char req[sizeof(transfer::RequestHeader)];
    if (recv(fd, req, sizeof(req), MSG_WAITALL) != sizeof(req)) return;
    transfer::ResponseHeader rh;
    rh.magic = 0x0BADF00D;
    send(fd, &rh, sizeof(rh), MSG_NOSIGNAL);
  });
  FakeServer short_reader([](int fd) {
    transfer::RequestHeader req;
    if (recv(fd, &req, sizeof(req), MSG_WAITALL) != sizeof(req)) return;
    transfer::ResponseHeader rh;
    rh.request_id = req.request_id;
    rh.length = req.length;
    send(fd, &rh, sizeof(rh), MSG_NOSIGNAL);
    send(fd, "abc", 3, MSG_NOSIGNAL);  // promises the payload, sends 3 bytes, hangs up
    shutdown(fd, SHUT_RDWR);
  });
  TcpTransport t;
  std::vector<std::byte> buf(4096);
  EXPECT_EQ(t.Read(RemoteRange{liar.endpoint(), kToken, 0, buf.size()}, buf).code(),
            ErrorCode::TRANSFER_FAIL);
  EXPECT_EQ(t.Ping(liar.endpoint()).code(), ErrorCode::TRANSFER_FAIL);
  Status s = t.Read(RemoteRange{short_reader.endpoint(), kToken, 0, buf.size()}, buf);
  EXPECT_EQ(s.code(), ErrorCode::TRANSFER_FAIL);
  EXPECT_NE(s.message().find("after 3 payload bytes"), std::string::npos) << s.ToString();
  EXPECT_EQ(t.IdleConnections(liar.endpoint()), 0u) << "broken connections must not be pooled";
}

TEST_F(TcpTransportTest, BufferSizeMismatchIsInvalidParams) {
  TcpTransport t;
  std::vector<std::byte> buf(100);
  EXPECT_EQ(t.Read(Range(0, 101), buf).code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(t.Write(Range(0, 99), buf).code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(server_->stats().requests, 0u) << "nothing may be sent for a bad call";
  EXPECT_EQ(t.Read(Range(UINT64_MAX - 10, 100), buf).code(), ErrorCode::INVALID_PARAMS);
}

TEST_F(TcpTransportTest, ServerRefusalSurfacesItsCode) {
  TcpTransport t;
  std::vector<std::byte> small(4096);
  Status stale = t.Read(Range(0, small.size(), kToken + 1), small);
  EXPECT_EQ(stale.code(), ErrorCode::SEGMENT_NOT_FOUND) << stale.ToString();
  EXPECT_EQ(t.Write(Range(kSegSize - 100, small.size()), small).code(), ErrorCode::INVALID_PARAMS);
  // A striped request refused on every chunk reports the node's code too.
  std::vector<std::byte> big(16 * kMiB);
  EXPECT_EQ(t.Write(Range(0, big.size(), kToken + 1), big).code(), ErrorCode::SEGMENT_NOT_FOUND);
  EXPECT_EQ(t.Read(Range(kSegSize - 8 * kMiB, big.size()), big).code(), ErrorCode::INVALID_PARAMS);
  EXPECT_GE(t.IdleConnections(endpoint_), 1u) << "a refusal keeps the connection usable";
  EXPECT_EQ(server_->stats().rejected_frames, 0u);
  RoundTrip(t, 0, small.size(), 9);
}

TEST_F(TcpTransportTest, DropEndpointClosesIdleConnections) {
  TcpTransport t;
  ASSERT_TRUE(t.Ping(endpoint_).ok());
  EXPECT_EQ(t.IdleConnections(endpoint_), 1u);
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (server_->stats().open_connections != 1 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  t.DropEndpoint(endpoint_);
  EXPECT_EQ(t.IdleConnections(endpoint_), 0u);
  while (server_->stats().open_connections != 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(server_->stats().open_connections, 0u);
  EXPECT_TRUE(t.Ping(endpoint_).ok());  // usable again afterwards
}

// A striped read whose one chunk is torn midway (the node hangs up after half of it) while the
// other chunks arrive whole on other connections: the read fails, it never reports success.
TEST_F(TcpTransportTest, StripedReadWithOneTornChunkFails) {
  TcpTransport::Options options;
  options.stripe_threshold = 256 * kKiB;
  options.stripe_chunk = 256 * kKiB;
  options.connections_per_endpoint = 4;
  for (uint64_t bad : {uint64_t{0}, 5 * 256 * kKiB, 15 * 256 * kKiB}) {  // first, middle, last
    SCOPED_TRACE("torn chunk at " + std::to_string(bad));
    std::unique_ptr<TcpTransport> t = std::make_unique<TcpTransport>(options);
    StripeFakeNode node(bad, /*hang_up=*/true);
    std::vector<std::byte> buf(4 * kMiB);
    ChecksumStream sum;
    Status s = t->Read(RemoteRange{node.endpoint(), kToken, 0, buf.size()}, buf, &sum);
    EXPECT_EQ(s.code(), ErrorCode::TRANSFER_FAIL) << s.ToString();
    EXPECT_EQ(node.bad_requests(), 1);
    t.reset();  // closes the pooled connections before the node joins its handlers
  }
}

// One chunk of a striped read stalls midway with its connection open: the read gives up after
// io_timeout_ms of no progress on that connection, however well the other chunks went.
TEST_F(TcpTransportTest, StripedReadWithOneStalledChunkTimesOut) {
  TcpTransport::Options options;
  options.stripe_threshold = 256 * kKiB;
  options.stripe_chunk = 256 * kKiB;
  options.connections_per_endpoint = 4;
  options.io_timeout_ms = 300;
  auto t = std::make_unique<TcpTransport>(options);
  StripeFakeNode node(3 * 256 * kKiB, /*hang_up=*/false);
  std::vector<std::byte> buf(4 * kMiB);
  const auto start = Clock::now();
  Status s = t->Read(RemoteRange{node.endpoint(), kToken, 0, buf.size()}, buf);
  EXPECT_EQ(s.code(), ErrorCode::TRANSFER_FAIL) << s.ToString();
  EXPECT_NE(s.message().find("no progress for 300 ms"), std::string::npos) << s.ToString();
  EXPECT_GE(SecondsSince(start), 0.25);
  EXPECT_LT(SecondsSince(start), 2.0);
  t.reset();
}

// The striped read's lanes land every chunk where it belongs: byte i of the range is the low
// byte of its offset, with an uneven last chunk, and the in-order hash matches.
TEST_F(TcpTransportTest, StripedReadPlacesEveryChunkAndHashesInOrder) {
  const TcpTransport::Options options = Striped64KiB(4);
  auto t = std::make_unique<TcpTransport>(options);
  StripeFakeNode node(UINT64_MAX, /*hang_up=*/true);
  const uint64_t offset = 1000;
  std::vector<std::byte> buf(3 * kMiB + 777, std::byte{0xEE});
  ChecksumStream sum;
  Status s = t->Read(RemoteRange{node.endpoint(), kToken, offset, buf.size()}, buf, &sum);
  ASSERT_TRUE(s.ok()) << s.ToString();
  size_t wrong = 0;
  for (uint64_t i = 0; i < buf.size(); ++i) {
    wrong += buf[i] != static_cast<std::byte>(offset + i);
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(sum.Digest(), Checksum(std::span<const std::byte>(buf)));
  t.reset();
}

}  // namespace
}  // namespace granary
