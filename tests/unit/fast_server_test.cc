// The master's fast port in process: a connection over the cap is refused before anything is
// read, and the client takes that as "not sent" (so it may use gRPC) instead of a failed call;
// a reply larger than a request frame still reaches the client; a header alone costs the master
// no more than a small buffer.
#include "master/service/fast_server.h"

#include <arpa/inet.h>
#include <sys/time.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "client/fast_channel.h"
#include "common/tsan.h"
#include "master/policy/evictor.h"
#include "master/service/master_service.h"
#include "master/state/master_state.h"
#include "security/authenticator.h"
#include "security/tls.h"
#include "../test_pki.h"

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
#ifdef GRANARY_TSAN
  GTEST_SKIP() << "resident memory counts ThreadSanitizer's shadow (grown " << (grown >> 20)
               << " MiB): the bound is checked by the normal build";
#endif
  EXPECT_LT(grown, size_t{32} << 20) << "headers and a byte made the master hold " << (grown >> 20)
                                     << " MiB (" << kPeers << " peers)";
  for (int fd : fds) ::close(fd);
  server.Stop();
}

// A raw connection to the fast port, for frames the client library would never send.
int RawConnect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{5, 0};  // a missing reply fails the test instead of hanging it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

std::string RequestFrame(fast::Method method, uint32_t id, const google::protobuf::Message& m) {
  std::string frame(fast::kHeaderSize, '\0');
  fast::EncodeHeader({static_cast<uint8_t>(method), 0, id, static_cast<uint32_t>(m.ByteSizeLong())},
                     reinterpret_cast<unsigned char*>(frame.data()));
  m.AppendToString(&frame);
  return frame;
}

