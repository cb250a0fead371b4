// etcd/etcd_auth.h - etcd's user and password for one client (etcd's `auth enable`): a token from
// Auth/Authenticate, which the channel's interceptor puts on every call and stream ("token"
// metadata), taken again when etcd says it is no longer valid (a simple token expires after it
// idles, and every token dies with a restarted etcd).
//
// Promise: EnsureToken returns OK with a token etcd has not refused, authenticating (once, by
// its deadline) when there is none; a wrong user or password is ETCD_OPERATION_ERROR with etcd's
// message, never the password. Any call or stream etcd refuses for its token (Refused) makes the
// next EnsureToken authenticate again. Authenticate itself never carries a token.
// Ownership: shared by the client, its watches and keepalives and the channel's interceptor.
// Thread safety: every method from any thread; one Authenticate runs at a time.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <string>

#include "granary/status.h"

namespace granary::etcd {

class EtcdAuth {
 public:
  EtcdAuth(std::string user, std::string password)
      : user_(std::move(user)), password_(std::move(password)) {}

  // The channel Authenticate goes over (the client's own). Before any EnsureToken.
  void Attach(const std::shared_ptr<grpc::Channel>& channel);
  Status EnsureToken(std::chrono::system_clock::time_point deadline);
  std::string token() const;
  // etcd refused `token` (a call's status said so): the next EnsureToken authenticates.
  void Refuse(const std::string& token);
  // Whether etcd refused a call for its token: UNAUTHENTICATED ("invalid auth token"), or a call
  // that carried none ("user name is empty").
  static bool Refused(const grpc::Status& status);
  // The interceptor that carries the token (the channel's; see MakeEtcdChannel).
  static std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> Interceptor(
      std::shared_ptr<EtcdAuth> auth);

  const std::string& user() const { return user_; }

 private:
  const std::string user_;
  const std::string password_;
  std::mutex authenticate_mu_;  // one Authenticate at a time
  mutable std::mutex mu_;
  std::shared_ptr<grpc::Channel> channel_;
  std::string token_;  // empty: none, or refused
};

}  // namespace granary::etcd
