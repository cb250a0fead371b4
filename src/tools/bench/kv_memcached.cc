// tools/bench/kv_memcached.cc - memcached as a KvTarget: the classic text protocol (set, get,
// delete) over one TCP socket.
//
// The value goes out with one writev (header, value, CRLF) and comes back straight into the
// caller's buffer: only what arrived with the header line passes through a small staging buffer.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tools/bench/kv_target.h"

namespace granary::bench {
namespace {

Status IoError(const char* what) {
  return Status(ErrorCode::TRANSFER_FAIL, std::string("memcached ") + what + ": " + std::strerror(errno));
}

class MemcachedTarget final : public KvTarget {
 public:
  explicit MemcachedTarget(int fd) : fd_(fd), staging_(64 << 10) {}
  ~MemcachedTarget() override { close(fd_); }

  Status Put(const std::string& key, ByteSpan value) override {
    std::string header = "set " + key + " 0 0 " + std::to_string(value.size()) + "\r\n";
    iovec iov[3] = {{header.data(), header.size()},
                    {const_cast<std::byte*>(value.data()), value.size()},
                    {const_cast<char*>("\r\n"), 2}};
    if (Status s = WriteAll(iov, 3); !s.ok()) return s;
    std::string line;
    if (Status s = ReadLine(&line); !s.ok()) return s;
    if (line != "STORED") return Status(ErrorCode::WRITE_FAIL, "memcached set: " + line);
    return Status::Ok();
  }

  Result<uint64_t> GetInto(const std::string& key, MutableByteSpan buffer) override {
    std::string request = "get " + key + "\r\n";
    iovec iov{request.data(), request.size()};
    if (Status s = WriteAll(&iov, 1); !s.ok()) return s;
    std::string line;
    if (Status s = ReadLine(&line); !s.ok()) return s;
    if (line == "END") return Result<uint64_t>(ErrorCode::OBJECT_NOT_FOUND, key);
    // "VALUE <key> <flags> <bytes>"
    auto last_space = line.rfind(' ');
    if (line.rfind("VALUE ", 0) != 0 || last_space == std::string::npos) {
      return Result<uint64_t>(ErrorCode::INVALID_READ, "memcached get: " + line);
    }
    const uint64_t size = std::strtoull(line.c_str() + last_space + 1, nullptr, 10);
    std::vector<std::byte> overflow;
    MutableByteSpan dst = buffer;
    if (size > buffer.size()) {  // drain it anyway so the connection stays in step
      overflow.resize(size);
      dst = overflow;
    }
    if (Status s = ReadExact(reinterpret_cast<char*>(dst.data()), size); !s.ok()) return s;
    char trailer[7];  // "\r\nEND\r\n"
    if (Status s = ReadExact(trailer, sizeof(trailer)); !s.ok()) return s;
    if (std::memcmp(trailer, "\r\nEND\r\n", 7) != 0) {
      return Result<uint64_t>(ErrorCode::INVALID_READ, "memcached get: bad trailer");
    }
    if (size > buffer.size()) return Result<uint64_t>(ErrorCode::BUFFER_OVERFLOW, key);
    return size;
  }

  Status Clear(const std::string& prefix, uint64_t count) override {
    // Pipelined deletes, 1000 per round trip; NOT_FOUND is fine (evicted already).
    for (uint64_t first = 0; first < count; first += 1000) {
      const uint64_t end = std::min(count, first + 1000);
      std::string requests;
      for (uint64_t i = first; i < end; ++i) requests += "delete " + prefix + std::to_string(i) + "\r\n";
      iovec iov{requests.data(), requests.size()};
      if (Status s = WriteAll(&iov, 1); !s.ok()) return s;
      std::string line;
      for (uint64_t i = first; i < end; ++i) {
        if (Status s = ReadLine(&line); !s.ok()) return s;
      }
    }
    return Status::Ok();
  }

 private:
  Status WriteAll(iovec* iov, int count) {
    while (count > 0) {
      ssize_t n = writev(fd_, iov, count);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return IoError("write");
      while (count > 0 && static_cast<size_t>(n) >= iov->iov_len) {
        n -= iov->iov_len;
        ++iov;
        --count;
      }
      if (count > 0) {
        iov->iov_base = static_cast<char*>(iov->iov_base) + n;
        iov->iov_len -= n;
      }
    }
    return Status::Ok();
  }

  // Fills the staging buffer with whatever the socket has (at least one byte).
  Status Fill() {
    if (begin_ == end_) begin_ = end_ = 0;
    if (end_ == staging_.size()) {  // compact; lines are short, so this rarely moves anything
      std::memmove(staging_.data(), staging_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
      if (end_ == staging_.size()) return Status(ErrorCode::INVALID_READ, "memcached: line too long");
    }
    for (;;) {
      ssize_t n = recv(fd_, staging_.data() + end_, staging_.size() - end_, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) return Status(ErrorCode::TRANSFER_FAIL, "memcached: connection closed");
      if (n < 0) return IoError("read");
      end_ += n;
      return Status::Ok();
    }
  }

  // Lines (replies, headers) are short: rescanning from begin_ after each read costs nothing.
  Status ReadLine(std::string* line) {
    for (;;) {
      for (size_t i = begin_ + 1; i < end_; ++i) {
        if (staging_[i] == '\n' && staging_[i - 1] == '\r') {
          line->assign(staging_.data() + begin_, i - 1 - begin_);
          begin_ = i + 1;
          return Status::Ok();
        }
      }
      if (Status s = Fill(); !s.ok()) return s;
    }
  }

  // The first bytes come from the staging buffer, the rest straight from the socket into dst.
  Status ReadExact(char* dst, size_t n) {
    size_t have = std::min(n, end_ - begin_);
    std::memcpy(dst, staging_.data() + begin_, have);
    begin_ += have;
    while (have < n) {
      ssize_t got = recv(fd_, dst + have, n - have, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got == 0) return Status(ErrorCode::TRANSFER_FAIL, "memcached: connection closed");
      if (got < 0) return IoError("read");
      have += got;
    }
    return Status::Ok();
  }

  int fd_;
  std::vector<char> staging_;
  size_t begin_ = 0;
  size_t end_ = 0;
};

}  // namespace

Result<std::unique_ptr<KvTarget>> ConnectMemcached(const std::string& address) {
  using R = Result<std::unique_ptr<KvTarget>>;
  auto colon = address.rfind(':');
  if (colon == std::string::npos) return R(ErrorCode::INVALID_PARAMS, "memcached address " + address);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(address.substr(0, colon).c_str(), address.c_str() + colon + 1, &hints, &found) != 0) {
    return R(ErrorCode::INVALID_PARAMS, "memcached address " + address);
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int ok = fd >= 0 ? connect(fd, found->ai_addr, found->ai_addrlen) : -1;
  freeaddrinfo(found);
  if (ok != 0) {
    Status s = IoError(("connect " + address).c_str());
    if (fd >= 0) close(fd);
    return s;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval timeout{30, 0};  // a stuck server fails the case instead of hanging the run
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  return std::unique_ptr<KvTarget>(std::make_unique<MemcachedTarget>(fd));
}

}  // namespace granary::bench
