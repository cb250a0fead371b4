// common/http_server.h - a small HTTP server for /metrics, /health and /status-style endpoints.
//
// Promise: routes are exact GET paths (HEAD is answered from the same handler); anything else is
// 404. Start() returns once the socket is listening, or with an error (e.g. the port is taken: the
// socket is not opened with SO_REUSEPORT, so a second process cannot silently share the port).
// Requests are served by cpp-httplib on a thread owned by this object plus httplib's worker pool;
// handlers therefore run on those threads, concurrently, and must be thread-safe. A handler that
// throws yields a 500. Stop() (and the destructor) closes the socket and joins the thread.
//
// Ownership: the server owns its threads and copies of the handlers; handlers must not capture
// anything that dies before the server is stopped.
// Thread safety: Get() and Start() from one thread before serving; Stop() and port() from any.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "granary/status.h"

namespace granary {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  HttpServer();
  ~HttpServer();  // Stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Registers the handler for GET `path` (exact match, e.g. "/metrics"). Only before Start();
  // calling it later aborts, since httplib's route table is not safe to change while serving.
  void Get(std::string path, std::function<HttpResponse()> handler);

  // Binds host:port (port 0 picks a free one) and starts serving. INVALID_PARAMS if the address
  // cannot be bound (port in use, host not local, permission); UNAVAILABLE_IN_CURRENT_STATUS if
  // this server was already started (a server is started at most once).
  Status Start(const std::string& host, uint16_t port);
  uint16_t port() const;  // the bound port; 0 before a successful Start()
  void Stop();            // idempotent; returns after the serving thread has exited

 private:
  struct Impl;  // keeps httplib.h (and its ABI-affecting macros) out of every includer
  std::unique_ptr<Impl> impl_;
};

}  // namespace granary
