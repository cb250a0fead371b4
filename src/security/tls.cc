#include "security/tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "security/secret.h"

namespace granary::security {

namespace {

constexpr size_t kMaxPemBytes = 1 << 20;

// OpenSSL's error queue of this thread as one line (its reasons name no key material).
std::string OpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {  // bounded: the queue is finite
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no detail from OpenSSL" : out;
}

Status Invalid(const std::string& what, const std::string& path, const std::string& why) {
  return Status(ErrorCode::INVALID_PARAMS, what + " " + path + ": " + why);
}

Result<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Invalid(what, path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  std::string pem = text.str();
  if (pem.size() > kMaxPemBytes) return Invalid(what, path, "over 1 MiB");
  if (pem.find("-----BEGIN ") == std::string::npos) return Invalid(what, path, "no PEM block");
  return pem;
}

// A TLS connection over a non-blocking socket; every OpenSSL call holds mu_, never a wait.
class TlsStream final : public net::ByteStream {
 public:
  TlsStream(int fd, bool owns_fd, SSL* ssl) : ByteStream(fd, owns_fd), ssl_(ssl) {}
  ~TlsStream() override { SSL_free(ssl_); }

  Status Handshake(net::SteadyTime deadline) {
    for (;;) {  // bounded by the deadline: every pass progresses or waits toward it
      int err;
      {
        std::lock_guard lock(mu_);
        ERR_clear_error();
        const int r = SSL_do_handshake(ssl_);
        if (r == 1) return Status::Ok();
        err = SSL_get_error(ssl_, r);
        if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
          std::string why = err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0
                                ? std::string("the peer closed the connection")
                                : OpenSslErrors();
          const long verify = SSL_get_verify_result(ssl_);
          if (verify != X509_V_OK) {
            why += std::string(" (certificate: ") + X509_verify_cert_error_string(verify) + ")";
          }
          return Status(ErrorCode::UNAUTHENTICATED, "TLS handshake failed: " + why);
        }
      }
      if (!net::WaitFor(fd(), err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) {
        return Status(ErrorCode::RPC_TIMEOUT, "TLS handshake timed out");
      }
    }
  }

  Status SendAll(std::string_view bytes, net::SteadyTime deadline,
                 size_t* sent_out = nullptr) override {
    size_t sent = 0;
    Status s = Status::Ok();
    while (s.ok() && sent < bytes.size()) {  // bounded: each pass sends, or waits (deadline)
      int err;
      {
        std::lock_guard lock(mu_);
        ERR_clear_error();
        size_t n = 0;
        if (SSL_write_ex(ssl_, bytes.data() + sent, bytes.size() - sent, &n) == 1) {
          sent += n;
          continue;
        }
        err = SSL_get_error(ssl_, 0);
        if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) s = Broken("send", err);
      }
      if (s.ok() && !net::WaitFor(fd(), err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) {
        s = Status(ErrorCode::RPC_TIMEOUT, "send timed out");
      }
    }
    if (sent_out != nullptr) *sent_out = sent;
    return s;
  }

  Result<size_t> RecvSome(char* out, size_t n) override {
    std::lock_guard lock(mu_);
    ERR_clear_error();
    size_t got = 0;
    if (SSL_read_ex(ssl_, out, n, &got) == 1) return got;
    const int err = SSL_get_error(ssl_, 0);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return size_t{0};
    return Broken("receive", err);
  }

  bool WaitReadable(net::SteadyTime deadline) override {
    // In slices: a record the sending thread's call took off the socket would not wake poll().
    for (;;) {  // bounded by the deadline
      if (HasBuffered()) return true;
      const auto slice = std::min(deadline, std::chrono::steady_clock::now() +
                                                std::chrono::milliseconds(100));
      if (net::WaitFor(fd(), POLLIN, slice)) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
    }
  }

  bool HasBuffered() override {
    std::lock_guard lock(mu_);
    return SSL_has_pending(ssl_) == 1;
  }
  const char* kind() const override { return "tls"; }

 private:
  // Holds mu_.
  Status Broken(const char* what, int err) {
    if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)) {
      return Status(ErrorCode::RPC_FAIL, "connection closed by the peer");
    }
    return Status(ErrorCode::RPC_FAIL,
                  std::string("TLS ") + what + " failed: " + OpenSslErrors());
  }

  std::mutex mu_;
  SSL* const ssl_;
};

bool SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

bool IsAddress(const std::string& host) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

