// tools/bench/kv_socket.h - a blocking TCP connection for line-framed protocols (memcached's text
// protocol, Redis's RESP): write gathered buffers, read CRLF-terminated lines, read exact byte
// counts straight into the caller's memory.
//
// Only bytes that arrive together with a line pass through a small staging buffer; the rest of a
// value is received directly into its destination, so a large value is copied once by the kernel.
// Ownership: owns the socket. Thread safety: none (one per client thread).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "granary/status.h"

namespace granary::bench {

class LineSocket {
 public:
  // address is HOST:PORT (IPv4); send and receive time out after 30 s.
  static Result<std::unique_ptr<LineSocket>> Connect(const std::string& address);
  ~LineSocket();
  LineSocket(const LineSocket&) = delete;
  LineSocket& operator=(const LineSocket&) = delete;

  Status WriteAll(iovec* iov, int count);  // iov is consumed (advanced) as it is written
  Status ReadLine(std::string* line);      // without the CRLF
  Status ReadExact(void* dst, size_t n);

 private:
  explicit LineSocket(int fd);
  Status Fill();

  int fd_;
  std::vector<char> staging_;
  size_t begin_ = 0;
  size_t end_ = 0;
};

}  // namespace granary::bench
