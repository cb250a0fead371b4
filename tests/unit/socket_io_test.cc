// common/socket_io.h against its promises: every step returns by its deadline (a peer that never
// reads or writes costs a timeout, never a hang), a closed peer is RPC_FAIL, blocking descriptors
// behave like non-blocking ones, and ConnectTcp fails fast on a closed port and hands back a
// non-blocking TCP_NODELAY socket.
#include "common/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

namespace granary::net {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class SocketIoPair : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0);
  }
  void TearDown() override {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  void CloseWriter() {
    ::close(fds_[0]);
    fds_[0] = -1;
  }
  int fds_[2] = {-1, -1};
};

// A listening TCP socket on 127.0.0.1 with a free port.
struct Listener {
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd, 16), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  ~Listener() {
    if (fd >= 0) ::close(fd);
  }
  int fd = -1;
  uint16_t port = 0;
};

TEST(SocketIo, MillisLeftRoundsUpAndStopsAtZero) {
  EXPECT_EQ(MillisLeft(Clock::now() - 1s), 0);
  EXPECT_EQ(MillisLeft(Clock::now()), 0);
  const int left = MillisLeft(Clock::now() + 1500us);
  EXPECT_GE(left, 1);
  EXPECT_LE(left, 2);
  EXPECT_GT(MillisLeft(Clock::now() + 10s), 9000);
  // Far deadlines do not overflow poll()'s int.
  EXPECT_GT(MillisLeft(Clock::now() + std::chrono::hours(24 * 365 * 100)), 0);
}

TEST_F(SocketIoPair, WaitForIsBoundedByItsDeadline) {
  auto start = Clock::now();
  EXPECT_FALSE(WaitFor(fds_[1], POLLIN, start + 50ms));
  EXPECT_GE(Clock::now() - start, 45ms);
  EXPECT_LT(Clock::now() - start, 1s);
  ASSERT_EQ(::send(fds_[0], "x", 1, MSG_NOSIGNAL), 1);
  EXPECT_TRUE(WaitFor(fds_[1], POLLIN, Clock::now() + 1s));
  EXPECT_FALSE(WaitFor(fds_[1], POLLIN, Clock::now() - 1s)) << "a passed deadline: no wait";
}

TEST_F(SocketIoPair, SendAllToAPeerThatNeverReadsTimesOut) {
  const std::string big(64 << 20, 'x');  // far over the socket buffers
  const auto start = Clock::now();
  Status s = SendAll(fds_[0], big, start + 100ms);
  const auto took = Clock::now() - start;
  EXPECT_EQ(s.code(), ErrorCode::RPC_TIMEOUT) << s.ToString();
  EXPECT_GE(took, 95ms);
  EXPECT_LT(took, 1s);
}

