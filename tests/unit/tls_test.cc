// security/tls.h: what the loaders refuse, and TLS streams between two real sockets on loopback:
// bytes both ways at once, who is refused (an unknown CA, a wrong name, no or a foreign client
// certificate, a plaintext peer) and that every handshake ends by its deadline.
#include "security/tls.h"

#include <arpa/inet.h>
#include <openssl/ssl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "../test_pki.h"
#include "common/socket_io.h"

namespace granary::security {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Side = TlsContext::Side;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/granary-tls-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    pki_ = new test::TestPki(dir_);
  }
  static void TearDownTestSuite() {
    delete pki_;
    std::filesystem::remove_all(dir_);
  }
  void SetUp() override { ASSERT_TRUE(pki_->ok) << pki_->error; }

  static std::shared_ptr<const TlsContext> Ctx(const TlsFiles& f, Side side) {
    auto c = TlsContext::Load(f, side);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : nullptr;
  }
  static std::shared_ptr<const TlsContext> MutualServer() {
    return Ctx({pki_->server.cert, pki_->server.key, pki_->ca}, Side::kServer);
  }
  static std::shared_ptr<const TlsContext> GoodClient() {
    return Ctx({pki_->client.cert, pki_->client.key, pki_->ca}, Side::kClient);
  }

  // A connected loopback TCP pair: {client side, server side}.
  static std::pair<int, int> Pair() {
    int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(listener, 1), 0);
    EXPECT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
    auto c = net::ConnectTcp("127.0.0.1", ntohs(a.sin_port), Clock::now() + 5s);
    EXPECT_TRUE(c.ok());
    int s = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    ::close(listener);
    return {c.ok() ? *c : -1, s};
  }

  // Both handshakes at once; the server's outcome in *server_status.
  static Result<std::unique_ptr<net::ByteStream>> Handshake(
      const std::shared_ptr<const TlsContext>& server, const std::shared_ptr<const TlsContext>& client,
      const std::string& host, Status* server_status,
      std::unique_ptr<net::ByteStream>* server_stream = nullptr) {
    auto [cfd, sfd] = Pair();
    std::thread t([&, sfd = sfd] {
      auto s = server->Accept(sfd, /*owns_fd=*/true, Clock::now() + 5s);
      *server_status = s.status();
      if (s.ok() && server_stream != nullptr) *server_stream = std::move(*s);  // else closed
    });
    auto c = client->Connect(cfd, host, Clock::now() + 5s);
    t.join();
    return c;
  }

  static inline std::string dir_;
  static inline test::TestPki* pki_ = nullptr;
};

