// Integration tests of the cluster's secret (docs/security.md) with real processes: a master
// started with --auth-token-file serves only callers that present it, on gRPC and on the fast
// port, counts and logs each refusal without the secret, and keeps serving legitimate clients
// and nodes while hundreds of unauthenticated connections come and go. Servers that would serve
// other hosts without a secret refuse to start.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "client/fast_channel.h"
#include "common/socket_io.h"
#include "granary/client.h"
#include "ha_fixture.h"
#include "master_fixture.h"
#include "process_harness.h"
#include "proto/fast_frame.h"
#include "proto/rpc_util.h"
#include "security_helpers.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

using namespace std::chrono_literals;

constexpr const char* kSecret = "0123456789abcdef-the-cluster-secret";
constexpr const char* kWrongSecret = "0123456789abcdef-a-guess-at-it-xx";

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_file_ = SecretFile(dir_, "secret", kSecret);
    wrong_file_ = SecretFile(dir_, "wrong", kWrongSecret);
    ASSERT_TRUE(master_.Start({"--auth-token-file", secret_file_, "--client-ttl", "3s"}));
    auto stub = StubWith(master_.address(), kSecret);
    pb::ListSegmentsResponse resp;
    ASSERT_TRUE(ListSegments(stub.get(), &resp).ok());
    fast_port_ = static_cast<uint16_t>(resp.fast_port());
    ASSERT_NE(fast_port_, 0);
  }

  // A node that presents the secret (or `extra` decides), started and mounted.
  ::testing::AssertionResult StartNode(NodeProcess* node, std::vector<std::string> extra) {
    return node->Start(master_.address(), std::move(extra));
  }

  std::unique_ptr<Client> ClientWith(const std::string& secret_file, bool shm = true) {
    ClientOptions o;
    o.master_address = master_.address();
    o.auth_token_file = secret_file;
    o.use_shared_memory = shm;
    o.rpc_timeout_ms = 5000;
    o.io_timeout_ms = 10000;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  TempDir dir_{"granary-security"};
  MasterProcess master_;
  std::string secret_file_;
  std::string wrong_file_;
  uint16_t fast_port_ = 0;
};

