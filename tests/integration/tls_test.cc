// Integration tests of TLS on the control plane (docs/security.md, "TLS") with real processes:
// a master with --tls-cert/--tls-key/--tls-ca, nodes and clients presenting certificates of the
// same CA. Clients reach it over TLS on gRPC and the fast port; a plaintext client, a client
// without a certificate, with a foreign one, or trusting another CA stores and reads nothing, and
// the master keeps serving the others. HA masters stream their history to each other over TLS,
// and a failover keeps what was acknowledged.
#include <gtest/gtest.h>

#include <algorithm>

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "../test_pki.h"
#include "granary/client.h"
#include "ha_fixture.h"
#include "master_fixture.h"
#include "process_harness.h"
#include "security_helpers.h"
#include "store_fixture.h"
#include "../tools/test_pattern.h"

namespace granary::it {
namespace {

using Clock = std::chrono::steady_clock;

class TlsTest : public StoreTest {
 protected:
  void SetUp() override { ASSERT_TRUE(pki_.ok) << pki_.error; }

  std::vector<std::string> ServerFlags(bool mutual = true) const {
    std::vector<std::string> f = {"--tls-cert", pki_.server.cert, "--tls-key", pki_.server.key};
    if (mutual) f.insert(f.end(), {"--tls-ca", pki_.ca});
    return f;
  }
  std::vector<std::string> NodeFlags() const {
    return {"--tls-ca", pki_.ca, "--tls-cert", pki_.client.cert, "--tls-key", pki_.client.key};
  }
  // A store: its master serving TLS (mutual unless told), one node of 64 MiB.
  ::testing::AssertionResult StartStore(bool mutual = true) {
    std::map<std::string, std::string> overrides;
    const auto flags = ServerFlags(mutual);
    for (size_t i = 0; i + 1 < flags.size(); i += 2) overrides[flags[i]] = flags[i + 1];
    cluster_.master().set_tls_ca(pki_.ca);
    if (auto started = cluster_.Start(0, 0, overrides); !started) return started;
    return cluster_.AddNode(64 * MiB, "", NodeFlags());
  }
  Result<std::unique_ptr<Client>> Connect(const std::string& ca, const test::TestPki::Pair& pair,
                                          bool fast = true) {
    ClientOptions o;
    o.master_address = cluster_.master_address();
    o.tls_ca_file = ca;
    o.tls_cert_file = pair.cert;
    o.tls_key_file = pair.key;
    o.use_fast_path = fast;
    o.use_shared_memory = false;
    o.rpc_timeout_ms = 3000;
    o.io_timeout_ms = 5000;
    return Client::Connect(o);
  }
  std::string Metrics() { return HttpGet(cluster_.master().http_port(), "/metrics").body; }

