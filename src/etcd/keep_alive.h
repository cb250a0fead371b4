// etcd/keep_alive.h - KeepAlive over one LeaseKeepAlive stream (see etcd_client.h).
//
// Promise: Renew() sends one keepalive and waits for its answer, both bounded by the client's
// timeout. The stream opens at the first Renew(); one that broke since the last Renew() is
// re-opened once within the call. A deadline leaves the stream closed for the next Renew() (an
// answer that came late would otherwise be read as the next call's).
// Ownership: owns its stream; shares the client's channel.
// Thread safety: Renew() from any thread, one at a time (a mutex); destroy after the last returns.
#pragma once

#include <memory>
#include <mutex>

#include "etcd/bounded_stream.h"
#include "etcd/etcd_client.h"
#include "etcd/etcd_internal.h"

namespace granary::etcd {

class KeepAliveImpl final : public KeepAlive {
 public:
  KeepAliveImpl(std::shared_ptr<grpc::Channel> channel, int64_t lease_id, int timeout_ms,
                std::shared_ptr<EtcdAuth> auth = nullptr);
  Result<int64_t> Renew() override;

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<EtcdAuth> auth_;  // null: no user
  std::unique_ptr<pb::Lease::Stub> stub_;
  const int64_t lease_id_;
  const int timeout_ms_;
  std::mutex mu_;  // one Renew at a time: a stream carries one exchange at a time
  BoundedStream<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse> stream_;
};

}  // namespace granary::etcd
