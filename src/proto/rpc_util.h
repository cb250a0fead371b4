// proto/rpc_util.h - small helpers every gRPC client of the master uses: one channel setup, one
// deadline rule, one mapping of transport failures to Granary codes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "granary/status.h"

namespace granary::rpc {

// gRPC metadata carrying the cluster's secret (security/secret.h): "authorization: Bearer
// <secret>" (RFC 6750's form). The master's check reads the same two constants.
inline constexpr std::string_view kAuthMetadataKey = "authorization";
inline constexpr std::string_view kBearerPrefix = "Bearer ";

// Puts the secret's metadata on every call of a channel, so no call site can forget it.
class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(std::shared_ptr<const std::string> value) : value_(std::move(value)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(std::string(kAuthMetadataKey), *value_);
    }
    methods->Proceed();
  }

 private:
  std::shared_ptr<const std::string> value_;
};

class BearerInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& secret)
      : value_(std::make_shared<const std::string>(std::string(kBearerPrefix) + secret)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(value_);
  }

 private:
  std::shared_ptr<const std::string> value_;
};

// own_connection: do not share a TCP connection with other channels to the same target (gRPC
// pools them by default), e.g. one connection per benchmark thread.
// secret: presented on every call (empty: none).
// credentials: the channel's TLS (security/tls.h); null: plain TCP.
inline std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& target, bool own_connection = false, const std::string& secret = "",
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr) {
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
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  if (secret.empty()) return grpc::CreateCustomChannel(target, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<BearerInterceptorFactory>(secret));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                std::move(creators));
}

inline void SetDeadline(grpc::ClientContext& ctx, int timeout_ms) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

// A Granary error a whole call ends with (the master refusing it, e.g. a standby's
// UNAVAILABLE_IN_CURRENT_MODE), carried in the gRPC status: "granary:<code>:<message>", so the
// client gets the code back (FromGrpc). A refusal applied nothing (FAILED_PRECONDITION,
// UNAUTHENTICATED for a missing or wrong secret, PERMISSION_DENIED for a role or tenant that may
// not make the call); any other code means the call may have been applied (ABORTED).
inline constexpr std::string_view kCodePrefix = "granary:";
inline grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  const bool refused = s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_MODE ||
                       s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  const grpc::StatusCode code =
      s.code() == ErrorCode::UNAUTHENTICATED     ? grpc::StatusCode::UNAUTHENTICATED
      : s.code() == ErrorCode::PERMISSION_DENIED ? grpc::StatusCode::PERMISSION_DENIED
      : refused                                  ? grpc::StatusCode::FAILED_PRECONDITION
                                                 : grpc::StatusCode::ABORTED;
  return grpc::Status(code,
                      std::string(kCodePrefix) + std::to_string(static_cast<int32_t>(s.code())) +
                          ":" + s.message());
}

// "granary:<code>:<message>" -> that Status; anything else -> nullopt.
inline std::optional<Status> ParseCodedMessage(std::string_view text) {
  if (text.substr(0, kCodePrefix.size()) != kCodePrefix) return std::nullopt;
  text.remove_prefix(kCodePrefix.size());
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon > 12) return std::nullopt;
  int32_t code = 0;
  bool negative = text[0] == '-';
  for (size_t i = negative ? 1 : 0; i < colon; ++i) {
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    code = code * 10 + (text[i] - '0');
  }
  if (negative) code = -code;
  if (code == 0) return std::nullopt;
  return Status(ErrorCodeFromInt(code), std::string(text.substr(colon + 1)));
}

// A failed RPC (the call itself, not a per-key code) as a Status.
inline Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  if (auto coded = ParseCodedMessage(s.error_message())) {
    return Status(coded->code(), what + ": " + coded->message());
  }
  ErrorCode code = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? ErrorCode::RPC_TIMEOUT
                                                                         : ErrorCode::RPC_FAIL;
  return Status(code, what + ": " + s.error_message());
}

inline Status FromCode(int32_t code, const std::string& message) {
  if (code == 0) return Status::Ok();
  return Status(ErrorCodeFromInt(code), message);
}

}  // namespace granary::rpc
