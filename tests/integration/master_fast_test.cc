// Integration tests of the master's fast port (docs/control-path.md) against the real binaries:
// each hot call answers exactly as over gRPC; hostile frames close only their own connection;
// a client follows a restarted master and never reads a wrong byte; a master without the fast
// port still serves clients over gRPC.
#include <arpa/inet.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "client/fast_channel.h"
#include "common/byte_stream.h"
#include "granary/client.h"
#include "master_fixture.h"
#include "proto/fast_frame.h"
#include "security/fast_hello.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

using google::protobuf::util::MessageDifferencer;
using std::chrono::steady_clock;

// The value of one series of the master's /metrics (0 if absent).
double Metric(uint16_t http_port, const std::string& series) {
  HttpResult r = HttpGet(http_port, "/metrics");
  size_t at = r.body.find("\n" + series + " ");
  if (at == std::string::npos) return 0;
  return std::stod(r.body.substr(at + series.size() + 2));
}

std::string FastCalls(const std::string& method) {
  return "granary_master_fast_calls_total{method=\"" + method + "\"}";
}

// Calls one fast method and expects success.
template <typename Resp>
Resp Fast(client::FastChannel& ch, fast::Method m, const google::protobuf::Message& req) {
  Resp resp;
  bool sent = false;
  Status s = ch.Call(m, req, &resp, false, &sent);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(sent);
  return resp;
}

int Connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads until the peer closes; the bytes read, or nullopt if it stayed open past `timeout`.
std::optional<std::string> ReadUntilClosed(int fd, Millis timeout) {
  std::string got;
  const auto deadline = steady_clock::now() + timeout;
  while (steady_clock::now() < deadline) {  // bounded by the deadline
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return got;
    got.append(buf, static_cast<size_t>(n));
  }
  return std::nullopt;
}

std::string Header(uint8_t method, uint32_t body_size, uint32_t magic = fast::kMagic,
                   uint8_t version = fast::kVersion) {
  std::string h(fast::kHeaderSize, '\0');
  fast::EncodeHeader({method, 0, 7, body_size}, reinterpret_cast<unsigned char*>(h.data()));
  fast::Put32(reinterpret_cast<unsigned char*>(h.data()), magic);
  h[4] = static_cast<char>(version);
  return h;
}

class MasterFastTest : public MasterTest {
 protected:
  uint16_t FastPort() { return static_cast<uint16_t>(Client("lister").ListSegments().fast_port()); }
};