// Reads one reply frame; false when the connection ends first.
bool ReadReply(int fd, fast::Header* h, std::string* body) {
  auto read_exact = [fd](char* p, size_t n) {
    while (n > 0) {  // bounded by SO_RCVTIMEO: each pass reads or fails
      ssize_t got = ::recv(fd, p, n, 0);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  };
  unsigned char header[fast::kHeaderSize];
  if (!read_exact(reinterpret_cast<char*>(header), sizeof(header))) return false;
  if (fast::DecodeHeader(header, h, fast::kMaxFastReply) != fast::HeaderError::kNone) return false;
  body->resize(h->body_size);
  return read_exact(body->data(), body->size());
}

// Exist answers per key in the batch's order, whatever its keys: duplicates, an empty key, one
// at the length limit and one past it, present and absent ones (the fast port reads the keys in
// place from the request, without copying them).
TEST_F(FastServerTest, ExistAnswersEveryKeyOfAMixedBatchInOrder) {
  Status mounted = state_.Mount({"node", {"seg", 1ull << 30, "127.0.0.1:1", "", "", 0, true}}).status;
  ASSERT_TRUE(mounted.ok()) << mounted.ToString();
  const std::string longest(kMaxKeyBytes, 'k'), too_long(kMaxKeyBytes + 1, 'k');
  std::vector<std::string> stored = {"a", "b", longest};
  auto started = state_.PutStart({"w", stored, std::vector<uint64_t>(3, 4096), {}, false});
  auto ended = state_.PutEnd({"w", stored, std::vector<uint64_t>(3, 1), Gens(started)});
  for (const auto& e : ended) ASSERT_TRUE(e.ok()) << e.ToString();

  FastServer server(&service_, &metrics_);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  client::FastChannel ch("127.0.0.1", server.port(), 5000);
  const std::vector<std::string> keys = {"a", "missing", "a", "", longest, too_long, "b", "b", "c"};
  const int invalid = static_cast<int>(ErrorCode::INVALID_KEY);
  const std::vector<int32_t> want = {1, 0, 1, invalid, 1, invalid, 1, 1, 0};
  proto::BatchExistRequest req;
  for (const auto& k : keys) req.add_keys(k);
  proto::BatchExistResponse resp;
  bool sent = false;
  ASSERT_TRUE(ch.Call(fast::Method::kExist, req, &resp, true, &sent).ok());
  ASSERT_EQ(resp.results_size(), static_cast<int>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(resp.results(static_cast<int>(i)), want[i]) << "key #" << i;
  }
  EXPECT_EQ(state_.BatchExist(keys), want) << "the in-process query agrees";
  server.Stop();
}

// A key read twice in one batch holds two read locks: one finish-read releases one, the second
// the other, a third finds none; the replies come back in the batch's order.
TEST_F(FastServerTest, DuplicateKeysInAGetBatchTakeAndReleaseALockEach) {
  Status mounted = state_.Mount({"node", {"seg", 1ull << 30, "127.0.0.1:1", "", "", 0, true}}).status;
  ASSERT_TRUE(mounted.ok()) << mounted.ToString();
  std::vector<std::string> stored = {"x", "y"};
  auto started = state_.PutStart({"w", stored, {4096, 8192}, {}, false});
  (void)state_.PutEnd({"w", stored, {1, 2}, Gens(started)});

  FastServer server(&service_, &metrics_);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  client::FastChannel ch("127.0.0.1", server.port(), 5000);
  proto::BatchGetReplicaListRequest get;
  get.set_client_id("r");
  for (const char* k : {"y", "x", "y", "nope"}) get.add_keys(k);
  proto::BatchGetReplicaListResponse got;
  bool sent = false;
  ASSERT_TRUE(ch.Call(fast::Method::kGetReplicaList, get, &got, false, &sent).ok());
  ASSERT_EQ(got.results_size(), 4);
  EXPECT_EQ(got.results(0).size(), 8192u);
  EXPECT_EQ(got.results(1).size(), 4096u);
  EXPECT_EQ(got.results(2).size(), 8192u);
  EXPECT_EQ(got.results(0).replicas_size(), 1);
  EXPECT_EQ(got.results(3).code(), static_cast<int>(ErrorCode::OBJECT_NOT_FOUND));
  auto stat = state_.Stat("y");
  ASSERT_TRUE(stat.ok());
  EXPECT_EQ(stat->read_locks, 2u);

  proto::BatchFinishReadRequest fin;
  fin.set_client_id("r");
  for (const char* k : {"y", "y", "y"}) fin.add_keys(k);
  proto::BatchStatusResponse done;
  ASSERT_TRUE(ch.Call(fast::Method::kFinishRead, fin, &done, false, &sent).ok());
  ASSERT_EQ(done.results_size(), 3);
  EXPECT_EQ(done.results(0).code(), 0);
  EXPECT_EQ(done.results(1).code(), 0);
  EXPECT_EQ(done.results(2).code(), static_cast<int>(ErrorCode::LEASE_EXPIRED));
  EXPECT_EQ(state_.Stat("y")->read_locks, 0u);
  server.Stop();
}

// Frames that arrive together (pipelined) or a byte at a time are each answered once, in order,
// with their own ids: the master's reader keeps what came ahead of a frame for the next one.
TEST_F(FastServerTest, PipelinedAndTrickledFramesAreEachAnsweredInOrder) {
  FastServer server(&service_, &metrics_);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  int fd = RawConnect(server.port());
  ASSERT_GE(fd, 0);
  proto::BatchExistRequest small, large;
  small.add_keys("s");
  for (int i = 0; i < 2000; ++i) large.add_keys("key/" + std::to_string(i) + std::string(60, 'p'));
  ASSERT_GT(large.ByteSizeLong(), size_t{128} << 10) << "larger than the reader's first chunk";
  // Three frames in one send: small, large, small.
  std::string burst = RequestFrame(fast::Method::kExist, 7, small) +
                      RequestFrame(fast::Method::kExist, 8, large) +
                      RequestFrame(fast::Method::kExist, 9, small);
  ASSERT_EQ(::send(fd, burst.data(), burst.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(burst.size()));
  for (uint32_t id : {7u, 8u, 9u}) {
    fast::Header h;
    std::string body;
    ASSERT_TRUE(ReadReply(fd, &h, &body)) << "reply " << id;
    EXPECT_EQ(h.request_id, id);
    EXPECT_EQ(h.flags, fast::kReply);
    proto::BatchExistResponse resp;
    ASSERT_TRUE(resp.ParseFromString(body));
    EXPECT_EQ(resp.results_size(), id == 8 ? 2000 : 1);
  }
  // One frame, a byte per send.
  const std::string frame = RequestFrame(fast::Method::kExist, 10, small);
  for (char c : frame) ASSERT_EQ(::send(fd, &c, 1, MSG_NOSIGNAL), 1);
  fast::Header h;
  std::string body;
  ASSERT_TRUE(ReadReply(fd, &h, &body));
  EXPECT_EQ(h.request_id, 10u);
  ::close(fd);
  server.Stop();
}

// A body that does not parse closes that connection only; the next frame on another
// connection, and a good frame before it on the same one, are answered.
TEST_F(FastServerTest, ABodyThatDoesNotParseClosesOnlyItsConnection) {
  FastServer server(&service_, &metrics_);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  int bad = RawConnect(server.port());
  ASSERT_GE(bad, 0);
  proto::BatchExistRequest small;
  small.add_keys("s");
  std::string junk(fast::kHeaderSize, '\0');
  const std::string garbage = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01";  // a bad varint
  fast::EncodeHeader({static_cast<uint8_t>(fast::Method::kExist), 0, 2,
                      static_cast<uint32_t>(garbage.size())},
                     reinterpret_cast<unsigned char*>(junk.data()));
  const std::string both = RequestFrame(fast::Method::kExist, 1, small) + junk + garbage;
  ASSERT_EQ(::send(bad, both.data(), both.size(), MSG_NOSIGNAL), static_cast<ssize_t>(both.size()));
  fast::Header h;
  std::string body;
  ASSERT_TRUE(ReadReply(bad, &h, &body)) << "the good frame ahead of the bad one is answered";
  EXPECT_EQ(h.request_id, 1u);
  EXPECT_FALSE(ReadReply(bad, &h, &body)) << "then the connection is closed";
  ::close(bad);

  client::FastChannel ch("127.0.0.1", server.port(), 5000);
  proto::BatchExistResponse resp;
  bool sent = false;
  EXPECT_TRUE(ch.Call(fast::Method::kExist, small, &resp, true, &sent).ok());
  server.Stop();
}

// A calling thread reuses its frame buffers: a large reply, then a small one, then a large one
// again are each parsed whole and alone (no bytes of an earlier reply leak into a later one).
TEST_F(FastServerTest, ReplyBuffersReusedAcrossCallsOfDifferentSizes) {
  FastServer server(&service_, &metrics_);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  client::FastChannel ch("127.0.0.1", server.port(), 5000);
  proto::BatchExistRequest small, large;
  small.add_keys("");  // INVALID_KEY: a non-zero answer
  for (int i = 0; i < 20000; ++i) large.add_keys("absent/" + std::to_string(i));
  for (int round = 0; round < 3; ++round) {
    for (const auto* req : {&large, &small}) {
      proto::BatchExistResponse resp;
      bool sent = false;
      ASSERT_TRUE(ch.Call(fast::Method::kExist, *req, &resp, true, &sent).ok());
      ASSERT_EQ(resp.results_size(), req->keys_size());
      if (req == &small) {
        EXPECT_EQ(resp.results(0), static_cast<int>(ErrorCode::INVALID_KEY));
      } else {
        EXPECT_EQ(resp.results(19999), 0);
      }
    }
  }
  server.Stop();
}

}  // namespace
}  // namespace granary::master

