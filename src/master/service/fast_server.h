// master/service/fast_server.h - the master's fast port: the hot calls (put start/end/revoke, replica
// list, finish-read, exist, ping) as framed protobuf over plain TCP (proto/fast_frame.h), answered
// by the same MasterService handlers as gRPC. docs/control-path.md says why it exists.
//
// Promise: one thread per connection, at most max_connections (more get a "busy" frame, method 0,
// and are closed before any request is read): the master has few clients (one per engine
// process) and a blocking thread answers with no handoff.
// With a secret (set_authenticator), a connection is served only after its hello: until then it
// may send one frame of at most 4 KiB, must complete it within read_deadline_ms of its accept,
// holds no arena, and at most max_unauthenticated such connections wait at once (a new one
// closes the oldest); each one refused is counted and logged as the authenticator does.
// A hostile frame (bad magic or version, a body over the cap, an unknown method, a body that does
// not parse, a frame cut short or stalled past the read deadline) closes that connection with a
// warning and never touches the others. Stop() is prompt: it shuts every socket down and joins
// every thread.
// Ownership: borrows the service and the metrics registry (they must outlive it).
// Thread safety: Start and Stop from one thread; the connections run on their own threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "common/byte_stream.h"
#include "common/metrics.h"
#include "granary/status.h"
#include "master/service/master_service.h"
#include "proto/fast_frame.h"
#include "security/authenticator.h"
#include "security/tls.h"

namespace granary::master {

class FastServer {
 public:
  struct Options {
    size_t max_connections = 1024;
    int read_deadline_ms = 5'000;          // a frame started must be complete by then
    int idle_timeout_ms = 10 * 60 * 1000;  // a silent connection is closed; the client reopens
    // With a secret: connections that have not said hello yet, at most (a new one over it closes
    // the oldest such), so hostile connections cannot take the slots of clients and standbys.
    size_t max_unauthenticated = 64;
  };
  FastServer(MasterService* service, MetricsRegistry* metrics, Options options);
  FastServer(MasterService* service, MetricsRegistry* metrics)
      : FastServer(service, metrics, Options{}) {}
  ~FastServer();
  FastServer(const FastServer&) = delete;
  FastServer& operator=(const FastServer&) = delete;

  // Listens on host:port (0 picks a free port).
  Status Start(const std::string& host, uint16_t port);
  // Also listens on a local socket (after Start; refused under TLS, whose connections must stay
  // TLS end to end). local_name(): its abstract name without the leading NUL, for clients.
  Status StartLocal();
  const std::string& local_name() const { return local_name_; }
  void Stop();
  uint16_t port() const { return port_; }
  // Serves fast::Method::kReplicate: called on the connection's thread with the connection and
  // the request's body; the connection is closed when it returns. Unset: such a request is
  // answered with an error. Set before Start.
  using StreamHandler = std::function<void(net::ByteStream& conn, std::string_view request)>;
  void set_stream_handler(StreamHandler handler) { stream_handler_ = std::move(handler); }
  // With a secret, a connection's first frame must be a hello that presents it
  // (security/fast_hello.h); anything else, or a wrong secret, is answered UNAUTHENTICATED and
  // the connection closed. Without (null, or no secret), a hello is answered OK whatever it
  // carries. Borrowed; set before Start.
  void set_authenticator(const security::Authenticator* auth) { auth_ = auth; }
  // Every connection is TLS from this server context (security/tls.h): its handshake must end
  // within read_deadline_ms of the accept; a failed one is counted and logged (as a refusal,
  // with an authenticator), and nothing is read. Null: plain TCP. Set before Start.
  void set_tls(std::shared_ptr<const security::TlsContext> tls) { tls_ = std::move(tls); }

 private:
  struct Connection {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
    // Counted among those waiting for their hello (a secret is required, no hello yet, not
    // shed). Accounting only: whether the connection may call is its Serve thread's own.
    std::atomic<bool> awaiting_hello{false};
  };
  void AcceptLoop(int listen_fd, bool local);
  void Serve(Connection* c);
  // Memory one connection reuses from call to call, so a call's messages and reply frame cost
  // no malloc per key: the first block of each call's protobuf arena, and the reply buffer.
  struct Scratch {
    std::unique_ptr<char[]> arena_block;
    std::string out;
  };
  // Answers one frame; false closes the connection (the reason is logged).
  bool Handle(net::ByteStream& conn, uint8_t method, uint32_t request_id, std::string_view body,
              Scratch* scratch, const security::Principal* who);
  void ReapFinished();  // joins connections that ended; holds mu_
  // A hello, or any frame before one on a connection that must authenticate: true keeps the
  // connection (no longer awaiting its hello), false after answering a refusal.
  // Checks the hello's secret; *who: the principal it names.
  bool Hello(Connection* c, net::ByteStream& conn, const fast::Header& h, std::string_view body,
             const security::Principal** who);
  // Before accepting one more: closes the oldest connection still without its hello when
  // max_unauthenticated are waiting. Holds mu_.
  void ShedUnauthenticated();

  MasterService* service_;
  Options options_;
  StreamHandler stream_handler_;
  const security::Authenticator* auth_ = nullptr;
  std::shared_ptr<const security::TlsContext> tls_;
  std::chrono::steady_clock::time_point last_cap_log_{};  // the acceptor's own
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  int local_fd_ = -1;
  std::string local_name_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::thread local_acceptor_;
  std::mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_;
  Counter* accepted_ = nullptr;
  Counter* accepted_local_ = nullptr;
  Counter* refused_ = nullptr;
  Counter* bad_frames_ = nullptr;
  Counter* tls_failures_ = nullptr;
  Gauge* open_ = nullptr;
  Counter* calls_[fast::kMethodCount] = {};  // by method number; the handlers' own metrics count both transports
};

}  // namespace granary::master