TEST_F(MasterFastTest, EveryHotCallAnswersAsOverGrpc) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 64 * MiB).code(), code::kOk);
  const uint16_t port = FastPort();
  ASSERT_NE(port, 0) << "the master advertises no fast port";
  client::FastChannel ch("127.0.0.1", port, 5000);
  pb::Master::Stub* grpc = master_.stub();
  auto same = [](const google::protobuf::Message& a, const google::protobuf::Message& b) {
    return MessageDifferencer::Equals(a, b);
  };
  // settle_ms counts down to one instant (a fresh master's first --cache-lease), so two answers
  // given a moment apart differ in it by that moment; the rest must be identical.
  auto same_status = [&](pb::BatchStatusResponse a, pb::BatchStatusResponse b) {
    const uint64_t hi = std::max(a.settle_ms(), b.settle_ms());
    const uint64_t lo = std::min(a.settle_ms(), b.settle_ms());
    if (hi - lo > 1000) return false;  // (the countdown may reach 0 between the two)
    a.clear_settle_ms();
    b.clear_settle_ms();
    return same(a, b);
  };
  auto ctx = [] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return c;
  };

  pb::PingRequest ping;
  ping.set_client_id("writer");
  pb::PingResponse ping_grpc;
  ASSERT_TRUE(grpc->Ping(ctx().get(), ping, &ping_grpc).ok());  // the first ping of a client differs
  auto ping_fast = Fast<pb::PingResponse>(ch, fast::Method::kPing, ping);
  ASSERT_TRUE(grpc->Ping(ctx().get(), ping, &ping_grpc).ok());
  EXPECT_TRUE(same(ping_fast, ping_grpc)) << ping_fast.DebugString() << ping_grpc.DebugString();

  // The same put over each path: key "fast" over the fast port, "grpc" over gRPC.
  auto start_of = [](const std::string& key) {
    pb::BatchPutStartRequest r;
    r.set_client_id("writer");
    r.add_keys(key);
    r.add_sizes(64 * KiB);
    *r.mutable_config() = Replicas(1);
    return r;
  };
  auto started_fast = Fast<pb::BatchPutStartResponse>(ch, fast::Method::kPutStart, start_of("fast"));
  pb::BatchPutStartResponse started_grpc;
  ASSERT_TRUE(grpc->BatchPutStart(ctx().get(), start_of("grpc"), &started_grpc).ok());
  ASSERT_EQ(started_fast.results_size(), 1);
  ASSERT_EQ(started_grpc.results_size(), 1);
  EXPECT_EQ(started_fast.results(0).code(), code::kOk);
  EXPECT_EQ(started_grpc.results(0).code(), code::kOk);
  ASSERT_EQ(started_fast.results(0).replicas_size(), 1);
  EXPECT_EQ(started_fast.results(0).replicas(0).length(), started_grpc.results(0).replicas(0).length());
  EXPECT_EQ(started_fast.results(0).replicas(0).segment_name(), "seg-a");
  EXPECT_NE(started_fast.results(0).put_gen(), 0u);

  // Another writer's start of a key being written: the same refusal either way.
  auto other_start = start_of("fast");
  other_start.set_client_id("other-writer");
  pb::BatchPutStartResponse again_grpc;
  ASSERT_TRUE(grpc->BatchPutStart(ctx().get(), other_start, &again_grpc).ok());
  auto again_fast = Fast<pb::BatchPutStartResponse>(ch, fast::Method::kPutStart, other_start);
  EXPECT_NE(again_fast.results(0).code(), code::kOk);
  EXPECT_TRUE(same(again_fast, again_grpc)) << again_fast.DebugString() << again_grpc.DebugString();

  // A stale generation is refused alike; the right one commits.
  auto end_of = [](const std::string& key, uint64_t gen) {
    pb::BatchPutEndRequest r;
    r.set_client_id("writer");
    r.add_keys(key);
    r.add_checksums(42);
    r.add_put_gens(gen);
    return r;
  };
  const uint64_t gen_fast = started_fast.results(0).put_gen();
  const uint64_t gen_grpc = started_grpc.results(0).put_gen();
  pb::BatchStatusResponse stale_grpc;
  ASSERT_TRUE(grpc->BatchPutEnd(ctx().get(), end_of("fast", gen_fast + 1000), &stale_grpc).ok());
  auto stale_fast = Fast<pb::BatchStatusResponse>(ch, fast::Method::kPutEnd,
                                                  end_of("fast", gen_fast + 1000));
  EXPECT_NE(stale_fast.results(0).code(), code::kOk);
  EXPECT_TRUE(same_status(stale_fast, stale_grpc)) << stale_fast.DebugString() << stale_grpc.DebugString();
  auto ended_fast = Fast<pb::BatchStatusResponse>(ch, fast::Method::kPutEnd, end_of("fast", gen_fast));
  pb::BatchStatusResponse ended_grpc;
  ASSERT_TRUE(grpc->BatchPutEnd(ctx().get(), end_of("grpc", gen_grpc), &ended_grpc).ok());
  EXPECT_EQ(ended_fast.results(0).code(), code::kOk);
  EXPECT_TRUE(same_status(ended_fast, ended_grpc)) << ended_fast.DebugString() << ended_grpc.DebugString();

  pb::BatchExistRequest exist;
  for (const char* k : {"fast", "grpc", "missing"}) exist.add_keys(k);
  pb::BatchExistResponse exist_grpc;
  ASSERT_TRUE(grpc->BatchExist(ctx().get(), exist, &exist_grpc).ok());
  auto exist_fast = Fast<pb::BatchExistResponse>(ch, fast::Method::kExist, exist);
  EXPECT_EQ(std::vector<int32_t>(exist_fast.results().begin(), exist_fast.results().end()),
            (std::vector<int32_t>{1, 1, 0}));
  EXPECT_TRUE(same(exist_fast, exist_grpc));

  pb::BatchGetReplicaListRequest get;
  get.set_client_id("reader");
  get.add_keys("fast");
  get.add_keys("missing");
  pb::BatchGetReplicaListResponse get_grpc;
  ASSERT_TRUE(grpc->BatchGetReplicaList(ctx().get(), get, &get_grpc).ok());
  auto get_fast = Fast<pb::BatchGetReplicaListResponse>(ch, fast::Method::kGetReplicaList, get);
  EXPECT_EQ(get_fast.results(0).checksum(), 42u);
  EXPECT_EQ(get_fast.results(1).code(), code::kObjectNotFound);
  EXPECT_TRUE(same(get_fast, get_grpc)) << get_fast.DebugString() << get_grpc.DebugString();

  pb::BatchFinishReadRequest fin;
  fin.set_client_id("reader");
  fin.add_keys("fast");
  auto fin_fast = Fast<pb::BatchStatusResponse>(ch, fast::Method::kFinishRead, fin);
  pb::BatchStatusResponse fin_grpc;
  ASSERT_TRUE(grpc->BatchFinishRead(ctx().get(), fin, &fin_grpc).ok());
  EXPECT_EQ(fin_fast.results(0).code(), code::kOk);
  EXPECT_TRUE(same_status(fin_fast, fin_grpc));
  EXPECT_EQ(Client("reader").Stat("fast").read_locks(), 0u) << "both locks were released";

  // Revoke: a wrong generation alike over both, then the right one over the fast port.
  auto r = Fast<pb::BatchPutStartResponse>(ch, fast::Method::kPutStart, start_of("revoked"));
  auto revoke_of = [](uint64_t gen) {
    pb::BatchPutRevokeRequest q;
    q.set_client_id("writer");
    q.add_keys("revoked");
    q.add_put_gens(gen);
    return q;
  };
  const uint64_t gen_r = r.results(0).put_gen();
  pb::BatchStatusResponse wrong_grpc;
  ASSERT_TRUE(grpc->BatchPutRevoke(ctx().get(), revoke_of(gen_r + 1000), &wrong_grpc).ok());
  auto wrong_fast = Fast<pb::BatchStatusResponse>(ch, fast::Method::kPutRevoke, revoke_of(gen_r + 1000));
  EXPECT_NE(wrong_fast.results(0).code(), code::kOk);
  EXPECT_TRUE(same_status(wrong_fast, wrong_grpc));
  auto revoked = Fast<pb::BatchStatusResponse>(ch, fast::Method::kPutRevoke, revoke_of(gen_r));
  EXPECT_EQ(revoked.results(0).code(), code::kOk);
  EXPECT_EQ(Client("reader").ExistOne("revoked"), 0);

  // The fast calls are counted on /metrics, and in the per-RPC series with the gRPC ones.
  EXPECT_EQ(Metric(master_.http_port(), FastCalls("BatchExist")), 1);
  EXPECT_EQ(Metric(master_.http_port(), FastCalls("BatchPutStart")), 3);
  EXPECT_GE(Metric(master_.http_port(), "granary_master_rpc_total{method=\"BatchExist\"}"), 2);
  // So are the cache figures: one get of {fast, missing} over each port.
  EXPECT_EQ(Metric(master_.http_port(), "granary_master_gets_total{outcome=\"memory_hit\"}"), 2);
  EXPECT_EQ(Metric(master_.http_port(), "granary_master_gets_total{outcome=\"miss\"}"), 2);
}