TEST_F(TlsTest, LoadRefusesFilesItCannotTrust) {
  auto refused = [](const TlsFiles& f, Side side) {
    auto c = TlsContext::Load(f, side);
    EXPECT_FALSE(c.ok());
    EXPECT_EQ(c.code(), ErrorCode::INVALID_PARAMS);
    return c.ok() ? std::string() : c.status().message();
  };
  EXPECT_NE(refused({dir_ + "/nope.pem", pki_->server.key, ""}, Side::kServer).find("nope.pem"),
            std::string::npos);
  EXPECT_NE(refused({"", "", pki_->ca}, Side::kServer).find("--tls-cert"), std::string::npos)
      << "a server without a certificate";
  EXPECT_NE(refused({pki_->client.cert, "", pki_->ca}, Side::kClient).find("key"),
            std::string::npos);
  EXPECT_NE(refused({pki_->server.cert, pki_->client.key, ""}, Side::kServer)
                .find("does not match"),
            std::string::npos);
  EXPECT_NE(refused({pki_->server.cert, pki_->server.key, pki_->server.key}, Side::kServer)
                .find("TLS CA"),
            std::string::npos)
      << "a key is no CA bundle";
  // A key others may read is refused, as a secret file is; its content never shows.
  const std::string loose = dir_ + "/loose.key";
  std::filesystem::copy_file(pki_->server.key, loose);
  ASSERT_EQ(::chmod(loose.c_str(), 0644), 0);
  const std::string why = refused({pki_->server.cert, loose, ""}, Side::kServer);
  EXPECT_NE(why.find("loose.key"), std::string::npos) << why;
  EXPECT_EQ(why.find("PRIVATE KEY"), std::string::npos);
  // No files, no environment: no TLS.
  ::unsetenv(kTlsCaEnv);
  ::unsetenv(kTlsCertEnv);
  ::unsetenv(kTlsKeyEnv);
  auto none = LoadClientTls({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  ::setenv(kTlsCaEnv, pki_->ca.c_str(), 1);
  auto from_env = LoadClientTls({});
  ::unsetenv(kTlsCaEnv);
  ASSERT_TRUE(from_env.ok()) << from_env.status().ToString();
  EXPECT_NE(*from_env, nullptr);
}

TEST_F(TlsTest, BytesGoBothWaysAtOnceAndArriveWhole) {
  Status server_status;
  std::unique_ptr<net::ByteStream> server;
  auto client = Handshake(MutualServer(), GoodClient(), "127.0.0.1", &server_status, &server);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE(server_status.ok()) << server_status.ToString();
  EXPECT_STREQ((*client)->kind(), "tls");
  // 4 MiB each way, sent and received on four threads at once: one sender and one receiver per
  // stream, as the HA stream uses it.
  const size_t n = 4 << 20;
  std::string up(n, '\0'), down(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    up[i] = static_cast<char>(i * 7 + 1);
    down[i] = static_cast<char>(i * 13 + 5);
  }
  std::string got_up(n, '\0'), got_down(n, '\0');
  Status s1, s2, r1, r2;
  const auto deadline = Clock::now() + 20s;
  std::thread a([&] { s1 = (*client)->SendAll(up, deadline); });
  std::thread b([&] { s2 = server->SendAll(down, deadline); });
  std::thread c([&] { r1 = server->RecvExact(got_up.data(), n, deadline); });
  std::thread d([&] { r2 = (*client)->RecvExact(got_down.data(), n, deadline); });
  a.join();
  b.join();
  c.join();
  d.join();
  ASSERT_TRUE(s1.ok() && s2.ok() && r1.ok() && r2.ok())
      << s1.ToString() << s2.ToString() << r1.ToString() << r2.ToString();
  EXPECT_TRUE(got_up == up);
  EXPECT_TRUE(got_down == down);
  // Nothing more is there; a close is seen as one.
  char byte;
  Result<size_t> none = (*client)->RecvSome(&byte, 1);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0u);
  server.reset();
  EXPECT_FALSE((*client)->RecvExact(&byte, 1, Clock::now() + 2s).ok());
}

TEST_F(TlsTest, AnUnknownCaOrAnotherNameIsRefused) {
  Status server_status;
  // The client trusts another CA: the server's certificate does not verify.
  auto distrust = Ctx({pki_->client.cert, pki_->client.key, pki_->rogue_ca}, Side::kClient);
  auto c = Handshake(MutualServer(), distrust, "127.0.0.1", &server_status);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.code(), ErrorCode::UNAUTHENTICATED) << c.status().ToString();
  EXPECT_NE(c.status().message().find("certificate"), std::string::npos) << c.status().ToString();
  // The certificate names 127.0.0.1 and localhost, not the address the client meant.
  c = Handshake(MutualServer(), GoodClient(), "127.0.0.2", &server_status);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.code(), ErrorCode::UNAUTHENTICATED);
  c = Handshake(MutualServer(), GoodClient(), "db.example", &server_status);
  EXPECT_FALSE(c.ok());
  c = Handshake(MutualServer(), GoodClient(), "localhost", &server_status);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
}

