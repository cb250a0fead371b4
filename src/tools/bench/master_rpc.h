// tools/bench/master_rpc.h - how the benches talk to a master directly (raw gRPC, no Client).
//
// MasterStub opens its own connection, so each bench thread measures its own channel; RpcContext
// gives a call a deadline, so a stuck master ends a bench instead of hanging it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "granary/proto/master.grpc.pb.h"
#include "proto/rpc_util.h"

namespace granary::bench {

inline std::unique_ptr<proto::Master::Stub> MasterStub(const std::string& target) {
  return proto::Master::NewStub(rpc::MakeChannel(target, /*own_connection=*/true));
}

inline std::unique_ptr<grpc::ClientContext> RpcContext(int deadline_ms) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  rpc::SetDeadline(*ctx, deadline_ms);
  return ctx;
}

}  // namespace granary::bench
