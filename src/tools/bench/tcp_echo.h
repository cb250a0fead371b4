// tools/bench/tcp_echo.h - a loopback echo server: the raw TCP round trip that RPC latencies are
// compared with (granary-bench master's `tcp` case).
//
// Promise: echoes every byte back on each accepted connection, one thread per connection, until
// destroyed; the destructor shuts every socket down and joins every thread.
// Ownership: owns its sockets and threads. Thread safety: construct and destroy from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "granary/status.h"

namespace granary::bench {

class TcpEcho {
 public:
  static Result<std::unique_ptr<TcpEcho>> Start();  // on 127.0.0.1, a free port
  ~TcpEcho();
  uint16_t port() const { return port_; }

 private:
  TcpEcho(int fd, uint16_t port);
  void AcceptLoop();

  int listen_fd_;
  uint16_t port_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

}  // namespace granary::bench