TEST_F(SecurityTest, GrpcCallsWithoutTheSecretAreRefusedAndCounted) {
  pb::ListSegmentsResponse resp;
  for (const std::string& presented : {std::string(), std::string(kWrongSecret)}) {
    auto stub = StubWith(master_.address(), presented);
    const grpc::Status s = ListSegments(stub.get(), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    const Status mapped = rpc::FromGrpc(s, "list segments");
    EXPECT_EQ(mapped.code(), ErrorCode::UNAUTHENTICATED) << mapped.ToString();
    EXPECT_EQ(s.error_message().find(kSecret), std::string::npos);
    EXPECT_EQ(resp.segments_size(), 0);
  }
  // A mutation is refused as well, and nothing of it is applied.
  EXPECT_EQ(MountSegmentAs(master_.address(), kWrongSecret, "forged").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  auto good = StubWith(master_.address(), kSecret);
  ASSERT_TRUE(ListSegments(good.get(), &resp).ok());
  EXPECT_EQ(resp.segments_size(), 0) << "the forged mount must not have happened";

  const HttpResult metrics = HttpGet(master_.http_port(), "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_EQ(MetricValue(metrics.body, "granary_master_unauthenticated_total",
                        "transport=\"grpc\""),
            3);
  EXPECT_EQ(MetricValue(metrics.body, "granary_master_unauthenticated_total",
                        "transport=\"fast\""),
            0);
  // The state holds every node's data-plane token: not served over HTTP with a secret.
  EXPECT_EQ(HttpGet(master_.http_port(), "/debug/snapshot").status, 404);
  const std::string log = master_.Log();
  EXPECT_NE(log.find("refused a grpc caller"), std::string::npos) << log;
  EXPECT_EQ(log.find(kSecret), std::string::npos);
  EXPECT_EQ(log.find(kWrongSecret), std::string::npos);
}

TEST_F(SecurityTest, TheFastPortServesAConnectionOnlyAfterAHelloWithTheSecret) {
  // A call before any hello: refused, then the connection is closed.
  int fd = ConnectFast(fast_port_);
  ASSERT_GE(fd, 0);
  FastReply r = Exchange(fd, fast::Method::kPing, PingBody());
  ASSERT_TRUE(r.transport.ok()) << r.transport.ToString();
  EXPECT_TRUE(r.header.flags & fast::kError);
  auto coded = rpc::ParseCodedMessage(r.body);
  ASSERT_TRUE(coded.has_value()) << r.body;
  EXPECT_EQ(coded->code(), ErrorCode::UNAUTHENTICATED);
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);

  // A hello with a wrong secret: refused and closed.
  fd = ConnectFast(fast_port_);
  r = Exchange(fd, fast::Method::kHello, kWrongSecret);
  ASSERT_TRUE(r.transport.ok());
  EXPECT_TRUE(r.header.flags & fast::kError);
  EXPECT_EQ(r.body.find(kSecret), std::string::npos);
  auto wrong = rpc::ParseCodedMessage(r.body);
  ASSERT_TRUE(wrong.has_value()) << r.body;
  EXPECT_EQ(wrong->code(), ErrorCode::UNAUTHENTICATED);
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);

  // A hello announcing more than a secret's size is not read at all.
  fd = ConnectFast(fast_port_);
  r = Exchange(fd, fast::Method::kHello, std::string(8192, 'x'));
  EXPECT_FALSE(r.transport.ok() && !(r.header.flags & fast::kError));
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);

  // The right secret: the connection then serves calls.
  fd = ConnectFast(fast_port_);
  r = Exchange(fd, fast::Method::kHello, kSecret);
  ASSERT_TRUE(r.transport.ok());
  EXPECT_FALSE(r.header.flags & fast::kError) << r.body;
  r = Exchange(fd, fast::Method::kPing, PingBody());
  ASSERT_TRUE(r.transport.ok());
  EXPECT_FALSE(r.header.flags & fast::kError) << r.body;
  pb::PingResponse ping;
  EXPECT_TRUE(ping.ParseFromString(r.body));
  ::close(fd);

  const HttpResult metrics = HttpGet(master_.http_port(), "/metrics");
  EXPECT_EQ(MetricValue(metrics.body, "granary_master_unauthenticated_total",
                        "transport=\"fast\""),
            3);  // no hello, a wrong one, an oversized one
  EXPECT_EQ(master_.Log().find(kSecret), std::string::npos);
}

TEST_F(SecurityTest, NodesAndClientsWorkWithTheSecretAndAreRefusedWithoutIt) {
  // A node without the secret cannot mount: it stops with the reason.
  NodeProcess stranger(UniqueName("sec-stranger"), 32 * MiB, dir_.path());
  EXPECT_FALSE(stranger.Start(master_.address()));
  const auto ended = stranger.Wait(10s);
  ASSERT_TRUE(ended.has_value()) << stranger.Log();
  EXPECT_FALSE(ended->Succeeded());
  EXPECT_NE(stranger.Log().find("UNAUTHENTICATED"), std::string::npos) << stranger.Log();

  NodeProcess node(UniqueName("sec-node"), 64 * MiB, dir_.path());
  ASSERT_TRUE(StartNode(&node, {"--auth-token-file", secret_file_}));

  // A client with the secret: puts and gets over shared memory and over TCP.
  for (bool shm : {true, false}) {
    auto client = ClientWith(secret_file_, shm);
    ASSERT_NE(client, nullptr);
    const std::string key = shm ? "k-shm" : "k-tcp";
    const std::string value(256 * KiB, shm ? 's' : 't');
    ASSERT_TRUE(client->Put(key, {reinterpret_cast<const std::byte*>(value.data()), value.size()})
                    .ok());
    auto got = client->Get(key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(got->data()), got->size()), value);
  }

  // Without a secret, or with a wrong one: every call is refused with UNAUTHENTICATED, and
  // nothing is written or read.
  ::unsetenv("GRANARY_AUTH_TOKEN_FILE");
  for (const std::string& file : {std::string(), wrong_file_}) {
    auto client = ClientWith(file);
    ASSERT_NE(client, nullptr);
    const std::string value(4 * KiB, 'x');
    Status put = client->Put("intruder", {reinterpret_cast<const std::byte*>(value.data()),
                                          value.size()});
    EXPECT_EQ(put.code(), ErrorCode::UNAUTHENTICATED) << put.ToString();
    auto got = client->Get("k-shm");
    EXPECT_EQ(got.status().code(), ErrorCode::UNAUTHENTICATED) << got.status().ToString();
    EXPECT_EQ(client->RemoveAll().status().code(), ErrorCode::UNAUTHENTICATED);
  }
  auto client = ClientWith(secret_file_);
  ASSERT_NE(client, nullptr);
  auto exists = client->Exist("intruder");
  ASSERT_TRUE(exists.ok()) << exists.status().ToString();
  EXPECT_FALSE(*exists);
  EXPECT_TRUE(client->Get("k-shm").ok()) << "an intruder's RemoveAll must have removed nothing";

  // The secret file from the environment, as the CLI, Python and Mooncake layers read it.
  ::setenv("GRANARY_AUTH_TOKEN_FILE", secret_file_.c_str(), 1);
  auto from_env = ClientWith("");
  ::unsetenv("GRANARY_AUTH_TOKEN_FILE");
  ASSERT_NE(from_env, nullptr);
  EXPECT_TRUE(from_env->Get("k-tcp").ok());
  EXPECT_EQ(master_.Log().find(kSecret), std::string::npos);
  EXPECT_EQ(node.Log().find(kSecret), std::string::npos);
}