Result<std::shared_ptr<const TlsContext>> TlsContext::Load(const TlsFiles& files, Side side) {
  if (side == Side::kServer && (files.cert.empty() || files.key.empty())) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "TLS: a server needs --tls-cert and --tls-key (--tls-ca alone verifies clients "
                  "of a server that has them)");
  }
  if (files.cert.empty() != files.key.empty()) {
    return Status(ErrorCode::INVALID_PARAMS, "TLS: a certificate needs its key, and a key its "
                                             "certificate (--tls-cert with --tls-key)");
  }
  std::shared_ptr<TlsContext> c(new TlsContext());
  c->side_ = side;
  if (!files.cert.empty()) {
    auto cert = ReadPem(files.cert, "TLS certificate");
    if (!cert.ok()) return cert.status();
    auto key = ReadPrivateFile(files.key, kMaxPemBytes, "TLS key");
    if (!key.ok()) return key.status();
    c->cert_pem_ = std::move(*cert);
    c->key_pem_ = std::move(*key);
  }
  if (!files.ca.empty()) {
    auto ca = ReadPem(files.ca, "TLS CA");
    if (!ca.ok()) return ca.status();
    c->ca_pem_ = std::move(*ca);
  }

  ERR_clear_error();
  c->ctx_ = SSL_CTX_new(side == Side::kServer ? TLS_server_method() : TLS_client_method());
  if (c->ctx_ == nullptr) return Status(ErrorCode::INTERNAL_ERROR, "TLS: " + OpenSslErrors());
  SSL_CTX* ctx = c->ctx_;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_clear_mode(ctx, SSL_MODE_AUTO_RETRY);
  // No resumption: connections are long-lived, and a TLS 1.3 ticket arriving after the handshake
  // would read as bytes on an idle pooled connection (which means "closed" to the fast channel).
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(ctx, 0);
  if (!c->cert_pem_.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, files.cert.c_str()) != 1) {
      return Invalid("TLS certificate", files.cert, OpenSslErrors());
    }
    BIO* bio = BIO_new_mem_buf(c->key_pem_.data(), static_cast<int>(c->key_pem_.size()));
    EVP_PKEY* key = bio ? PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr) : nullptr;
    BIO_free(bio);
    if (key == nullptr) return Invalid("TLS key", files.key, "no PEM private key: " + OpenSslErrors());
    const bool used = SSL_CTX_use_PrivateKey(ctx, key) == 1;
    EVP_PKEY_free(key);
    if (!used || SSL_CTX_check_private_key(ctx) != 1) {
      return Invalid("TLS key", files.key, "does not match the certificate " + files.cert);
    }
  }
  if (!c->ca_pem_.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, files.ca.c_str(), nullptr) != 1) {
      return Invalid("TLS CA", files.ca, OpenSslErrors());
    }
  } else if (side == Side::kClient) {
    (void)SSL_CTX_set_default_verify_paths(ctx);
  }
  if (side == Side::kClient) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  } else if (!c->ca_pem_.empty()) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return std::shared_ptr<const TlsContext>(std::move(c));
}

Result<std::unique_ptr<net::ByteStream>> TlsContext::Accept(int fd, bool owns_fd,
                                                            net::SteadyTime deadline) const {
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr || !SetNonBlocking(fd) || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    if (owns_fd) ::close(fd);
    return Status(ErrorCode::INTERNAL_ERROR, "TLS: cannot set a connection up: " + OpenSslErrors());
  }
  SSL_set_accept_state(ssl);
  auto stream = std::make_unique<TlsStream>(fd, owns_fd, ssl);
  if (Status s = stream->Handshake(deadline); !s.ok()) return s;
  return std::unique_ptr<net::ByteStream>(std::move(stream));
}

Result<std::unique_ptr<net::ByteStream>> TlsContext::Connect(int fd, const std::string& host,
                                                             net::SteadyTime deadline) const {
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr || !SetNonBlocking(fd) || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    ::close(fd);
    return Status(ErrorCode::INTERNAL_ERROR, "TLS: cannot set a connection up: " + OpenSslErrors());
  }
  auto stream = std::make_unique<TlsStream>(fd, /*owns_fd=*/true, ssl);
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  const bool named = IsAddress(host) ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) == 1
                                     : SSL_set1_host(ssl, host.c_str()) == 1 &&
                                           SSL_set_tlsext_host_name(ssl, host.c_str()) == 1;
  if (!named) {
    return Status(ErrorCode::INVALID_PARAMS, "TLS: cannot verify the name " + host + ": " +
                                                 OpenSslErrors());
  }
  SSL_set_connect_state(ssl);
  if (Status s = stream->Handshake(deadline); !s.ok()) {
    return Status(s.code(), s.message() + " (connecting to " + host + ")");
  }
  return std::unique_ptr<net::ByteStream>(std::move(stream));
}

std::shared_ptr<grpc::ServerCredentials> TlsContext::ServerCredentials() const {
  grpc::SslServerCredentialsOptions o(
      mutual() ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  o.pem_root_certs = ca_pem_;
  o.pem_key_cert_pairs.push_back({key_pem_, cert_pem_});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> TlsContext::ChannelCredentials() const {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ca_pem_;  // empty: gRPC's default roots
  o.pem_private_key = key_pem_;
  o.pem_cert_chain = cert_pem_;
  return grpc::SslCredentials(o);
}

Result<std::shared_ptr<const TlsContext>> LoadClientTls(const TlsFiles& files) {
  TlsFiles f = files;
  if (!f.any()) {
    auto env = [](const char* name) {
      const char* v = std::getenv(name);
      return std::string(v ? v : "");
    };
    f = TlsFiles{env(kTlsCertEnv), env(kTlsKeyEnv), env(kTlsCaEnv)};
  }
  if (f.ca.empty() && f.cert.empty()) {
    if (!f.key.empty()) {
      return Status(ErrorCode::INVALID_PARAMS, "TLS: a key needs its certificate (tls_cert_file)");
    }
    return std::shared_ptr<const TlsContext>();
  }
  return TlsContext::Load(f, TlsContext::Side::kClient);
}

}  // namespace granary::security
