#include "etcd/etcd_auth.h"

#include "granary/etcd/etcd_v3.grpc.pb.h"

namespace granary::etcd {

namespace {

constexpr char kAuthenticateMethod[] = "/etcdserverpb.Auth/Authenticate";

class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  TokenInterceptor(std::shared_ptr<EtcdAuth> auth, bool authenticate)
      : auth_(std::move(auth)), authenticate_(authenticate) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (!authenticate_) {
      if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
        sent_ = auth_->token();
        if (!sent_.empty()) methods->GetSendInitialMetadata()->emplace("token", sent_);
      }
      if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_STATUS)) {
        if (const grpc::Status* s = methods->GetRecvStatus(); s && EtcdAuth::Refused(*s)) {
          auth_->Refuse(sent_);
        }
      }
    }
    methods->Proceed();
  }

 private:
  std::shared_ptr<EtcdAuth> auth_;
  const bool authenticate_;
  std::string sent_;
};

class TokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::shared_ptr<EtcdAuth> auth) : auth_(std::move(auth)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    const bool authenticate = std::string(info->method()) == kAuthenticateMethod;
    return new TokenInterceptor(auth_, authenticate);
  }

 private:
  std::shared_ptr<EtcdAuth> auth_;
};

}  // namespace

void EtcdAuth::Attach(const std::shared_ptr<grpc::Channel>& channel) {
  std::lock_guard lock(mu_);
  channel_ = channel;
}

std::string EtcdAuth::token() const {
  std::lock_guard lock(mu_);
  return token_;
}

void EtcdAuth::Refuse(const std::string& token) {
  std::lock_guard lock(mu_);
  if (token_ == token) token_.clear();  // a newer token stays
}

bool EtcdAuth::Refused(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         status.error_message().find("user name is empty") != std::string::npos;
}

Status EtcdAuth::EnsureToken(std::chrono::system_clock::time_point deadline) {
  std::lock_guard one(authenticate_mu_);
  std::shared_ptr<grpc::Channel> channel;
  {
    std::lock_guard lock(mu_);
    if (!token_.empty()) return Status::Ok();  // another thread's Authenticate just ended
    channel = channel_;
  }
  if (!channel) return Status(ErrorCode::INTERNAL_ERROR, "etcd Authenticate: no channel");
  auto stub = ::etcdserverpb::Auth::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  ctx.set_wait_for_ready(true);
  ::etcdserverpb::AuthenticateRequest req;
  req.set_name(user_);
  req.set_password(password_);
  ::etcdserverpb::AuthenticateResponse resp;
  const grpc::Status s = stub->Authenticate(&ctx, req, &resp);
  if (!s.ok()) {
    return Status(s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? ErrorCode::RPC_TIMEOUT
                                                                        : ErrorCode::ETCD_OPERATION_ERROR,
                  "etcd Authenticate as '" + user_ + "': " + s.error_message());
  }
  if (resp.token().empty()) {
    return Status(ErrorCode::ETCD_OPERATION_ERROR,
                  "etcd Authenticate as '" + user_ + "': no token (is etcd's auth enabled?)");
  }
  std::lock_guard lock(mu_);
  token_ = resp.token();
  return Status::Ok();
}

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> EtcdAuth::Interceptor(
    std::shared_ptr<EtcdAuth> auth) {
  return std::make_unique<TokenInterceptorFactory>(std::move(auth));
}

}  // namespace granary::etcd