TEST_F(SecurityTest, HundredsOfUnauthenticatedConnectionsLeaveLegitimateClientsWorking) {
  NodeProcess node(UniqueName("sec-load"), 64 * MiB, dir_.path());
  ASSERT_TRUE(StartNode(&node, {"--auth-token-file", secret_file_}));
  auto client = ClientWith(secret_file_);
  ASSERT_NE(client, nullptr);

  std::atomic<bool> stop{false};
  std::atomic<int> attacks{0};
  std::atomic<int> served_to_attacker{0};
  std::vector<std::thread> attackers;
  std::vector<int> idle;  // held open, never saying hello
  for (int i = 0; i < 300; ++i) {
    auto fd = net::ConnectTcp("127.0.0.1", fast_port_, std::chrono::steady_clock::now() + 5s);
    if (fd.ok()) idle.push_back(*fd);
  }
  ASSERT_GT(idle.size(), 250u);
  // Past 64 silent connections the oldest ones are shed: a client with the secret still gets a
  // fast-port connection, not a "busy" one.
  {
    client::FastChannel channel("127.0.0.1", fast_port_, 5000, kSecret);
    pb::BatchExistRequest req;
    req.add_keys("nothing");
    pb::BatchExistResponse resp;
    bool sent = false;
    Status s = channel.Call(fast::Method::kExist, req, &resp, true, &sent);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(resp.results_size(), 1);
  }
  constexpr int kAttackers = 4;
  constexpr int kAttacksEach = 50;
  std::atomic<int> attackers_done{0};
  for (int t = 0; t < kAttackers; ++t) {
    attackers.emplace_back([&, t] {
      for (int i = 0; i < kAttacksEach && !stop.load(); ++i) {  // bounded
        auto fd = net::ConnectTcp("127.0.0.1", fast_port_, std::chrono::steady_clock::now() + 2s);
        if (!fd.ok()) continue;
        const bool hello = (i + t) % 2 == 0;
        FastReply r = hello ? Exchange(*fd, fast::Method::kHello, kWrongSecret)
                            : Exchange(*fd, fast::Method::kPing, PingBody());
        if (r.transport.ok() && !(r.header.flags & fast::kError)) served_to_attacker++;
        attacks++;
        ::close(*fd);
      }
      attackers_done++;
    });
  }
  // The client works all through the attack: at least 60 rounds, and on until every attacker is
  // done (bounded: a slow build, e.g. under ThreadSanitizer, takes more rounds).
  int ok = 0;
  int rounds = 0;
  for (int i = 0; i < 60 || (attackers_done.load() < kAttackers && i < 5000); ++i, ++rounds) {
    const std::string key = "during-attack-" + std::to_string(i);
    const std::string value(64 * KiB, static_cast<char>('a' + i % 26));
    Status put = client->Put(key, {reinterpret_cast<const std::byte*>(value.data()), value.size()});
    auto got = client->Get(key);
    if (put.ok() && got.ok() &&
        std::string(reinterpret_cast<const char*>(got->data()), got->size()) == value) {
      ok++;
    } else {
      ADD_FAILURE() << "round " << i << ": " << put.ToString() << " / "
                    << got.status().ToString();
    }
  }
  stop = true;
  for (auto& t : attackers) t.join();
  // The silent connections held no slot for long: the master closed every one of them (shed for
  // newer ones, or at the 5 s hello deadline).
  size_t closed = 0;
  const auto until = std::chrono::steady_clock::now() + 8s;
  for (int fd : idle) {
    char byte;
    for (;;) {  // bounded by `until`
      const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        closed++;
        break;
      }
      if (std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(10ms);
    }
    ::close(fd);
  }
  EXPECT_EQ(closed, idle.size());
  EXPECT_EQ(ok, rounds);
  EXPECT_EQ(attacks.load(), kAttackers * kAttacksEach);
  EXPECT_EQ(served_to_attacker.load(), 0);
  EXPECT_TRUE(master_.Running());
  EXPECT_TRUE(node.Running());
  const HttpResult metrics = HttpGet(master_.http_port(), "/metrics");
  EXPECT_GE(MetricValue(metrics.body, "granary_master_unauthenticated_total", "transport=\"fast\""),
            kAttackers * kAttacksEach);
  // The log is not flooded: at most a line a second, each saying how many it left out.
  size_t lines = 0;
  const std::string log = master_.Log();
  for (size_t p = log.find("refused a fast caller"); p != std::string::npos;
       p = log.find("refused a fast caller", p + 1)) {
    lines++;
  }
  EXPECT_LT(lines, static_cast<size_t>(attacks.load()) / 4);
}

