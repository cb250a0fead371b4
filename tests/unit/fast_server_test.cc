// The master's fast port in process: a connection over the cap is refused before anything is
// read, and the client takes that as "not sent" (so it may use gRPC) instead of a failed call;
// a reply larger than a request frame still reaches the client; a header alone costs the master
// no more than a small buffer.
#include "master/fast_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <vector>

#include "client/fast_channel.h"
#include "master/evictor.h"
#include "master/master_service.h"
#include "master/master_state.h"

namespace granary::master {
namespace {

class FastServerTest : public ::testing::Test {
 protected:
  FastServerTest()
      : state_(MasterPolicy{}, WallClock::Instance()), evictor_(&state_),
        service_(&state_, &evictor_, &metrics_) {}

  MasterState state_;
  Evictor evictor_;
  MetricsRegistry metrics_;
  MasterService service_;
};

TEST_F(FastServerTest, OverTheCapIsRefusedBeforeAnyRequestIsRead) {
  FastServer::Options options;
  options.max_connections = 1;
  FastServer server(&service_, &metrics_, options);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());

  proto::BatchExistRequest req;
  req.add_keys("k");
  proto::BatchExistResponse resp;
  client::FastChannel first("127.0.0.1", server.port(), 5000);
  bool sent = false;
  ASSERT_TRUE(first.Call(fast::Method::kExist, req, &resp, true, &sent).ok());
  EXPECT_TRUE(sent);
  ASSERT_EQ(resp.results_size(), 1);
  EXPECT_EQ(resp.results(0), 0);

  // `first` keeps its connection pooled: a second channel is one too many.
  client::FastChannel second("127.0.0.1", server.port(), 5000);
  proto::BatchPutStartRequest put;
  put.set_client_id("c");
  put.add_keys("k");
  put.add_sizes(1);
  proto::BatchPutStartResponse started;
  Status s = second.Call(fast::Method::kPutStart, put, &started, false, &sent);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(sent) << "a refused connection never carried the request";
  EXPECT_EQ(state_.pending_count(), 0u) << "nothing was applied";

  // The first connection still serves.
  ASSERT_TRUE(first.Call(fast::Method::kExist, req, &resp, true, &sent).ok());
  server.Stop();
}

// A small request can have a reply over the request cap (16 MiB): the master applies the call
// before the reply is sized, so a client that refused it would report a failure for a put that
// happened.
TEST_F(FastServerTest, AReplyOverTheRequestCapReachesTheClient) {
  // Long names (within their limits) make every replica in the reply large: ~2.2 KiB per key.
  const std::string node(1000, 'n'), segment(200, 's'), endpoint(1000, 'e');
  Status mounted = state_.Mount({node, {segment, 1ull << 30, endpoint, "", "", 0, true}}).status;
  ASSERT_TRUE(mounted.ok()) << mounted.ToString();
  FastServer server(&service_, &metrics_);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());

  proto::BatchPutStartRequest put;
  put.set_client_id("writer");
  constexpr int kKeys = 9000;
  for (int i = 0; i < kKeys; ++i) {
    put.add_keys("k" + std::to_string(i));
    put.add_sizes(1);
  }
  ASSERT_LT(put.ByteSizeLong(), fast::kMaxFastBody);
  client::FastChannel ch("127.0.0.1", server.port(), 20'000);
  proto::BatchPutStartResponse started;
  bool sent = false;
  Status s = ch.Call(fast::Method::kPutStart, put, &started, false, &sent);
  EXPECT_EQ(state_.pending_count(), static_cast<uint64_t>(kKeys)) << "the master applied the call";
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(started.ByteSizeLong(), fast::kMaxFastBody) << "the reply did not exceed the cap";
  ASSERT_EQ(started.results_size(), kKeys);
  EXPECT_EQ(started.results(kKeys - 1).code(), 0);
  server.Stop();
}

// Resident memory of this process, bytes.
size_t Resident() {
  std::ifstream statm("/proc/self/statm");
  size_t total = 0, resident = 0;
  statm >> total >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

// A header announcing the largest body, and one byte of it, must not make the master allocate
// that body: peers could hold 16 MiB each with 17 bytes.
TEST_F(FastServerTest, AHeaderAloneDoesNotAllocateItsBody) {
  FastServer server(&service_, &metrics_);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  const size_t before = Resident();
  constexpr int kPeers = 8;
  std::vector<int> fds;
  for (int i = 0; i < kPeers; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(server.port());
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    unsigned char h[fast::kHeaderSize];
    fast::EncodeHeader({static_cast<uint8_t>(fast::Method::kExist), 0, 1, fast::kMaxFastBody}, h);
    ASSERT_EQ(::send(fd, h, sizeof(h), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(h)));
    fds.push_back(fd);
  }
  // Then, once the headers were read on their own, the first byte of each body.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int fd : fds) ASSERT_EQ(::send(fd, "x", 1, MSG_NOSIGNAL), 1);
  // The connections' threads read the headers within milliseconds; watch for a while.
  size_t peak = before;
  for (int i = 0; i < 20; ++i) {  // bounded: 1 s
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    peak = std::max(peak, Resident());
  }
  const size_t grown = peak > before ? peak - before : 0;
  EXPECT_LT(grown, size_t{32} << 20) << "headers and a byte made the master hold " << (grown >> 20)
                                     << " MiB (" << kPeers << " peers)";
  for (int fd : fds) ::close(fd);
  server.Stop();
}

}  // namespace
}  // namespace granary::master