TEST_F(TlsTest, AMutualServerRefusesClientsWithoutItsCasCertificate) {
  Status server_status;
  auto anonymous = Ctx({"", "", pki_->ca}, Side::kClient);
  auto c = Handshake(MutualServer(), anonymous, "127.0.0.1", &server_status);
  EXPECT_EQ(server_status.code(), ErrorCode::UNAUTHENTICATED) << server_status.ToString();
  // TLS 1.3: the client may finish before the server's refusal arrives; its first read fails.
  if (c.ok()) {
    char byte;
    EXPECT_FALSE((*c)->RecvExact(&byte, 1, Clock::now() + 5s).ok());
  }
  auto foreign = Ctx({pki_->rogue_client.cert, pki_->rogue_client.key, pki_->ca}, Side::kClient);
  c = Handshake(MutualServer(), foreign, "127.0.0.1", &server_status);
  EXPECT_EQ(server_status.code(), ErrorCode::UNAUTHENTICATED) << server_status.ToString();
  // A server without a CA asks for no certificate.
  auto plain_server = Ctx({pki_->server.cert, pki_->server.key, ""}, Side::kServer);
  c = Handshake(plain_server, anonymous, "127.0.0.1", &server_status);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(server_status.ok()) << server_status.ToString();
}

// A client that offers TLS 1.1 at most (OpenSSL's own client, not ours) gets no connection.
TEST_F(TlsTest, NothingBelowTls12IsAccepted) {
  SSL_CTX* old = SSL_CTX_new(TLS_client_method());
  ASSERT_NE(old, nullptr);
  SSL_CTX_set_min_proto_version(old, TLS1_VERSION);
  SSL_CTX_set_max_proto_version(old, TLS1_1_VERSION);
  SSL_CTX_set_security_level(old, 0);  // let it offer what it may
  auto [cfd, sfd] = Pair();
  Status server_status;
  std::thread t([&, sfd = sfd] {
    server_status = MutualServer()->Accept(sfd, /*owns_fd=*/true, Clock::now() + 5s).status();
  });
  SSL* ssl = SSL_new(old);
  SSL_set_fd(ssl, cfd);
  const int connected = SSL_connect(ssl);  // cfd is non-blocking: ConnectTcp's
  for (int i = 0; i < 200 && connected <= 0; ++i) {  // bounded: 2 s of retries
    const int err = SSL_get_error(ssl, connected);
    if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) break;
    std::this_thread::sleep_for(10ms);
    if (SSL_connect(ssl) == 1) break;
  }
  t.join();
  EXPECT_EQ(server_status.code(), ErrorCode::UNAUTHENTICATED) << server_status.ToString();
  SSL_free(ssl);
  SSL_CTX_free(old);
  ::close(cfd);
}

TEST_F(TlsTest, APlaintextPeerOrASilentOneEndsTheHandshakeByItsDeadline) {
  // A plaintext client: the server refuses its first bytes at once.
  {
    auto [cfd, sfd] = Pair();
    ASSERT_TRUE(net::SendAll(cfd, std::string(64, 'G'), Clock::now() + 2s).ok());
    const auto start = Clock::now();
    auto s = MutualServer()->Accept(sfd, /*owns_fd=*/true, Clock::now() + 5s);
    EXPECT_EQ(s.code(), ErrorCode::UNAUTHENTICATED);
    EXPECT_LT(Clock::now() - start, 2s);  // the stream owned sfd and closed it
    ::close(cfd);
  }
  // A server that never answers: the client's handshake gives up at its deadline.
  {
    auto [cfd, sfd] = Pair();
    const auto start = Clock::now();
    auto c = GoodClient()->Connect(cfd, "127.0.0.1", Clock::now() + 300ms);
    const auto took = Clock::now() - start;
    EXPECT_EQ(c.code(), ErrorCode::RPC_TIMEOUT);
    EXPECT_GE(took, 290ms);
    EXPECT_LT(took, 2s);
    ::close(sfd);
  }
  // A client that connects and says nothing: the server gives up at its deadline.
  {
    auto [cfd, sfd] = Pair();
    const auto start = Clock::now();
    auto s = MutualServer()->Accept(sfd, /*owns_fd=*/true, Clock::now() + 300ms);
    EXPECT_EQ(s.code(), ErrorCode::RPC_TIMEOUT);
    EXPECT_LT(Clock::now() - start, 2s);
    ::close(cfd);
  }
}

}  // namespace
}  // namespace granary::security
