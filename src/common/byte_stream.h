// common/byte_stream.h - a connected stream socket as the fast port and the HA stream use it:
// plain TCP here, TLS in security/tls.h, so the framing code above is written once.
//
// Promise: every waiting step returns by its deadline (plus one poll() wake-up); errors are
// values (RPC_TIMEOUT past the deadline, RPC_FAIL for a closed or broken connection). RecvSome
// never waits. Shutdown() may be called from any thread and wakes every waiter promptly.
// Ownership: closes its descriptor on destruction when it owns it (the constructor says).
// Thread safety: one sender and one receiver at a time may use a stream concurrently (the HA
// stream sends from one thread while another reads acks); Shutdown from anywhere.
#pragma once

#include <cstddef>
#include <string_view>

#include "common/socket_io.h"
#include "granary/status.h"

namespace granary::net {

class ByteStream {
 public:
  ByteStream(int fd, bool owns_fd) : fd_(fd), owns_fd_(owns_fd) {}
  virtual ~ByteStream();
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  int fd() const { return fd_; }
  // *sent (optional): the bytes that left before a failure (0: the peer saw nothing).
  virtual Status SendAll(std::string_view bytes, SteadyTime deadline, size_t* sent = nullptr);
  // Up to n bytes that are here now: the count, 0 when none has arrived yet (wait with
  // WaitReadable), RPC_FAIL once the peer closed or the connection broke.
  virtual Result<size_t> RecvSome(char* out, size_t n);
  // True once RecvSome may make progress (bytes, a close or an error), false at the deadline.
  virtual bool WaitReadable(SteadyTime deadline);
  // Bytes received and decoded but not read yet (TLS records already taken off the socket).
  virtual bool HasBuffered() { return false; }
  // "tls" or "tcp", for logs.
  virtual const char* kind() const { return "tcp"; }

  // Exactly n bytes, by the deadline.
  Status RecvExact(char* out, size_t n, SteadyTime deadline);
  void Shutdown();

 private:
  const int fd_;
  const bool owns_fd_;
};

}  // namespace granary::net