TEST_F(MasterFastTest, HostileFramesCloseOnlyTheirConnection) {
  ASSERT_TRUE(StartMaster());
  const uint16_t port = FastPort();
  ASSERT_NE(port, 0);
  client::FastChannel good("127.0.0.1", port, 5000);
  pb::BatchExistRequest exist;
  exist.add_keys("k");
  (void)Fast<pb::BatchExistResponse>(good, fast::Method::kExist, exist);  // a pooled connection

  const std::string garbage_body = "\x0f\xff\xff";  // field 1 with wire type 7: never parses
  struct Case {
    const char* name;
    std::string bytes;
    bool half_close;  // the sender stops sending (a frame cut short)
  } cases[] = {
      {"bad magic", "GET / HTTP/1.0\r\n\r\n", false},
      {"bad version", Header(7, 0, fast::kMagic, 99), false},
      {"oversize body", Header(7, fast::kMaxFastBody + 1), false},
      {"unknown method", Header(99, 0), false},
      {"garbage body", Header(7, 3) + garbage_body, false},
      {"truncated header", Header(7, 0).substr(0, 9), true},
      {"truncated body", Header(7, 100) + "abc", true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    int fd = Connect(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, c.bytes.data(), c.bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(c.bytes.size()));
    if (c.half_close) ::shutdown(fd, SHUT_WR);
    auto got = ReadUntilClosed(fd, Millis(3000));
    ::close(fd);
    ASSERT_TRUE(got.has_value()) << "the master kept a hostile connection open";
    const std::string name = c.name;
    if (name == "unknown method") {  // told why before the close
      ASSERT_GE(got->size(), fast::kHeaderSize);
      fast::Header h;
      ASSERT_EQ(fast::DecodeHeader(reinterpret_cast<const unsigned char*>(got->data()), &h),
                fast::HeaderError::kNone);
      EXPECT_TRUE(h.flags & fast::kError);
    } else {
      EXPECT_TRUE(got->empty()) << "no reply to a frame that is not one";
    }
    // The other connection and the master are unharmed.
    auto still = Fast<pb::BatchExistResponse>(good, fast::Method::kExist, exist);
    EXPECT_EQ(still.results_size(), 1);
  }
  // A hello, whatever it carries, is answered OK by a master without a secret, and the
  // connection goes on serving (a client given a secret works against an open master).
  {
    int hello_fd = Connect(port);
    ASSERT_GE(hello_fd, 0);
    net::ByteStream hello_conn(hello_fd, /*owns_fd=*/false);
    ASSERT_TRUE(security::PresentSecret(hello_conn, "any-secret-at-all-0123",
                                        std::chrono::steady_clock::now() + Millis(3000))
                    .ok());
    ::close(hello_fd);
    client::FastChannel with_secret("127.0.0.1", port, 5000, "any-secret-at-all-0123");
    auto answered = Fast<pb::BatchExistResponse>(with_secret, fast::Method::kExist, exist);
    EXPECT_EQ(answered.results_size(), 1);
  }
  // A frame begun and then stalled is cut at the read deadline (5 s), not held forever.
  int fd = Connect(port);
  ASSERT_GE(fd, 0);
  const std::string part = Header(7, 10).substr(0, 5);
  ASSERT_EQ(::send(fd, part.data(), part.size(), MSG_NOSIGNAL), 5);
  auto stalled = ReadUntilClosed(fd, Millis(9000));
  ::close(fd);
  EXPECT_TRUE(stalled.has_value()) << "a stalled frame kept its connection";
  EXPECT_GE(Metric(master_.http_port(), "granary_master_fast_bad_frames_total"), 6);
  ExpectServing();
}

TEST_F(MasterFastTest, DisabledFastPathAdvertisesNone) {
  ASSERT_TRUE(StartMaster({"--fast-path", "false"}));
  EXPECT_EQ(FastPort(), 0);
  ExpectServing();
}

class FastStoreTest : public StoreTest {};

std::vector<std::byte> Value(char seed, size_t n) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(seed + i * 31);
  return v;
}

