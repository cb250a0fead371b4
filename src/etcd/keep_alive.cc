#include "etcd/keep_alive.h"

namespace granary::etcd {

KeepAliveImpl::KeepAliveImpl(std::shared_ptr<grpc::Channel> channel, int64_t lease_id,
                             int timeout_ms, std::shared_ptr<EtcdAuth> auth)
    : channel_(std::move(channel)),
      auth_(std::move(auth)),
      stub_(pb::Lease::NewStub(channel_)),
      lease_id_(lease_id),
      timeout_ms_(timeout_ms),
      stream_([this](grpc::ClientContext* ctx, grpc::CompletionQueue* cq) {
        RequireLeader(ctx);
        return stub_->PrepareAsyncLeaseKeepAlive(ctx, cq);
      }) {}

Result<int64_t> KeepAliveImpl::Renew() {
  std::lock_guard lock(mu_);
  const std::string what = "etcd KeepAlive of lease " + std::to_string(lease_id_);
  const GrpcTime deadline = DeadlineIn(timeout_ms_);
  pb::LeaseKeepAliveRequest request;
  request.set_id(lease_id_);
  // Two rounds at most: a stream left from an earlier call may have broken since (etcd member
  // restarted, connection moved); a freshly opened one that fails is the answer.
  for (int round = 0; round < 2; ++round) {
    const bool fresh = !stream_.is_open();
    if (fresh && auth_ != nullptr) {
      if (Status s = auth_->EnsureToken(deadline); !s.ok()) return Status(s.code(), what + ": " + s.message());
    }
    StreamStep step = fresh ? stream_.Open(deadline) : StreamStep::kOk;
    if (step == StreamStep::kOk) step = stream_.Write(request, deadline);
    pb::LeaseKeepAliveResponse response;
    if (step == StreamStep::kOk) step = stream_.Read(&response, deadline);
    if (step == StreamStep::kOk) {
      // etcd answers TTL 0 for a lease it does not know (expired or revoked).
      if (response.ttl() <= 0) {
        return Status(ErrorCode::OBJECT_NOT_FOUND, what + ": etcd does not know the lease");
      }
      return response.ttl();
    }
    const grpc::Status why = stream_.Close();
    if (step == StreamStep::kTimeout) return StreamTimeout(what, *channel_, timeout_ms_);
    if (fresh) {
      if (why.ok()) return Status(ErrorCode::ETCD_OPERATION_ERROR, what + ": stream ended");
      return FromGrpc(why, what, *channel_, timeout_ms_);
    }
  }
  return Status(ErrorCode::ETCD_OPERATION_ERROR, what + ": stream failed twice");
}

}  // namespace granary::etcd
