// tools/bench/master_rpc.h - how the benches talk to a master directly (raw gRPC, no Client).
//
// MasterStub opens its own connection, so each bench thread measures its own channel; RpcContext
// gives a call a deadline, so a stuck master ends a bench instead of hanging it. Both present the
// secret of $GRANARY_AUTH_TOKEN_FILE when it is set, and speak TLS with $GRANARY_TLS_CA (_CERT,
// _KEY) when that is.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "granary/proto/master.grpc.pb.h"
#include "proto/rpc_util.h"
#include "security/secret.h"
#include "security/tls.h"

namespace granary::bench {

// The cluster's secret from $GRANARY_AUTH_TOKEN_FILE, as clients read it ("" when unset; a file
// that cannot be used ends the bench).
// TLS from $GRANARY_TLS_CA, _CERT, _KEY, as clients read it (null when unset; files that cannot
// be used end the bench).
inline const std::shared_ptr<const security::TlsContext>& BenchTls() {
  static const std::shared_ptr<const security::TlsContext> tls = [] {
    auto loaded = security::LoadClientTls({});
    if (!loaded.ok()) {
      std::fprintf(stderr, "granary-bench: %s\n", loaded.status().message().c_str());
      std::exit(2);
    }
    return *loaded;
  }();
  return tls;
}

inline const std::string& BenchSecret() {
  static const std::string secret = [] {
    auto loaded = security::LoadClientSecret("");
    if (!loaded.ok()) {
      std::fprintf(stderr, "granary-bench: %s\n", loaded.status().message().c_str());
      std::exit(2);
    }
    return *loaded;
  }();
  return secret;
}

inline std::unique_ptr<proto::Master::Stub> MasterStub(const std::string& target) {
  return proto::Master::NewStub(rpc::MakeChannel(
      target, /*own_connection=*/true, BenchSecret(),
      BenchTls() ? BenchTls()->ChannelCredentials() : nullptr));
}

inline std::unique_ptr<grpc::ClientContext> RpcContext(int deadline_ms) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  rpc::SetDeadline(*ctx, deadline_ms);
  return ctx;
}

}  // namespace granary::bench