namespace granary::master {
namespace {

// The local socket (FastServer::StartLocal): a client on this host told its name reaches the
// same calls without TCP; a name that leads nowhere (another host's, a stopped master's) falls
// back to the TCP port with nothing sent twice; the hello's secret is asked there as on TCP.
class FastLocalSocketTest : public FastServerTest {
 protected:
  void StoreOne(const std::string& key) {
    ASSERT_TRUE(state_.Mount({"node", {"seg", 1ull << 30, "127.0.0.1:1", "", "", 0, true}}).status.ok());
    auto started = state_.PutStart({"w", {key}, {4096}, {}, false});
    ASSERT_TRUE(started[0].status.ok());
    ASSERT_TRUE(state_.PutEnd({"w", {key}, {7}, {started[0].put_gen}})[0].ok());
  }
  static bool Exists(client::FastChannel& ch, const std::string& key, Status* status) {
    proto::BatchExistRequest req;
    req.add_keys(key);
    proto::BatchExistResponse resp;
    bool sent = false;
    *status = ch.Call(fast::Method::kExist, req, &resp, true, &sent);
    return status->ok() && resp.results_size() == 1 && resp.results(0) == 1;
  }
  uint64_t LocalAccepts() {
    return metrics_.AddCounter("granary_master_fast_local_connections_total", "")->Value();
  }
};

TEST_F(FastLocalSocketTest, AClientToldTheNameCallsOverIt) {
  StoreOne("k");
  FastServer server(&service_, &metrics_);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  EXPECT_FALSE(server.StartLocal().ok() && server.StartLocal().ok()) << "twice is refused";
  ASSERT_FALSE(server.local_name().empty());
  EXPECT_EQ(server.local_name().rfind("granary-fast-", 0), 0u);
  // The TCP port points nowhere: only the local socket can answer.
  client::FastChannel ch("127.0.0.1", 1, 5000, "", nullptr, server.local_name());
  Status s;
  EXPECT_TRUE(Exists(ch, "k", &s)) << s.ToString();
  EXPECT_TRUE(ch.local());
  EXPECT_EQ(LocalAccepts(), 1u);
  server.Stop();
}

TEST_F(FastLocalSocketTest, ANameThatLeadsNowhereFallsBackToTcp) {
  StoreOne("k");
  FastServer server(&service_, &metrics_);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  ASSERT_TRUE(server.StartLocal().ok());
  // Another master's name (or a stopped one's): nobody listens there.
  client::FastChannel ch("127.0.0.1", server.port(), 5000, "", nullptr,
                         "granary-fast-00000000000000000000000000000000");
  Status s;
  EXPECT_TRUE(Exists(ch, "k", &s)) << s.ToString();
  EXPECT_FALSE(ch.local()) << "the failed name is not tried again";
  EXPECT_TRUE(Exists(ch, "k", &s)) << s.ToString();
  // A name too long for an address (a hostile or corrupt answer) is no name either.
  client::FastChannel overlong("127.0.0.1", server.port(), 5000, "", nullptr,
                               std::string(200, 'x'));
  EXPECT_TRUE(Exists(overlong, "k", &s)) << s.ToString();
  EXPECT_FALSE(overlong.local());
  EXPECT_EQ(LocalAccepts(), 0u);
  server.Stop();
}

TEST_F(FastLocalSocketTest, TheSecretIsAskedOnTheLocalSocketToo) {
  StoreOne("k");
  security::Authenticator auth(std::string("right-secret-0123456789"), nullptr, "granary_test");
  FastServer server(&service_, &metrics_);
  server.set_authenticator(&auth);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  ASSERT_TRUE(server.StartLocal().ok());
  Status s;
  {
    client::FastChannel wrong("127.0.0.1", server.port(), 5000, "wrong-secret-0123456789",
                              nullptr, server.local_name());
    EXPECT_FALSE(Exists(wrong, "k", &s));
    EXPECT_EQ(s.code(), ErrorCode::UNAUTHENTICATED) << s.ToString();
    EXPECT_TRUE(wrong.local()) << "a refusal is the master's answer, not a missing socket";
  }
  {
    // A raw connection that skips the hello is answered nothing and closed.
    client::FastChannel none("127.0.0.1", server.port(), 5000, "", nullptr, server.local_name());
    EXPECT_FALSE(Exists(none, "k", &s));
  }
  EXPECT_GE(auth.refused(), 2u);
  client::FastChannel right("127.0.0.1", server.port(), 5000, "right-secret-0123456789", nullptr,
                            server.local_name());
  EXPECT_TRUE(Exists(right, "k", &s)) << s.ToString();
  EXPECT_TRUE(right.local());
  server.Stop();
}

TEST_F(FastLocalSocketTest, NoLocalSocketUnderTls) {
  char tmpl[] = "/tmp/granary-fast-tls-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  test::TestPki pki(dir);
  ASSERT_TRUE(pki.ok) << pki.error;
  auto tls = security::TlsContext::Load({pki.server.cert, pki.server.key, pki.ca},
                                        security::TlsContext::Side::kServer);
  ASSERT_TRUE(tls.ok()) << tls.status().ToString();
  FastServer server(&service_, &metrics_);
  server.set_tls(*tls);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  EXPECT_FALSE(server.StartLocal().ok()) << "a TLS master keeps every connection TLS";
  EXPECT_TRUE(server.local_name().empty());
  server.Stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace granary::master
