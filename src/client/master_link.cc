#include "client/master_link.h"

#include <thread>

#include "etcd/cluster_keys.h"
#include "proto/rpc_util.h"

namespace granary::client {

namespace {
using SteadyClock = std::chrono::steady_clock;
// How long a client stays on gRPC after the fast port failed before asking for it again.
constexpr auto kLookupBackoff = std::chrono::seconds(1);
// How long a master's answer "no fast port" (--fast-path false) is believed: long enough that a
// client of such a master does not ask every second, short enough to notice a reconfigured one.
constexpr auto kNoFastPortRecheck = std::chrono::seconds(30);
// A leader without a synchronous standby yet refuses changes for a moment (a failover).
constexpr auto kBusyRetry = std::chrono::milliseconds(50);
// Between two tries at a leader through a failover.
constexpr auto kFailoverRetry = std::chrono::milliseconds(10);

// "host:port" or "[v6]:port" -> host; "" for anything else (dns:///, unix:).
std::string PlainHost(const std::string& address) {
  if (address.find("://") != std::string::npos || address.rfind("unix:", 0) == 0) return "";
  return etcd::HostOf(address);
}
}  // namespace

MasterLink::MasterLink(std::shared_ptr<MasterLocator> locator, int rpc_timeout_ms, Path path,
                       uint32_t spin_wait_us)
    : locator_(std::move(locator)), timeout_ms_(rpc_timeout_ms), path_(path),
      spin_wait_us_(spin_wait_us) {}

std::shared_ptr<FastChannel> MasterLink::Channel(const Target& target) {
  const std::string host = PlainHost(target.address);
  if (path_ == Path::kGrpc || host.empty()) return nullptr;
  {
    std::unique_lock lock(mu_);
    if (channel_generation_ != target.generation) {  // a new master: what we knew is void
      channel_.reset();
      channel_generation_ = target.generation;
      next_lookup_ = {};
    }
    if (target.fast_port != 0) {  // the leader record named it: no lookup
      if (!channel_) {
        channel_ = std::make_shared<FastChannel>(host, target.fast_port, timeout_ms_,
                                                 locator_->secret(), locator_->tls(),
                                                 target.fast_local, spin_wait_us_);
      }
      return channel_;
    }
    if (looking_up_ && path_ == Path::kFast) {  // benchmarks: wait for the answer, bounded
      looked_up_.wait_for(lock, std::chrono::milliseconds(timeout_ms_),
                          [&] { return !looking_up_; });
    }
    if (channel_ || looking_up_ || SteadyClock::now() < next_lookup_) return channel_;
    looking_up_ = true;
  }
  // Asked without the lock: a slow or unreachable master must not stall the calls (or Forget)
  // of other threads; they use gRPC until the answer is in.
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, timeout_ms_);
  proto::ListSegmentsResponse resp;
  const bool answered = target.stub->ListSegments(&ctx, proto::ListSegmentsRequest(), &resp).ok();
  std::shared_ptr<FastChannel> found;
  if (answered && resp.fast_port()) {
    found = std::make_shared<FastChannel>(host, static_cast<uint16_t>(resp.fast_port()),
                                          timeout_ms_, locator_->secret(), locator_->tls(),
                                          resp.fast_local_socket(), spin_wait_us_);
  }
  std::lock_guard lock(mu_);
  looking_up_ = false;
  if (channel_generation_ == target.generation) {
    channel_ = found;  // only a lookup sets channel_ for a looked-up port, one at a time
    if (!found) next_lookup_ = SteadyClock::now() + (answered ? kNoFastPortRecheck : kLookupBackoff);
  }
  looked_up_.notify_all();
  return found;
}

void MasterLink::Forget(const std::shared_ptr<FastChannel>& broken) {
  std::lock_guard lock(mu_);
  if (channel_ != broken) return;  // another thread already did
  channel_.reset();
  next_lookup_ = SteadyClock::now() + kLookupBackoff;
}

uint16_t MasterLink::FastPort() {
  auto target = locator_->Current();
  if (!target) return 0;
  auto c = Channel(*target);
  return c ? c->port() : 0;
}