  TempDir pki_dir_{"granary-pki"};
  test::TestPki pki_{pki_dir_.path()};
};

double Counter(const std::string& page, const std::string& name) {
  const size_t at = page.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(page.substr(at + name.size() + 2));
}

TEST_F(TlsTest, ClientsAndNodesWithTheCasCertificatesWorkOverGrpcAndTheFastPort) {
  ASSERT_TRUE(StartStore());
  auto fast_calls = [&](const char* method) {
    return MetricValue(Metrics(), "granary_master_fast_calls_total", method);
  };
  for (bool fast : {false, true}) {
    auto client = Connect(pki_.ca, pki_.client, fast);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    // A new client learns the fast port from its first answers and uses gRPC meanwhile: with
    // the fast path, put and get until the fast port has served both (bounded).
    int round = 0;
    auto put_and_get = [&] {
      const std::string key = std::string(fast ? "fast-" : "grpc-") + std::to_string(round++);
      const auto value = testdata::Pattern(key, 256 * KiB);
      EXPECT_TRUE((*client)->Put(key, value).ok());
      auto got = (*client)->Get(key);
      EXPECT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(got.ok() && *got == value);
    };
    put_and_get();
    if (!fast) {
      EXPECT_EQ(fast_calls("BatchPutStart"), 0) << "a gRPC-only client used the fast port";
      continue;
    }
    EXPECT_TRUE(WaitUntil(
        [&] {
          put_and_get();
          // A put goes by BatchPutStart, or by BatchPutCommit once the client holds reserved
          // space (its pool fills in the background: under TSan, often before the port is known).
          const double puts = std::max(0.0, fast_calls("BatchPutStart")) +
                              std::max(0.0, fast_calls("BatchPutCommit"));
          return puts >= 1 && fast_calls("BatchGetReplicaList") >= 1;
        },
        Millis(15'000), Millis(50)))
        << "the fast port (TLS) served no put and get";
  }
  EXPECT_EQ(Counter(Metrics(), "granary_master_fast_tls_failures_total"), 0);
}

TEST_F(TlsTest, WithoutTheRightCertificatesNothingIsStoredOrRead) {
  ASSERT_TRUE(StartStore());
  auto good = Connect(pki_.ca, pki_.client);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  const auto secret_value = testdata::Pattern("kept", 64 * KiB);
  ASSERT_TRUE((*good)->Put("kept", secret_value).ok());

  struct Stranger {
    const char* what;
    std::string ca;
    test::TestPki::Pair pair;
  };
  const std::vector<Stranger> strangers = {
      {"plaintext", "", {}},
      {"no client certificate", pki_.ca, {}},
      {"a certificate of another CA", pki_.ca, pki_.rogue_client},
      {"trusting another CA", pki_.rogue_ca, pki_.client},
  };
  for (const Stranger& s : strangers) {
    for (bool fast : {true, false}) {
      SCOPED_TRACE(std::string(s.what) + (fast ? " (fast port)" : " (gRPC only)"));
      ClientOptions o;
      o.master_address = cluster_.master_address();
      o.tls_ca_file = s.ca;
      o.tls_cert_file = s.pair.cert;
      o.tls_key_file = s.pair.key;
      o.use_fast_path = fast;
      o.use_shared_memory = false;
      o.rpc_timeout_ms = 1500;
      o.io_timeout_ms = 2000;
      auto c = Client::Connect(o);
      if (!c.ok()) continue;  // refused at connect: nothing more to try
      EXPECT_FALSE((*c)->Put("stranger", testdata::Pattern("stranger", 4 * KiB)).ok());
      EXPECT_FALSE((*c)->Get("kept").ok());
      auto exists = (*c)->Exist("kept");
      EXPECT_FALSE(exists.ok() && *exists);
      EXPECT_FALSE((*c)->Remove("kept").ok());
    }
  }
  // Raw plaintext bytes on the fast port: closed unread, counted.
  const double before = Counter(Metrics(), "granary_master_fast_tls_failures_total");
  int fd = ConnectFast(static_cast<uint16_t>([&] {
    pb::ListSegmentsResponse resp;
    EXPECT_TRUE(ListSegments(cluster_.master().stub(), &resp).ok());
    return resp.fast_port();
  }()));
  ASSERT_GE(fd, 0);
  (void)net::SendAll(fd, EncodeFrame(fast::Method::kPing, PingBody()), Clock::now() + 2s);
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);
  EXPECT_TRUE(WaitUntil(
      [&] { return Counter(Metrics(), "granary_master_fast_tls_failures_total") >= before + 1; },
      Millis(3000)));

  // The good client and the master are unharmed; nothing of the strangers' was stored.
  auto got = (*good)->Get("kept");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == secret_value);
  auto stranger = (*good)->Exist("stranger");
  ASSERT_TRUE(stranger.ok());
  EXPECT_FALSE(*stranger);
  EXPECT_TRUE(cluster_.master().Running());
}

TEST_F(TlsTest, AServerWithoutACaAsksNoClientCertificate) {
  ASSERT_TRUE(StartStore(/*mutual=*/false));
  auto anonymous = Connect(pki_.ca, {});
  ASSERT_TRUE(anonymous.ok()) << anonymous.status().ToString();
  const auto value = testdata::Pattern("anonymous", 64 * KiB);
  ASSERT_TRUE((*anonymous)->Put("anonymous", value).ok());
  auto got = (*anonymous)->Get("anonymous");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == value);
  // Still TLS: a plaintext client gets nothing.
  ClientOptions o;
  o.master_address = cluster_.master_address();
  o.rpc_timeout_ms = 1500;
  auto plain = Client::Connect(o);
  if (plain.ok()) {
    EXPECT_FALSE((*plain)->Get("anonymous").ok());
  }
}

TEST_F(TlsTest, AMasterRefusesToStartWithTlsItCannotUse) {
  // A key readable by others, a key of another certificate, a certificate without its key.
  const std::string loose = pki_dir_.File("loose.key");
  ASSERT_EQ(std::system(("cp " + pki_.server.key + " " + loose + " && chmod 644 " + loose).c_str()), 0);
  const std::vector<std::vector<std::string>> bad = {
      {"--tls-cert", pki_.server.cert, "--tls-key", loose},
      {"--tls-cert", pki_.server.cert, "--tls-key", pki_.client.key},
      {"--tls-cert", pki_.server.cert},
      {"--tls-ca", pki_.ca},
  };
  for (const auto& flags : bad) {
    ChildProcess master;
    std::vector<std::string> args = {"--port", std::to_string(PickFreePort()), "--http-port",
                                     std::to_string(PickFreePort())};
    args.insert(args.end(), flags.begin(), flags.end());
    std::string error;
    ASSERT_TRUE(master.Start(BinaryPath("granary-master"), args, pki_dir_.File("bad.log"), &error))
        << error;
    auto exit = master.Wait(Millis(10'000));
    ASSERT_TRUE(exit.has_value()) << "granary-master kept running with " << flags[0] << " "
                                  << flags[1];
    EXPECT_FALSE(exit->Succeeded());
    const std::string log = master.LogContents();
    EXPECT_NE(log.find("TLS"), std::string::npos) << log;
    EXPECT_EQ(log.find("PRIVATE KEY"), std::string::npos) << "a key's content in the log";
  }
}

// HA: masters present their certificates to each other on the history stream; clients follow
// the leader through etcd over TLS; a failover keeps every acknowledged put.
class TlsHaTest : public HaTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(pki_.ok) << pki_.error;
    // The fixture's own clients (and this test's) take TLS from the environment.
    ::setenv("GRANARY_TLS_CA", pki_.ca.c_str(), 1);
    ::setenv("GRANARY_TLS_CERT", pki_.client.cert.c_str(), 1);
    ::setenv("GRANARY_TLS_KEY", pki_.client.key.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("GRANARY_TLS_CA");
    ::unsetenv("GRANARY_TLS_CERT");
    ::unsetenv("GRANARY_TLS_KEY");
    HaTest::TearDown();
  }
  TempDir pki_dir_{"granary-pki"};
  test::TestPki pki_{pki_dir_.path()};
};

TEST_F(TlsHaTest, MastersStreamTheirHistoryOverTlsAndAFailoverKeepsEveryPut) {
  const std::vector<std::string> tls = {"--tls-cert", pki_.server.cert, "--tls-key",
                                        pki_.server.key, "--tls-ca", pki_.ca};
  ASSERT_TRUE(cluster_.Start(3, 0, 0, tls));
  ASSERT_TRUE(cluster_.AddNode(64 * MiB, {"--tls-ca", pki_.ca, "--tls-cert", pki_.client.cert,
                                          "--tls-key", pki_.client.key}));
  const int leader = cluster_.LeaderIndex();
  ASSERT_GE(leader, 0);
  auto client = cluster_.MakeClient();
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 20; ++i) {
    const std::string key = "ha-" + std::to_string(i);
    ASSERT_TRUE(client->Put(key, testdata::Pattern(key, 32 * KiB)).ok());
  }
  // Synchronous replication: every acknowledged put is on the standby, which streamed it over TLS.
  ASSERT_TRUE(cluster_.WaitForStandbysCaughtUp(Millis(5000)));
  ASSERT_TRUE(cluster_.master(leader).process().Kill(SIGKILL));
  ASSERT_GE(cluster_.WaitForLeader(Millis(10'000), leader), 0);
  for (int i = 0; i < 20; ++i) {
    const std::string key = "ha-" + std::to_string(i);
    Result<std::vector<std::byte>> got = Status(ErrorCode::RPC_FAIL, "not tried");
    for (int attempt = 0; attempt < 20 && !got.ok(); ++attempt) got = client->Get(key);  // bounded
    ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
    EXPECT_TRUE(*got == testdata::Pattern(key, 32 * KiB)) << key;
  }
}

}  // namespace
}  // namespace granary::it