TEST_F(FastStoreTest, ClientsWorkWithTheFastPathOff) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB, {{"--fast-path", "false"}}));
  auto client = cluster_.MakeClient(true);
  const auto value = Value('a', 64 * KiB);
  ASSERT_TRUE(client->Put("off/a", value).ok());
  auto got = client->Get("off/a");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, value);
  auto exists = client->Exist("off/a");
  ASSERT_TRUE(exists.ok());
  EXPECT_TRUE(*exists);
  EXPECT_EQ(Metric(cluster_.master().http_port(), FastCalls("BatchPutStart")), 0);
  EXPECT_GE(Metric(cluster_.master().http_port(), "granary_master_rpc_total{method=\"BatchPutStart\"}"), 1);
}

// On the master's host a client reaches the fast port over its local socket (the name comes
// with the fast port over gRPC); with --fast-local false it uses TCP; both read the same bytes.
// Returns the master's count of local connections after a put and a get.
double LocalConnectionsAfterAGet(StoreCluster& cluster, const std::string& fast_local) {
  EXPECT_TRUE(cluster.Start(1, 64 * MiB, {{"--fast-local", fast_local}}));
  auto client = cluster.MakeClient(true);
  if (!client) return -1;
  const auto value = Value('l', 64 * KiB);
  EXPECT_TRUE(client->Put("local/a", value).ok());
  const uint16_t http = cluster.master().http_port();
  // Calls made while another thread looks the fast port up go over gRPC (master_link.h): the
  // reservation pool's refill may be the one looking, so the first gets may; later ones not.
  EXPECT_TRUE(WaitUntil([&] {
    auto got = client->Get("local/a");
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (got.ok()) {
      EXPECT_EQ(*got, value);
    }
    return Metric(http, FastCalls("BatchGetReplicaList")) >= 1;
  }, Millis(5000), Millis(20))) << "no get went over the fast port";
  EXPECT_GE(Metric(http, "granary_master_fast_connections_total"), 1);
  return Metric(http, "granary_master_fast_local_connections_total");
}

