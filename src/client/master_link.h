// client/master_link.h - how a client makes the master's hot calls: over the fast port when the
// master advertises one (ListSegmentsResponse.fast_port), else over gRPC.
//
// Promise: each call goes over exactly one transport, or over gRPC after the fast port could not
// even be reached (nothing sent), so no call is applied twice by switching transports. A fast
// port that cannot be reached is forgotten and asked for again (over gRPC) after a second, which
// is how a client follows a restarted master to its new port; a master that answers it has no
// fast port is asked again only after kNoFastPortRecheck. A master over its fast-connection cap
// sends that call over gRPC and keeps the channel. The lookup never holds the link's lock: while
// one thread asks, other calls go over gRPC (Path::kFast callers wait for the answer instead).
// Errors come back as the gRPC path reports them (RPC_FAIL, RPC_TIMEOUT), each call bounded by
// rpc_timeout_ms.
// The master is the locator's (master_locator.h): a call refused as "not the leader" (nothing
// applied) goes to the leader the locator finds next, within the same deadline; so does one that
// could not reach an HA cluster's leader, and an idempotent one that reached it and failed. A
// reply from a lower term than one seen is refused (UNAVAILABLE_IN_CURRENT_MODE). A new leader
// gets a new fast channel (its port comes in the leader record).
// Ownership: shares the locator; owns the fast channel.
// Thread safety: every method from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "client/fast_channel.h"
#include "client/master_locator.h"
#include "granary/proto/master.grpc.pb.h"

namespace granary::client {

class MasterLink {
 public:
  enum class Path { kAuto, kGrpc, kFast };  // kFast: fail rather than use gRPC (benchmarks)

  // spin_wait_us: how long a fast-port call waits awake for its reply before sleeping
  // (common/spin_wait.h; 0: it sleeps at once).
  MasterLink(std::shared_ptr<MasterLocator> locator, int rpc_timeout_ms, Path path = Path::kAuto,
             uint32_t spin_wait_us = 0);

  Status Ping(const proto::PingRequest& req, proto::PingResponse* resp);
  Status PutStart(const proto::BatchPutStartRequest& req, proto::BatchPutStartResponse* resp);
  Status PutEnd(const proto::BatchPutEndRequest& req, proto::BatchStatusResponse* resp);
  Status PutRevoke(const proto::BatchPutRevokeRequest& req, proto::BatchStatusResponse* resp);
  Status Reserve(const proto::ReserveRequest& req, proto::ReserveResponse* resp);
  Status PutCommit(const proto::BatchPutCommitRequest& req, proto::BatchStatusResponse* resp);
  Status ReleaseReservations(const proto::ReleaseReservationsRequest& req,
                             proto::BatchStatusResponse* resp);
  Status GetReplicaList(const proto::BatchGetReplicaListRequest& req,
                        proto::BatchGetReplicaListResponse* resp);
  Status FinishRead(const proto::BatchFinishReadRequest& req, proto::BatchStatusResponse* resp);
  Status Exist(const proto::BatchExistRequest& req, proto::BatchExistResponse* resp);

  // The fast port in use (0: gRPC), asking the master first if nobody has yet.
  uint16_t FastPort();
  MasterLocator* locator() const { return locator_.get(); }

 private:
  using Target = MasterLocator::Target;
  template <typename Req, typename Resp>
  using GrpcMethod = grpc::Status (proto::Master::Stub::*)(grpc::ClientContext*, const Req&, Resp*);
  // The one forwarder: the current master (looked up again after a refusal or, for an HA
  // cluster, a master that cannot be reached), then CallOnce.
  template <typename Req, typename Resp>
  Status Call(fast::Method method, const Req& req, Resp* resp, bool idempotent,
              GrpcMethod<Req, Resp> grpc_method, const char* what);
  // One call to one master: its fast port when it has one, else (or when it was not reached)
  // gRPC. *sent: the master may have seen it.
  template <typename Req, typename Resp>
  Status CallOnce(const Target& target, fast::Method method, const Req& req, Resp* resp,
                  bool idempotent, GrpcMethod<Req, Resp> grpc_method, const char* what,
                  std::chrono::steady_clock::time_point deadline, bool* sent);
  std::shared_ptr<FastChannel> Channel(const Target& target);  // null: use gRPC
  void Forget(const std::shared_ptr<FastChannel>& broken);

  std::shared_ptr<MasterLocator> locator_;
  int timeout_ms_;
  Path path_;
  uint32_t spin_wait_us_;
  std::mutex mu_;  // guards the fields below; never held across a call to the master
  std::condition_variable looked_up_;  // a lookup ended (Path::kFast callers wait for it)
  std::shared_ptr<FastChannel> channel_;
  uint64_t channel_generation_ = 0;  // the target channel_ (or the lookup's answer) is for
  bool looking_up_ = false;  // one thread is asking the master for its fast port
  std::chrono::steady_clock::time_point next_lookup_{};
};

}  // namespace granary::client
