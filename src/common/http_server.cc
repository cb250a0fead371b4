#include "common/http_server.h"

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/httplib_abi.h"

namespace granary {

namespace {

// httplib routes are std::regex patterns; escaping makes "/status.json" match only itself.
std::string ExactPathPattern(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (std::strchr(".^$|()[]{}*+?\\", c) != nullptr) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

struct HttpServer::Impl {
  httplib::Server server;
  std::mutex mu;  // orders Start against Stop
  bool started = false;
  std::atomic<uint16_t> port{0};
  std::atomic<bool> listen_returned{false};
  std::thread thread;
};

HttpServer::HttpServer() : impl_(std::make_unique<Impl>()) {
  // Plain SO_REUSEADDR (restart over TIME_WAIT) instead of httplib's default SO_REUSEPORT, with
  // which a second server would bind the same port and steal half the connections.
  impl_->server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // httplib calls this for every status >= 400, including our handlers' own; keep their bodies.
  impl_->server.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.status != 404) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        res.set_content("not found: " + req.path + "\n", "text/plain; charset=utf-8");
        return httplib::Server::HandlerResponse::Handled;
      }));
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Get(std::string path, std::function<HttpResponse()> handler) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->started) {
    std::fprintf(stderr, "HttpServer: Get(\"%s\") after Start()\n", path.c_str());
    std::abort();
  }
  impl_->server.Get(ExactPathPattern(path),
                    [fn = std::move(handler)](const httplib::Request&, httplib::Response& res) {
                      HttpResponse r;
                      try {
                        r = fn();
                      } catch (const std::exception& e) {
                        r = HttpResponse{500, "text/plain; charset=utf-8",
                                         std::string("internal error: ") + e.what() + "\n"};
                      } catch (...) {
                        r = HttpResponse{500, "text/plain; charset=utf-8", "internal error\n"};
                      }
                      res.status = r.status;
                      res.set_content(r.body, r.content_type);
                    });
}

Status HttpServer::Start(const std::string& host, uint16_t port) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->started) {
    return Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, "HTTP server already started");
  }
  impl_->started = true;
  httplib::Server& server = impl_->server;
  const std::string where = host + ":" + std::to_string(port);
  errno = 0;
  int bound = -1;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (server.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound <= 0) {
    // httplib reports only failure; errno from its bind()/listen() is usually still there.
    const int err = errno;
    std::string msg = "HTTP server cannot listen on " + where;
    msg += err != 0 ? std::string(": ") + std::strerror(err) : " (port in use or host not local)";
    return Status(ErrorCode::INVALID_PARAMS, std::move(msg));
  }
  impl_->port.store(static_cast<uint16_t>(bound));
  impl_->thread = std::thread([impl = impl_.get()] {
    impl->server.listen_after_bind();
    impl->listen_returned.store(true);
  });
  // The socket already accepts connections; waiting for is_running() also makes a Stop() right
  // after Start() effective (httplib's stop() is a no-op until its accept loop is running).
  while (!server.is_running() && !impl_->listen_returned.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server.is_running()) {
    impl_->thread.join();
    impl_->port.store(0);
    return Status(ErrorCode::INTERNAL_ERROR, "HTTP server on " + where + " stopped at start");
  }
  return Status::Ok();
}

uint16_t HttpServer::port() const { return impl_->port.load(); }

void HttpServer::Stop() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace granary