template <typename Req, typename Resp>
Status MasterLink::CallOnce(const Target& target, fast::Method method, const Req& req,
                            Resp* resp, bool idempotent, GrpcMethod<Req, Resp> grpc_method,
                            const char* what, SteadyClock::time_point deadline, bool* sent) {
  *sent = false;
  if (auto channel = Channel(target)) {
    Status s = channel->Call(method, req, resp, idempotent, sent);
    if (s.ok() || *sent) {
      const bool coded = s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_MODE ||
                         s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS ||
                         s.code() == ErrorCode::PERMISSION_DENIED;
      if (!s.ok() && !coded && s.code() != ErrorCode::RPC_TIMEOUT) Forget(channel);
      return s.ok() ? s : Status(s.code(), std::string(what) + ": " + s.message());
    }
    // The master refused our secret at the hello: gRPC would only be refused too.
    if (s.code() == ErrorCode::UNAUTHENTICATED) {
      Forget(channel);
      return Status(s.code(), std::string(what) + ": " + s.message());
    }
    // Nothing was sent, so gRPC may carry this call. A master over its connection cap is
    // reachable: keep the channel for the next call instead of tearing it down.
    const bool busy = s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
    if (!busy) Forget(channel);
    // An HA leader whose fast port cannot be reached is gone: the next leader takes the call
    // (gRPC to the same host would only fail too, and could not say whether it sent it).
    if (!busy && locator_->follows_etcd()) return s;
    resp->Clear();
  }
  if (path_ == Path::kFast) {
    return Status(ErrorCode::RPC_FAIL, std::string(what) + ": the master's fast port is unavailable");
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + (deadline - SteadyClock::now()));
  const grpc::Status g = (target.stub.get()->*grpc_method)(&ctx, req, resp);
  // gRPC's UNAVAILABLE may come before the call left or after the master took it (it died
  // mid-call): only its coded refusals say for sure that nothing was applied.
  *sent = true;
  return rpc::FromGrpc(g, what);
}

template <typename Req, typename Resp>
Status MasterLink::Call(fast::Method method, const Req& req, Resp* resp, bool idempotent,
                        GrpcMethod<Req, Resp> grpc_method, const char* what) {
  const auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms_);
  Status last;
  for (int attempt = 0;; ++attempt) {  // bounded by the deadline
    Status why;
    auto target = locator_->Current(deadline, &why);
    if (!target) return attempt == 0 ? Status(why.code(), std::string(what) + ": " + why.message())
                                     : last;
    bool sent = false;
    Status s = CallOnce(*target, method, req, resp, idempotent, grpc_method, what, deadline, &sent);
    if (s.ok()) {
      if constexpr (requires { resp->term(); }) {
        if (!locator_->NoteTerm(resp->term())) {
          // A deposed leader applied it (and, synchronous, its successor has it): the outcome is
          // unknown to the caller; only a call that may run twice goes to the next leader.
          locator_->Stale(target->generation);
          s = Status(ErrorCode::RPC_FAIL, std::string(what) + ": answered by a deposed leader "
                                              "(term " + std::to_string(resp->term()) +
                                              "); outcome unknown");
        }
      }
      if (s.ok()) return s;
    }
    last = s;
    // A wrong or missing secret, or a role that may not make the call, is the caller's to fix:
    // no other leader or retry answers it differently.
    if (s.code() == ErrorCode::UNAUTHENTICATED || s.code() == ErrorCode::PERMISSION_DENIED) {
      return s;
    }
    const bool ha = locator_->follows_etcd();
    // Refused as not the leader: nothing applied. A fixed address has no other master to ask.
    const bool refused = s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_MODE;
    const bool busy = s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS && sent;
    // An HA cluster's leader that cannot be reached (or answered late) has died, stepped down or
    // paused: the next one may take the call if it cannot have been applied, or if applying it
    // twice is harmless.
    const bool lost = ha && (!sent || idempotent);
    if (ha && (refused || !sent || s.code() == ErrorCode::RPC_TIMEOUT ||
               s.code() == ErrorCode::RPC_FAIL)) {
      locator_->Stale(target->generation);  // the next call looks the leader up again
    }
    if (!((refused && ha) || busy || lost) || SteadyClock::now() >= deadline) return s;
    // Paced: a failover takes a moment, and etcd names the old leader until it is over.
    std::this_thread::sleep_for(busy ? kBusyRetry : kFailoverRetry);
    resp->Clear();
  }
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
