// security/tls.h - TLS for the control plane (docs/security.md): gRPC's credentials and the fast
// port's (and the HA stream's) sockets, from one set of PEM files.
//
// Promise: Load refuses, with INVALID_PARAMS naming the file and the fault, a missing or
// unreadable file, a key readable by group or others (like the secret files: mode 0600 or 0400),
// a certificate that does not match its key, and a server without a certificate. A server given
// a CA asks every client for a certificate that CA signed and refuses a connection without one
// (mutual TLS); without a CA it asks none. A client verifies the server's certificate against its
// CA (the system's roots when none is given) and the name or address it dialled, and presents its
// own certificate when it has one. TLS 1.2 is the least either side accepts. Accept and Connect
// return by their deadline; a failed handshake is UNAUTHENTICATED with OpenSSL's reason (never a
// key). A stream's send and receive may run on two threads at once (each OpenSSL call holds the
// stream's lock; no lock is held while waiting).
// Ownership: a context is immutable once loaded and shared (shared_ptr) by every connection made
// from it; a stream owns its SSL and, as its constructor says, its descriptor.
// Thread safety: a context from any thread; a stream as net::ByteStream.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/byte_stream.h"
#include "granary/status.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace granary::security {

// --tls-cert / --tls-key / --tls-ca (PEM files).
struct TlsFiles {
  std::string cert;  // a certificate chain, leaf first
  std::string key;   // its private key (mode 0600 or 0400)
  std::string ca;    // the CA bundle that verifies the other side
  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// The environment variables clients read when no option names the files (CLI, Python, Mooncake).
inline constexpr const char* kTlsCaEnv = "GRANARY_TLS_CA";
inline constexpr const char* kTlsCertEnv = "GRANARY_TLS_CERT";
inline constexpr const char* kTlsKeyEnv = "GRANARY_TLS_KEY";

class TlsContext {
 public:
  enum class Side { kServer, kClient };
  static Result<std::shared_ptr<const TlsContext>> Load(const TlsFiles& files, Side side);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // The server's handshake on an accepted socket (made non-blocking). With owns_fd, the stream
  // owns fd, also when the handshake fails (it is closed then).
  Result<std::unique_ptr<net::ByteStream>> Accept(int fd, bool owns_fd, net::SteadyTime deadline) const;
  // The client's handshake on a connected socket, verifying `host` (a name or an address);
  // the stream owns fd, also when the handshake fails.
  Result<std::unique_ptr<net::ByteStream>> Connect(int fd, const std::string& host,
                                                   net::SteadyTime deadline) const;

  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;
  bool mutual() const { return side_ == Side::kServer && !ca_pem_.empty(); }

 private:
  TlsContext() = default;
  SSL_CTX* ctx_ = nullptr;
  Side side_ = Side::kClient;
  std::string cert_pem_, key_pem_, ca_pem_;
};

// The client's side from `files`, else from the environment (kTls*Env), where either names a CA
// or a certificate; null (no TLS) where none does. A key without a certificate, or a
// certificate without a key, is INVALID_PARAMS.
Result<std::shared_ptr<const TlsContext>> LoadClientTls(const TlsFiles& files);

}  // namespace granary::security