// ---- HA: masters present the secret to each other ----

// Sets an environment variable for one scope (the fixture's clients read the secret file from it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

TEST_F(HaTest, MastersWithTheSecretReplicateAndFailOverAndAStandbyWithoutItIsLeftOut) {
  TempDir dir("granary-security");
  const std::string good = SecretFile(dir, "secret", kSecret);
  const std::string wrong = SecretFile(dir, "wrong", kWrongSecret);
  ScopedEnv env("GRANARY_AUTH_TOKEN_FILE", good);
  // Serving alone allowed: after the kill, the survivor's only possible standby is the one
  // with the wrong secret.
  ASSERT_TRUE(cluster_.Start(2, 0, 0, {"--auth-token-file", good, "--allow-serving-alone"}));
  ASSERT_TRUE(cluster_.AddNode(32 * MiB, {"--auth-token-file", good}));
  const int leader = cluster_.LeaderIndex();
  ASSERT_GE(leader, 0);
  ASSERT_TRUE(cluster_.WaitForRole(1 - leader, "standby", Millis(10000)));
  // Serving alone until then, the leader names the standby synchronous once it has caught up:
  // only then do puts wait for it, and only a synchronous standby takes the state over.
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto s = cluster_.Status(leader);
        if (!s) return false;
        for (const auto& st : (*s)["standbys"]) {
          if (st["synchronous"].get<bool>()) return true;
        }
        return false;
      },
      Millis(15000), Millis(50)))
      << cluster_.Logs();

  auto client = cluster_.MakeClient();
  ASSERT_NE(client, nullptr);
  std::vector<std::string> keys;
  for (int i = 0; i < 20; ++i) {
    keys.push_back("ha-secret-" + std::to_string(i));
    const std::string value(16 * KiB, static_cast<char>('A' + i));
    ASSERT_TRUE(client->Put(keys.back(), {reinterpret_cast<const std::byte*>(value.data()),
                                          value.size()})
                    .ok());
  }
  ASSERT_TRUE(cluster_.WaitForStandbysCaughtUp(Millis(10000)));

  // A third master with another secret: the leader refuses its history stream.
  ASSERT_TRUE(cluster_.AddMaster({"--auth-token-file", wrong}));
  const bool refused = WaitUntil(
      [&] {
        const HttpResult m = HttpGet(cluster_.master(leader).http_port(), "/metrics");
        return MetricValue(m.body, "granary_master_unauthenticated_total",
                           "transport=\"fast\"") >= 1;
      },
      Millis(10000), Millis(50));
  EXPECT_TRUE(refused) << cluster_.Logs();
  // The refused standby says so, once (it then tries once a second, silently).
  const std::string third_log = cluster_.master(2).Log();
  EXPECT_NE(third_log.find("refused this standby's secret"), std::string::npos) << third_log;
  EXPECT_EQ(third_log.find("refused this standby's secret", third_log.find("refused this")+ 1),
            std::string::npos)
      << third_log;

  // The leader dies: the standby that presented the secret holds every object and takes over;
  // the one that did not never held anything and does not.
  ASSERT_TRUE(cluster_.master(leader).process().Kill(SIGKILL));
  const int next = cluster_.WaitForLeader(Millis(10000), leader);
  ASSERT_EQ(next, 1 - leader) << cluster_.Logs();
  for (int i = 0; i < 20; ++i) {
    auto got = client->Get(keys[i]);
    ASSERT_TRUE(got.ok()) << keys[i] << ": " << got.status().ToString();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(got->data()), got->size()),
              std::string(16 * KiB, static_cast<char>('A' + i)));
  }
  for (int i = 0; i < cluster_.master_count(); ++i) {
    if (i == leader) continue;
    EXPECT_EQ(cluster_.master(i).Log().find(kSecret), std::string::npos);
  }

  // A client with a wrong secret following the cluster is told so at once, not after retrying
  // leader after leader until its deadline (5 s).
  ClientOptions wrong_options;
  wrong_options.auth_token_file = wrong;
  auto intruder = cluster_.MakeClient(false, wrong_options);
  ASSERT_NE(intruder, nullptr);
  const auto start = std::chrono::steady_clock::now();
  auto exists = intruder->Exist(keys[0]);
  EXPECT_EQ(exists.status().code(), ErrorCode::UNAUTHENTICATED) << exists.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

