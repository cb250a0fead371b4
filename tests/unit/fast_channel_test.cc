// FastChannel against a fake master: a plain socket listener in the test that accepts and then
// misbehaves on purpose (never replies, replies late, trickles, closes mid-reply). Each test tries
// to break one promise of client/fast_channel.h: a call ends within about timeout_ms, is never
// sent twice unless idempotent, and never reads another call's reply.
#include "client/fast_channel.h"
#include "common/spin_wait.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "granary/proto/master.pb.h"

namespace granary::client {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// Reads exactly n bytes within timeout_ms; false on close, error or timeout.
bool ReadExactly(int fd, char* out, size_t n, int timeout_ms) {
  const auto deadline = steady_clock::now() + milliseconds(timeout_ms);
  size_t have = 0;
  while (have < n) {  // bounded by the deadline
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t r = ::recv(fd, out + have, n - have, 0);
    if (r <= 0) return false;
    have += static_cast<size_t>(r);
  }
  return true;
}

struct Request {
  fast::Header header;
  std::string body;
};

bool ReadRequest(int fd, Request* req, int timeout_ms = 5000) {
  unsigned char h[fast::kHeaderSize];
  if (!ReadExactly(fd, reinterpret_cast<char*>(h), sizeof(h), timeout_ms)) return false;
  if (fast::DecodeHeader(h, &req->header) != fast::HeaderError::kNone) return false;
  req->body.resize(req->header.body_size);
  return ReadExactly(fd, req->body.data(), req->body.size(), timeout_ms);
}

// The reply frame to `req`: an exist response whose one result is `value`.
std::string ReplyTo(const Request& req, int32_t value) {
  proto::BatchExistResponse resp;
  resp.add_results(value);
  std::string out(fast::kHeaderSize, '\0');
  fast::EncodeHeader({req.header.method, fast::kReply, req.header.request_id,
                      static_cast<uint32_t>(resp.ByteSizeLong())},
                     reinterpret_cast<unsigned char*>(out.data()));
  resp.AppendToString(&out);
  return out;
}

void SendAll(int fd, const std::string& bytes) {
  (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);  // small: one send on loopback
}

// A listener on 127.0.0.1 that runs `script(fd, index)` for each accepted connection on its own
// thread. Counts the request frames the scripts saw, so a test can tell what was sent twice.
class FakeMaster {
 public:
  using Script = std::function<void(FakeMaster* self, int fd, int index)>;
  explicit FakeMaster(Script script) : script_(std::move(script)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 16), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] {
      for (int i = 0; i < 16; ++i) {  // bounded: a test opens a few connections at most
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) return;  // the destructor shut the listener down
        accepted_++;
        std::lock_guard lock(mu_);
        fds_.push_back(fd);
        threads_.emplace_back([this, fd, i] { script_(this, fd, i); });
      }
    });
  }
  ~FakeMaster() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    std::lock_guard lock(mu_);
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);  // wakes the scripts' reads
    for (auto& t : threads_) t.join();
    for (int fd : fds_) ::close(fd);
    ::close(listen_fd_);
  }
  uint16_t port() const { return port_; }
  int accepted() const { return accepted_.load(); }
  int requests() const { return requests_.load(); }
  bool Read(int fd, Request* req) {
    if (!ReadRequest(fd, req)) return false;
    requests_++;
    return true;
  }

 private:
  Script script_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
  std::atomic<int> accepted_{0};
  std::atomic<int> requests_{0};
};

// Serves every request on the connection with `value` until the peer closes.
void ServeAll(FakeMaster* m, int fd, int32_t value) {
  Request req;
  for (int i = 0; i < 1000 && m->Read(fd, &req); ++i) SendAll(fd, ReplyTo(req, value));
}

proto::BatchExistRequest ExistOf(const std::string& key) {
  proto::BatchExistRequest req;
  req.add_keys(key);
  return req;
}

int64_t MillisSince(steady_clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(steady_clock::now() - t).count();
}