TEST_F(SocketIoPair, RecvExactFromAPeerThatNeverWritesTimesOut) {
  char buf[16];
  auto start = Clock::now();
  Status s = RecvExact(fds_[1], buf, sizeof(buf), start + 80ms);
  EXPECT_EQ(s.code(), ErrorCode::RPC_TIMEOUT) << s.ToString();
  EXPECT_GE(Clock::now() - start, 75ms);
  EXPECT_LT(Clock::now() - start, 1s);
  // Part of it, then silence: still a timeout, not a short read.
  ASSERT_EQ(::send(fds_[0], "12345", 5, MSG_NOSIGNAL), 5);
  start = Clock::now();
  s = RecvExact(fds_[1], buf, sizeof(buf), start + 80ms);
  EXPECT_EQ(s.code(), ErrorCode::RPC_TIMEOUT);
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST_F(SocketIoPair, BytesAlreadyThereAreTakenEvenPastTheDeadline) {
  ASSERT_EQ(::send(fds_[0], "hello", 5, MSG_NOSIGNAL), 5);
  char buf[5];
  ASSERT_TRUE(RecvExact(fds_[1], buf, 5, Clock::now() - 1s).ok());
  EXPECT_EQ(std::string(buf, 5), "hello");
  EXPECT_TRUE(SendAll(fds_[0], "room", Clock::now() - 1s).ok()) << "there is room: no wait";
  EXPECT_TRUE(SendAll(fds_[0], "", Clock::now() - 1s).ok());
  EXPECT_TRUE(RecvExact(fds_[1], buf, 0, Clock::now() - 1s).ok());
}

TEST_F(SocketIoPair, RecvExactGathersPiecesInOrder) {
  std::thread writer([&] {
    for (const char* piece : {"ab", "cde", "f"}) {
      std::this_thread::sleep_for(5ms);
      (void)::send(fds_[0], piece, std::strlen(piece), MSG_NOSIGNAL);
    }
  });
  char buf[6];
  Status s = RecvExact(fds_[1], buf, 6, Clock::now() + 5s);
  writer.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(std::string(buf, 6), "abcdef");
}

TEST_F(SocketIoPair, AClosedPeerIsRpcFail) {
  ASSERT_EQ(::send(fds_[0], "ab", 2, MSG_NOSIGNAL), 2);
  CloseWriter();
  char buf[4];
  auto start = Clock::now();
  Status s = RecvExact(fds_[1], buf, 4, start + 5s);  // two bytes, then the end
  EXPECT_EQ(s.code(), ErrorCode::RPC_FAIL) << s.ToString();
  EXPECT_LT(Clock::now() - start, 1s) << "a closed peer does not wait for the deadline";
  // Sending to a closed peer: RPC_FAIL, and no SIGPIPE kills the test.
  start = Clock::now();
  s = SendAll(fds_[1], std::string(1 << 20, 'y'), start + 5s);
  EXPECT_EQ(s.code(), ErrorCode::RPC_FAIL) << s.ToString();
  EXPECT_LT(Clock::now() - start, 1s);
}

// Blocking descriptors: the same bounds (it polls and never blocks in send/recv).
TEST_F(SocketIoPair, BlockingDescriptorsAreBoundedToo) {
  ASSERT_EQ(::fcntl(fds_[0], F_GETFL) & O_NONBLOCK, 0);
  char buf[1];
  const std::string big(64 << 20, 'z');  // built before the clock starts (slow under TSan)
  auto start = Clock::now();
  EXPECT_EQ(RecvExact(fds_[1], buf, 1, start + 60ms).code(), ErrorCode::RPC_TIMEOUT);
  EXPECT_LT(Clock::now() - start, 1s);
  start = Clock::now();
  EXPECT_EQ(SendAll(fds_[0], big, start + 60ms).code(), ErrorCode::RPC_TIMEOUT);
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST(SocketIo, LoopbackPeerThatNeverReadsTimesOut) {
  Listener listener;
  auto fd = ConnectTcp("127.0.0.1", listener.port, Clock::now() + 2s);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  const int peer = ::accept(listener.fd, nullptr, nullptr);  // accepted, never read
  ASSERT_GE(peer, 0);
  const std::string big(64 << 20, 'x');  // built before the clock starts (slow under TSan)
  const auto start = Clock::now();
  Status s = SendAll(*fd, big, start + 150ms);
  EXPECT_EQ(s.code(), ErrorCode::RPC_TIMEOUT) << s.ToString();
  EXPECT_LT(Clock::now() - start, 1s);
  char buf[1];
  EXPECT_EQ(RecvExact(*fd, buf, 1, Clock::now() + 50ms).code(), ErrorCode::RPC_TIMEOUT);
  ::close(peer);
  ::close(*fd);
}

TEST(SocketIo, ConnectTcpGivesANonBlockingNoDelaySocket) {
  Listener listener;
  auto fd = ConnectTcp("127.0.0.1", listener.port, Clock::now() + 2s);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_NE(::fcntl(*fd, F_GETFL) & O_NONBLOCK, 0);
  int nodelay = 0;
  socklen_t len = sizeof(nodelay);
  ASSERT_EQ(::getsockopt(*fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len), 0);
  EXPECT_NE(nodelay, 0);
  // It works: bytes reach the accepted peer.
  const int peer = ::accept(listener.fd, nullptr, nullptr);
  ASSERT_GE(peer, 0);
  ASSERT_TRUE(SendAll(*fd, "ping", Clock::now() + 1s).ok());
  char buf[4];
  ASSERT_TRUE(RecvExact(peer, buf, 4, Clock::now() + 1s).ok());
  EXPECT_EQ(std::string(buf, 4), "ping");
  ::close(peer);
  ::close(*fd);
  // "localhost" may list ::1 first; the IPv4 listener is still found.
  auto by_name = ConnectTcp("localhost", listener.port, Clock::now() + 2s);
  ASSERT_TRUE(by_name.ok()) << by_name.status().ToString();
  ::close(*by_name);
}

TEST(SocketIo, ConnectTcpToAClosedPortFailsFast) {
  uint16_t port = 0;
  {
    Listener gone;  // a port that was free a moment ago, now closed
    port = gone.port;
  }
  const auto start = Clock::now();
  auto fd = ConnectTcp("127.0.0.1", port, start + 5s);
  EXPECT_FALSE(fd.ok());
  EXPECT_EQ(fd.code(), ErrorCode::RPC_FAIL) << fd.status().ToString();
  EXPECT_LT(Clock::now() - start, 1s) << "a refused connection does not wait for the deadline";
  EXPECT_NE(fd.status().message().find(std::to_string(port)), std::string::npos)
      << "the message names what failed: " << fd.status().message();
}

TEST(SocketIo, ConnectTcpWithThePassedDeadlineTimesOut) {
  Listener listener;
  auto fd = ConnectTcp("127.0.0.1", listener.port, Clock::now() - 1s);
  EXPECT_FALSE(fd.ok());
  EXPECT_EQ(fd.code(), ErrorCode::RPC_TIMEOUT) << fd.status().ToString();
}

}  // namespace
}  // namespace granary::net