// ---- safe defaults and bad secret files ----

// Runs `binary args` to its exit (bounded); its log.
std::string RunToExit(const std::string& binary, const std::vector<std::string>& args,
                      const TempDir& dir, std::optional<ExitStatus>* status) {
  std::string error;
  const std::string log = dir.File(UniqueName("run") + ".log");
  *status = RunCommand(BinaryPath(binary), args, log, 20s, &error);
  return ReadFile(log) + error;
}

TEST(SecretRotationTest, AMasterAcceptsASecondarySecretUntilItsFileDropsIt) {
  TempDir dir("granary-rotation");
  const std::string kNew = "the-new-secret-0123456789abcdef";
  const std::string master_file = SecretFile(dir, "master", kNew + "\n" + kSecret);
  const std::string old_file = SecretFile(dir, "old", kSecret);
  const std::string new_file = SecretFile(dir, "new", kNew);
  MasterProcess master;
  ASSERT_TRUE(master.Start({"--auth-token-file", master_file}));
  // Mid-rotation: a node still on the old secret, clients on either.
  NodeProcess node(UniqueName("rotation"), 32 * MiB, dir.path());
  ASSERT_TRUE(node.Start(master.address(), {"--auth-token-file", old_file}));
  auto connect = [&](const std::string& file) { return ConnectClient(master.address(), file); };
  const std::string value(64 * KiB, 'r');
  const ByteSpan bytes{reinterpret_cast<const std::byte*>(value.data()), value.size()};
  {
    auto old_client = connect(old_file);
    auto new_client = connect(new_file);
    ASSERT_TRUE(old_client && new_client);
    ASSERT_TRUE(old_client->Put("by-old", bytes).ok());
    ASSERT_TRUE(new_client->Put("by-new", bytes).ok());
    EXPECT_TRUE(new_client->Get("by-old").ok());
    EXPECT_TRUE(old_client->Get("by-new").ok());
  }
  const HttpResult metrics = HttpGet(master.http_port(), "/metrics");
  const std::string series = "\ngranary_master_secondary_secret_total ";
  const size_t at = metrics.body.find(series);
  ASSERT_NE(at, std::string::npos) << metrics.body;
  EXPECT_GT(std::stod(metrics.body.substr(at + series.size())), 0)
      << "the old secret's users are counted";

  // The rotation ends: the master's file holds the new secret only.
  ASSERT_EQ(::unlink(master_file.c_str()), 0);
  ASSERT_EQ(SecretFile(dir, "master", kNew), master_file);
  ASSERT_TRUE(master.Restart());
  auto old_client = connect(old_file);
  auto new_client = connect(new_file);
  ASSERT_TRUE(old_client && new_client);
  EXPECT_EQ(old_client->Put("late", bytes).code(), ErrorCode::UNAUTHENTICATED);
  EXPECT_TRUE(new_client->Exist("late").ok());
  EXPECT_EQ(master.Log().find(kSecret), std::string::npos);
  EXPECT_EQ(master.Log().find(kNew), std::string::npos);
}

