// client/fast_channel.h - calls to the master's fast port (proto/fast_frame.h): one request frame,
// one reply frame, on a pool of persistent TCP connections.
//
// Promise: every call ends within about timeout_ms: one deadline, taken when the call begins,
// bounds resolving, connecting (each address in turn), sending, receiving and any retry.
// A connection is reused only after a complete, matching reply, so a reply is never read by
// the wrong call. A call is never sent twice unless the caller says it is idempotent; the one
// exception is a send that the kernel refused outright (nothing left this process), which is
// retried once on a new connection. `*sent` tells the caller whether the master may have seen
// the request: when false, the caller may use another transport without risk of applying twice.
// A master over its connection cap answers UNAVAILABLE_IN_CURRENT_STATUS with `*sent` false:
// the channel itself is sound, only this call should take another transport.
// With a local socket name (the master's, for clients on its host), each new connection tries
// it first and falls back to host:port; once it has failed, the channel uses host:port only
// (a client elsewhere never finds the name: it is abstract, per network namespace, random).
// Ownership: owns its sockets; closes them on destruction.
// Thread safety: Call from any number of threads; each call holds one connection alone.
#pragma once

#include <google/protobuf/message.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "granary/status.h"
#include "common/byte_stream.h"
#include "proto/fast_frame.h"
#include "security/tls.h"

struct addrinfo;

namespace granary::client {

using SteadyTime = std::chrono::steady_clock::time_point;

// A connected non-blocking TCP socket (TCP_NODELAY) to the first of `addresses` (a getaddrinfo
// list) that accepts by `deadline`, trying each in turn: `localhost` may list ::1 before the
// 127.0.0.1 a master listens on. Exposed for tests; FastChannel resolves and calls it.
Result<int> ConnectFirst(const addrinfo* addresses, SteadyTime deadline, const std::string& what);

class FastChannel {
 public:
  // secret: presented in a hello on each new connection (security/fast_hello.h); empty: none.
  // tls: each connection is TLS from this client context (null: plain TCP).
  // local_socket: the master's ListSegmentsResponse.fast_local_socket (empty: none); never
  // used with tls.
  // spin_wait_us: a call waits this long awake for its reply before it sleeps on the socket
  // (common/spin_wait.h: bounded, and only as many waiters spin as the process's quota).
  FastChannel(std::string host, uint16_t port, int timeout_ms, std::string secret = "",
              std::shared_ptr<const security::TlsContext> tls = nullptr,
              std::string local_socket = "", uint32_t spin_wait_us = 0);
  ~FastChannel();
  FastChannel(const FastChannel&) = delete;
  FastChannel& operator=(const FastChannel&) = delete;

  Status Call(fast::Method method, const google::protobuf::Message& request,
              google::protobuf::Message* response, bool idempotent, bool* sent);

  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  // Whether new connections still go to the local socket (false: none, or it failed).
  bool local() const { return !local_socket_.empty() && !local_failed_.load(); }

 private:
  enum class Stage { kNotSent, kSent, kDone };
  // One attempt on `fd`; kDone on success, otherwise how far it got (the status says why).
  Stage Attempt(net::ByteStream& conn, const std::string& frame, uint32_t request_id,
                uint8_t method, google::protobuf::Message* response, SteadyTime deadline,
                Status* status);
  uint32_t SpinBudget(SteadyTime deadline) const;  // spin_wait_us_, within the call's deadline
  std::unique_ptr<net::ByteStream> TakeIdle();  // a pooled connection still open, or null
  void GiveBack(std::unique_ptr<net::ByteStream> conn);
  Result<std::unique_ptr<net::ByteStream>> Connect(SteadyTime deadline);

  std::string host_;
  uint16_t port_;
  int timeout_ms_;
  const std::string secret_;
  const std::shared_ptr<const security::TlsContext> tls_;
  const std::string local_socket_;
  const uint32_t spin_wait_us_;
  std::atomic<bool> local_failed_{false};
  std::mutex mu_;
  std::vector<std::unique_ptr<net::ByteStream>> idle_;
  uint32_t next_id_ = 1;
};

}  // namespace granary::client