TEST_F(FastStoreTest, ClientsOnTheMastersHostUseTheLocalSocket) {
  EXPECT_GE(LocalConnectionsAfterAGet(cluster_, "true"), 1);
}

TEST_F(FastStoreTest, WithTheLocalSocketOffClientsUseTcp) {
  EXPECT_EQ(LocalConnectionsAfterAGet(cluster_, "false"), 0);
}

TEST_F(FastStoreTest, ClientFollowsAMasterRestartAndNeverReadsWrongBytes) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  auto client = cluster_.MakeClient(true);
  const auto before = Value('b', 64 * KiB);
  ASSERT_TRUE(client->Put("restart/before", before).ok());
  auto got = client->Get("restart/before");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, before);
  // A call made while another thread of the client (the reservation refill) looks the fast
  // port up goes over gRPC, so a put's calls count once the lookup is done (bounded).
  auto fast_put_calls = [&] {
    double n = 0;
    for (const char* m : {"BatchPutStart", "BatchPutEnd", "Reserve", "BatchPutCommit"}) {
      n += Metric(cluster_.master().http_port(), FastCalls(m));
    }
    return n;
  };
  for (int i = 0; i < 20 && fast_put_calls() == 0; ++i) {
    ASSERT_TRUE(client->Put("restart/more" + std::to_string(i), before).ok());
    std::this_thread::sleep_for(Millis(100));
  }
  EXPECT_GE(fast_put_calls(), 1) << "the client did not use the fast port";

  ASSERT_TRUE(cluster_.RestartMaster());  // SIGKILL: the client's fast connections die with it
  const auto after = Value('c', 64 * KiB);
  Status put = Status(ErrorCode::INTERNAL_ERROR, "not tried");
  const auto deadline = steady_clock::now() + std::chrono::seconds(20);
  while (steady_clock::now() < deadline) {  // until the node has remounted
    put = client->Put("restart/after", after);
    if (put.ok()) break;
    std::this_thread::sleep_for(Millis(100));
  }
  ASSERT_TRUE(put.ok()) << put.ToString();
  auto old = client->Get("restart/before");  // lost with the master's memory, or intact
  if (old.ok()) {
    EXPECT_EQ(*old, before);
  }
  // Back on the fast port within the lookup backoff (1 s); every answer meanwhile is right.
  const auto fast_deadline = steady_clock::now() + std::chrono::seconds(10);
  double fast_gets = 0;
  while (steady_clock::now() < fast_deadline && fast_gets == 0) {  // bounded
    auto g = client->Get("restart/after");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(*g, after);
    fast_gets = Metric(cluster_.master().http_port(), FastCalls("BatchGetReplicaList"));
    if (fast_gets == 0) std::this_thread::sleep_for(Millis(200));
  }
  EXPECT_GT(fast_gets, 0) << "the client never found the restarted master's fast port";
}

}  // namespace
}  // namespace granary::it