TEST(SecurityDefaultsTest, ServersOnOtherHostsRefuseToStartWithoutASecret) {
  TempDir dir("granary-security");
  const std::string port = std::to_string(PickFreePort());
  const std::string http = std::to_string(PickFreePort());
  std::optional<ExitStatus> st;
  std::string log = RunToExit("granary-master",
                              {"--host", "0.0.0.0", "--port", port, "--http-port", http}, dir, &st);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code, 2) << log;
  EXPECT_NE(log.find("--auth-token-file"), std::string::npos) << log;
  EXPECT_NE(log.find("--insecure"), std::string::npos) << log;

  log = RunToExit("granary-node",
                  {"--host", "0.0.0.0", "--master", "127.0.0.1:" + port, "--segment-size", "8MiB"},
                  dir, &st);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code, 2) << log;
  EXPECT_NE(log.find("--auth-token-file"), std::string::npos) << log;

  // --insecure: the operator said so; the master serves.
  MasterProcess open_master;
  ASSERT_TRUE(open_master.Start({"--host", "0.0.0.0", "--insecure", "true"}));
  pb::ListSegmentsResponse resp;
  auto stub = StubWith(open_master.address(), "");
  EXPECT_TRUE(ListSegments(stub.get(), &resp).ok());
}

TEST(SecurityDefaultsTest, AnUnusableSecretFileStopsTheMasterWithTheReasonAndNotTheSecret) {
  TempDir dir("granary-security");
  struct Case {
    std::string contents;
    mode_t mode;
    std::string why;
  };
  const std::vector<Case> cases = {
      {std::string(kSecret) + "\n", 0644, "chmod 600"},
      {"short-one\n", 0600, "shorter than 16"},
      {"\n\n", 0600, "empty"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir.WriteFile("secret-" + std::to_string(i), cases[i].contents);
    ASSERT_EQ(::chmod(path.c_str(), cases[i].mode), 0);
    std::optional<ExitStatus> st;
    const std::string log =
        RunToExit("granary-master",
                  {"--port", std::to_string(PickFreePort()), "--http-port",
                   std::to_string(PickFreePort()), "--auth-token-file", path},
                  dir, &st);
    ASSERT_TRUE(st.has_value());
    EXPECT_FALSE(st->Succeeded());
    EXPECT_NE(log.find(cases[i].why), std::string::npos) << log;
    EXPECT_NE(log.find(path), std::string::npos) << log;
    EXPECT_EQ(log.find(kSecret), std::string::npos) << log;
  }
  std::optional<ExitStatus> st;
  const std::string log = RunToExit(
      "granary-master", {"--auth-token-file", dir.File("missing")}, dir, &st);
  ASSERT_TRUE(st.has_value());
  EXPECT_FALSE(st->Succeeded());
  EXPECT_NE(log.find("No such file"), std::string::npos) << log;
}

}  // namespace
}  // namespace granary::it