TEST(FastChannelTest, ANeverAnsweredCallEndsAtItsTimeout) {
  FakeMaster master([](FakeMaster* m, int fd, int) {
    Request req;
    m->Read(fd, &req);
    char c;
    ReadExactly(fd, &c, 1, 10'000);  // holds the connection, never replies
  });
  FastChannel ch("127.0.0.1", master.port(), 300);
  proto::BatchExistResponse resp;
  bool sent = false;
  const auto t0 = steady_clock::now();
  Status s = ch.Call(fast::Method::kExist, ExistOf("k"), &resp, true, &sent);
  const int64_t took = MillisSince(t0);
  EXPECT_EQ(s.code(), ErrorCode::RPC_TIMEOUT) << s.ToString();
  EXPECT_TRUE(sent);
  EXPECT_GE(took, 250);
  EXPECT_LT(took, 300 + 200) << "a call must end within about its timeout";
}

// A call that waits awake for its reply (spin_wait_us) gets the same replies, and a spin longer
// than the call's timeout does not stretch the call: the spin ends at the deadline.
TEST(FastChannelTest, SpinningCallsGetTheirRepliesAndKeepTheirTimeout) {
  FakeMaster serving([](FakeMaster* m, int fd, int) { ServeAll(m, fd, 42); });
  FastChannel ch("127.0.0.1", serving.port(), 5000, "", nullptr, "", /*spin_wait_us=*/1000);
  for (int i = 0; i < 20; ++i) {
    proto::BatchExistResponse resp;
    bool sent = false;
    ASSERT_TRUE(ch.Call(fast::Method::kExist, ExistOf("k" + std::to_string(i)), &resp, true, &sent)
                    .ok());
    ASSERT_EQ(resp.results_size(), 1);
    EXPECT_EQ(resp.results(0), 42);
  }
  FakeMaster silent([](FakeMaster* m, int fd, int) {
    Request req;
    m->Read(fd, &req);
    char c;
    ReadExactly(fd, &c, 1, 10'000);  // holds the connection, never replies
  });
  FastChannel slow("127.0.0.1", silent.port(), 300, "", nullptr, "", /*spin_wait_us=*/5'000'000);
  proto::BatchExistResponse resp;
  bool sent = false;
  net::ResetSpinSkipForTest();  // a slow reply above (TSan, a loaded box) may have set one
  std::atomic<bool> done{false};
  std::atomic<bool> seen_spinning{false};
  std::thread watcher([&] {  // the call does spin (where this process may spin at all)
    for (int i = 0; i < 2000 && !done.load(); ++i) {
      if (net::SpinningNow() > 0) seen_spinning = true;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  const auto t0 = steady_clock::now();
  Status s = slow.Call(fast::Method::kExist, ExistOf("k"), &resp, true, &sent);
  const int64_t took = MillisSince(t0);
  done = true;
  watcher.join();
  EXPECT_EQ(s.code(), ErrorCode::RPC_TIMEOUT) << s.ToString();
  EXPECT_GE(took, 250);
  EXPECT_LT(took, 300 + 200) << "the spin must end at the call's deadline";
  if (net::SpinQuota() > 0) EXPECT_TRUE(seen_spinning.load());
}

// Bytes that keep arriving, each just inside a per-receive timeout, must not stretch the call:
// the deadline is the call's, not each receive's.
TEST(FastChannelTest, ATrickledReplyCannotStretchTheCall) {
  FakeMaster master([](FakeMaster* m, int fd, int) {
    Request req;
    if (!m->Read(fd, &req)) return;
    const std::string reply = ReplyTo(req, 1);
    for (char c : reply) {  // bounded by the reply's size; stops once the client hangs up
      std::this_thread::sleep_for(milliseconds(450));
      if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) return;
    }
  });
  FastChannel ch("127.0.0.1", master.port(), 500);
  proto::BatchExistResponse resp;
  bool sent = false;
  const auto t0 = steady_clock::now();
  Status s = ch.Call(fast::Method::kExist, ExistOf("k"), &resp, true, &sent);
  const int64_t took = MillisSince(t0);
  EXPECT_EQ(s.code(), ErrorCode::RPC_TIMEOUT) << s.ToString();
  EXPECT_LT(took, 500 + 200) << "the trickle stretched the call";
}

// An idempotent call is retried on a new connection after its pooled one broke, but the retry
// runs on what is left of the same deadline.
TEST(FastChannelTest, ARetryRunsWithinTheSameDeadline) {
  FakeMaster master([](FakeMaster* m, int fd, int index) {
    Request req;
    if (index == 0) {
      if (!m->Read(fd, &req)) return;
      SendAll(fd, ReplyTo(req, 1));  // the first call succeeds: this connection is pooled
      if (!m->Read(fd, &req)) return;
      std::this_thread::sleep_for(milliseconds(350));
      ::shutdown(fd, SHUT_RDWR);  // then breaks without a reply
      return;
    }
    m->Read(fd, &req);  // the retry's connection: never answered
    char c;
    ReadExactly(fd, &c, 1, 10'000);
  });
  FastChannel ch("127.0.0.1", master.port(), 500);
  proto::BatchExistResponse resp;
  bool sent = false;
  ASSERT_TRUE(ch.Call(fast::Method::kExist, ExistOf("a"), &resp, true, &sent).ok());
  const auto t0 = steady_clock::now();
  Status s = ch.Call(fast::Method::kExist, ExistOf("b"), &resp, true, &sent);
  const int64_t took = MillisSince(t0);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(master.accepted(), 2) << "an idempotent call is retried on a new connection";
  EXPECT_LT(took, 500 + 200) << "connect and retry must share the call's deadline";
}

// A non-idempotent call whose connection closes halfway through the reply may have been applied:
// it fails, says so, and is not sent again on another connection.
TEST(FastChannelTest, ACallCutMidReplyIsNotSentAgainUnlessIdempotent) {
  for (bool idempotent : {false, true}) {
    SCOPED_TRACE(idempotent ? "idempotent" : "not idempotent");
    FakeMaster master([](FakeMaster* m, int fd, int index) {
      Request req;
      if (index == 0) {
        if (!m->Read(fd, &req)) return;
        SendAll(fd, ReplyTo(req, 1));  // pooled after this
        if (!m->Read(fd, &req)) return;
        const std::string reply = ReplyTo(req, 2);
        SendAll(fd, reply.substr(0, fast::kHeaderSize + 1));  // half a reply, then gone
        ::shutdown(fd, SHUT_RDWR);
        return;
      }
      ServeAll(m, fd, 3);
    });
    FastChannel ch("127.0.0.1", master.port(), 2000);
    proto::BatchExistResponse resp;
    bool sent = false;
    ASSERT_TRUE(ch.Call(fast::Method::kExist, ExistOf("a"), &resp, true, &sent).ok());
    Status s = ch.Call(fast::Method::kExist, ExistOf("b"), &resp, idempotent, &sent);
    EXPECT_TRUE(sent);
    if (idempotent) {
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(resp.results_size(), 1);
      EXPECT_EQ(resp.results(0), 3) << "the answer of the retry, not of the broken reply";
      EXPECT_EQ(master.requests(), 3);
    } else {
      EXPECT_EQ(s.code(), ErrorCode::RPC_FAIL) << s.ToString();
      EXPECT_EQ(master.requests(), 2) << "a non-idempotent call was sent twice";
      EXPECT_EQ(master.accepted(), 1);
    }
  }
}

// A reply that arrives after its call timed out is never taken for the next call's reply.
TEST(FastChannelTest, ALateReplyIsNeverReadByTheNextCall) {
  FakeMaster master([](FakeMaster* m, int fd, int index) {
    Request req;
    if (index == 0) {
      if (!m->Read(fd, &req)) return;
      std::this_thread::sleep_for(milliseconds(600));  // past the caller's 300 ms
      SendAll(fd, ReplyTo(req, 7));
      char c;
      ReadExactly(fd, &c, 1, 10'000);
      return;
    }
    ServeAll(m, fd, 8);
  });
  FastChannel ch("127.0.0.1", master.port(), 300);
  proto::BatchExistResponse resp;
  bool sent = false;
  EXPECT_EQ(ch.Call(fast::Method::kExist, ExistOf("a"), &resp, false, &sent).code(),
            ErrorCode::RPC_TIMEOUT);
  std::this_thread::sleep_for(milliseconds(500));  // the late reply is now in flight or read
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(ch.Call(fast::Method::kExist, ExistOf("b"), &resp, false, &sent).ok());
    ASSERT_EQ(resp.results_size(), 1);
    EXPECT_EQ(resp.results(0), 8);
  }
  EXPECT_EQ(master.accepted(), 2) << "the timed-out connection must not be reused";
}

// A master over its connection cap says "busy" before reading: not sent, and told apart from a
// broken channel so the caller can keep it.
TEST(FastChannelTest, BusyIsNotSentAndToldApart) {
  FakeMaster master([](FakeMaster*, int fd, int) {
    const std::string busy = "busy";
    std::string frame(fast::kHeaderSize, '\0');
    fast::EncodeHeader({0, fast::kReply | fast::kError, 0, static_cast<uint32_t>(busy.size())},
                       reinterpret_cast<unsigned char*>(frame.data()));
    SendAll(fd, frame + busy);
    ::shutdown(fd, SHUT_WR);
  });
  FastChannel ch("127.0.0.1", master.port(), 2000);
  proto::BatchExistResponse resp;
  bool sent = true;
  Status s = ch.Call(fast::Method::kExist, ExistOf("a"), &resp, false, &sent);
  EXPECT_EQ(s.code(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS) << s.ToString();
  EXPECT_FALSE(sent);
}

// getaddrinfo may list an address nobody listens on first (`localhost` -> ::1 while the master
// listens on 127.0.0.1): each address is tried in turn.
TEST(FastChannelTest, ConnectTriesEachAddressInTurn) {
  FakeMaster master([](FakeMaster* m, int fd, int) { ServeAll(m, fd, 1); });
  // A loopback port nobody listens on: bound, then closed.
  int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in dead{};
  dead.sin_family = AF_INET;
  dead.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&dead), sizeof(dead)), 0);
  socklen_t len = sizeof(dead);
  ::getsockname(probe, reinterpret_cast<sockaddr*>(&dead), &len);
  ::close(probe);
  sockaddr_in live = dead;
  live.sin_port = htons(master.port());

  addrinfo second{};
  second.ai_family = AF_INET;
  second.ai_socktype = SOCK_STREAM;
  second.ai_addr = reinterpret_cast<sockaddr*>(&live);
  second.ai_addrlen = sizeof(live);
  addrinfo first = second;
  first.ai_addr = reinterpret_cast<sockaddr*>(&dead);
  first.ai_next = &second;
  Result<int> fd = ConnectFirst(&first, steady_clock::now() + milliseconds(2000), "test");
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  ::close(*fd);
  // Only the dead address: an error, not a hang.
  first.ai_next = nullptr;
  EXPECT_FALSE(ConnectFirst(&first, steady_clock::now() + milliseconds(2000), "test").ok());
}

}  // namespace
}  // namespace granary::client
