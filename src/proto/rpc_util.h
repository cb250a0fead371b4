// proto/rpc_util.h - small helpers every gRPC client of the master uses: one channel setup, one
// deadline rule, one mapping of transport failures to Granary codes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "granary/status.h"

namespace granary::rpc {

// own_connection: do not share a TCP connection with other channels to the same target (gRPC
// pools them by default), e.g. one connection per benchmark thread.
inline std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                                  bool own_connection = false) {
  grpc::ChannelArguments args;
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // Reconnect quickly after a master restart instead of gRPC's default backoff of up to 2 min.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // gRPC rate-limits re-resolving the name after a failure (30 s by default), which kept a
  // channel that saw the master down broken for ~10 s after it came back.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 100);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

inline void SetDeadline(grpc::ClientContext& ctx, int timeout_ms) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

// A failed RPC (the call itself, not a per-key code) as a Status.
inline Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  ErrorCode code = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? ErrorCode::RPC_TIMEOUT
                                                                         : ErrorCode::RPC_FAIL;
  return Status(code, what + ": " + s.error_message());
}

inline Status FromCode(int32_t code, const std::string& message) {
  if (code == 0) return Status::Ok();
  return Status(ErrorCodeFromInt(code), message);
}

}  // namespace granary::rpc
