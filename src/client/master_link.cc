#include "client/master_link.h"

#include "proto/rpc_util.h"

namespace granary::client {

namespace {
// How long a client stays on gRPC after the fast port failed before asking for it again.
constexpr auto kLookupBackoff = std::chrono::seconds(1);
// How long a master's answer "no fast port" (--fast-path false) is believed: long enough that a
// client of such a master does not ask every second, short enough to notice a reconfigured one.
constexpr auto kNoFastPortRecheck = std::chrono::seconds(30);

// "host:port" or "[v6]:port" -> host; "" for anything else (dns:///, unix:, etcd://).
std::string HostOf(const std::string& address) {
  if (address.find("://") != std::string::npos || address.rfind("unix:", 0) == 0) return "";
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return "";
  std::string host = address.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}
}  // namespace

MasterLink::MasterLink(proto::Master::Stub* stub, std::string master_address, int rpc_timeout_ms,
                       Path path)
    : stub_(stub), host_(HostOf(master_address)), timeout_ms_(rpc_timeout_ms), path_(path) {}

std::shared_ptr<FastChannel> MasterLink::Channel() {
  if (path_ == Path::kGrpc || host_.empty()) return nullptr;
  using Clock = std::chrono::steady_clock;
  {
    std::unique_lock lock(mu_);
    if (looking_up_ && path_ == Path::kFast) {  // benchmarks: wait for the answer, bounded
      looked_up_.wait_for(lock, std::chrono::milliseconds(timeout_ms_),
                          [&] { return !looking_up_; });
    }
    if (channel_ || looking_up_ || Clock::now() < next_lookup_) return channel_;
    looking_up_ = true;
  }
  // Asked without the lock: a slow or unreachable master must not stall the calls (or Forget)
  // of other threads; they use gRPC until the answer is in.
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, timeout_ms_);
  proto::ListSegmentsResponse resp;
  const bool answered = stub_->ListSegments(&ctx, proto::ListSegmentsRequest(), &resp).ok();
  std::shared_ptr<FastChannel> found;
  if (answered && resp.fast_port()) {
    found = std::make_shared<FastChannel>(host_, static_cast<uint16_t>(resp.fast_port()),
                                          timeout_ms_);
  }
  std::lock_guard lock(mu_);
  looking_up_ = false;
  channel_ = found;  // only a lookup sets channel_, and one runs at a time
  if (!found) next_lookup_ = Clock::now() + (answered ? kNoFastPortRecheck : kLookupBackoff);
  looked_up_.notify_all();
  return channel_;
}

void MasterLink::Forget(const std::shared_ptr<FastChannel>& broken) {
  std::lock_guard lock(mu_);
  if (channel_ != broken) return;  // another thread already did
  channel_.reset();
  next_lookup_ = std::chrono::steady_clock::now() + kLookupBackoff;
}

uint16_t MasterLink::FastPort() {
  auto c = Channel();
  return c ? c->port() : 0;
}

template <typename Req, typename Resp>
Status MasterLink::Call(fast::Method method, const Req& req, Resp* resp, bool idempotent,
                        GrpcMethod<Req, Resp> grpc_method, const char* what) {
  if (auto channel = Channel()) {
    bool sent = false;
    Status s = channel->Call(method, req, resp, idempotent, &sent);
    if (s.ok() || sent) {
      if (!s.ok() && s.code() != ErrorCode::RPC_TIMEOUT) Forget(channel);
      return s.ok() ? s : Status(s.code(), std::string(what) + ": " + s.message());
    }
    // Nothing was sent, so gRPC may carry this call. A master over its connection cap is
    // reachable: keep the channel for the next call instead of tearing it down.
    if (s.code() != ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS) Forget(channel);
    resp->Clear();
  }
  if (path_ == Path::kFast) {
    return Status(ErrorCode::RPC_FAIL, std::string(what) + ": the master's fast port is unavailable");
  }
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, timeout_ms_);
  return rpc::FromGrpc((stub_->*grpc_method)(&ctx, req, resp), what);
}

Status MasterLink::Ping(const proto::PingRequest& req, proto::PingResponse* resp) {
  return Call(fast::Method::kPing, req, resp, true, &proto::Master::Stub::Ping, "ping");
}

Status MasterLink::PutStart(const proto::BatchPutStartRequest& req,
                            proto::BatchPutStartResponse* resp) {
  return Call(fast::Method::kPutStart, req, resp, false, &proto::Master::Stub::BatchPutStart,
              "put start");
}

Status MasterLink::PutEnd(const proto::BatchPutEndRequest& req, proto::BatchStatusResponse* resp) {
  return Call(fast::Method::kPutEnd, req, resp, false, &proto::Master::Stub::BatchPutEnd,
              "put end");
}

Status MasterLink::Reserve(const proto::ReserveRequest& req, proto::ReserveResponse* resp) {
  return Call(fast::Method::kReserve, req, resp, false, &proto::Master::Stub::Reserve, "reserve");
}

Status MasterLink::PutCommit(const proto::BatchPutCommitRequest& req,
                             proto::BatchStatusResponse* resp) {
  return Call(fast::Method::kPutCommit, req, resp, false, &proto::Master::Stub::BatchPutCommit,
              "put commit");
}

Status MasterLink::ReleaseReservations(const proto::ReleaseReservationsRequest& req,
                                       proto::BatchStatusResponse* resp) {
  return Call(fast::Method::kReleaseReservations, req, resp, false,
              &proto::Master::Stub::ReleaseReservations, "release reservations");
}

Status MasterLink::PutRevoke(const proto::BatchPutRevokeRequest& req,
                             proto::BatchStatusResponse* resp) {
  return Call(fast::Method::kPutRevoke, req, resp, false, &proto::Master::Stub::BatchPutRevoke,
              "put revoke");
}

Status MasterLink::GetReplicaList(const proto::BatchGetReplicaListRequest& req,
                                  proto::BatchGetReplicaListResponse* resp) {
  return Call(fast::Method::kGetReplicaList, req, resp, false,
              &proto::Master::Stub::BatchGetReplicaList, "get replica list");
}

Status MasterLink::FinishRead(const proto::BatchFinishReadRequest& req,
                              proto::BatchStatusResponse* resp) {
  return Call(fast::Method::kFinishRead, req, resp, false, &proto::Master::Stub::BatchFinishRead,
              "finish read");
}

Status MasterLink::Exist(const proto::BatchExistRequest& req, proto::BatchExistResponse* resp) {
  return Call(fast::Method::kExist, req, resp, true, &proto::Master::Stub::BatchExist, "exist");
}

}  // namespace granary::client
