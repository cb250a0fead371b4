// etcd/etcd_internal.h - what the client, its watches and its keepalives share: the channel's
// settings, the one mapping of gRPC outcomes to Granary codes, and proto <-> struct conversions.
// Not part of the API: only src/etcd includes it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "etcd/etcd_auth.h"
#include "etcd/etcd_client.h"
#include "granary/etcd/etcd_v3.grpc.pb.h"
#include "granary/status.h"

namespace granary::etcd {

namespace pb = ::etcdserverpb;

// gRPC's deadlines are wall-clock time points.
using GrpcTime = std::chrono::system_clock::time_point;

inline GrpcTime DeadlineIn(int timeout_ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms);
}

// Marks a stream "only while the member has a leader" (etcd's "hasleader" metadata): a member cut
// off from its cluster then refuses the stream, and ends an open one after a few election
// timeouts, instead of keeping a watch that can no longer see changes.
inline void RequireLeader(grpc::ClientContext* ctx) { ctx->AddMetadata("hasleader", "true"); }

// One channel over every address of `target` (see ResolveTarget), pick_first: a call goes to one
// member and moves to the next when that one's connection fails.
// With `auth`, every call but Authenticate carries its token.
std::shared_ptr<grpc::Channel> MakeEtcdChannel(const std::string& target, int timeout_ms,
                                               std::shared_ptr<EtcdAuth> auth = nullptr);

// What every call's status means to a caller. DEADLINE_EXCEEDED is RPC_TIMEOUT when the channel
// was connected (etcd was slow, or cut off after connecting) and ETCD_OPERATION_ERROR "no etcd
// member reachable" when it was not; NOT_FOUND (a lease etcd does not know) is OBJECT_NOT_FOUND;
// every other failure is ETCD_OPERATION_ERROR with etcd's (or gRPC's) message.
Status FromGrpc(const grpc::Status& status, const std::string& what, grpc::Channel& channel,
                int timeout_ms);

// A deadline that passed on a stream step, by the same rule as FromGrpc's DEADLINE_EXCEEDED.
Status StreamTimeout(const std::string& what, grpc::Channel& channel, int timeout_ms);

KeyValue FromProto(const ::mvccpb::KeyValue& kv);

// The range_end that makes [prefix, range_end) every key starting with prefix (etcd's rule: the
// prefix with its last byte below 0xff incremented; "\0" for an empty or all-0xff prefix).
std::string PrefixRangeEnd(const std::string& prefix);

}  // namespace granary::etcd
