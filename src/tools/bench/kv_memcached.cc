// tools/bench/kv_memcached.cc - memcached as a KvTarget: the classic text protocol (set, get,
// delete) over one LineSocket. A value goes out in one writev (header, value, CRLF) and comes back
// straight into the caller's buffer.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tools/bench/kv_socket.h"
#include "tools/bench/kv_target.h"

namespace granary::bench {
namespace {

class MemcachedTarget final : public KvTarget {
 public:
  explicit MemcachedTarget(std::unique_ptr<LineSocket> socket) : socket_(std::move(socket)) {}

  Status Put(const std::string& key, ByteSpan value) override {
    std::string header = "set " + key + " 0 0 " + std::to_string(value.size()) + "\r\n";
    iovec iov[3] = {{header.data(), header.size()},
                    {const_cast<std::byte*>(value.data()), value.size()},
                    {const_cast<char*>("\r\n"), 2}};
    if (Status s = socket_->WriteAll(iov, 3); !s.ok()) return s;
    std::string line;
    if (Status s = socket_->ReadLine(&line); !s.ok()) return s;
    if (line != "STORED") return Status(ErrorCode::WRITE_FAIL, "memcached set: " + line);
    return Status::Ok();
  }

  Result<uint64_t> GetInto(const std::string& key, MutableByteSpan buffer) override {
    std::string request = "get " + key + "\r\n";
    iovec iov{request.data(), request.size()};
    if (Status s = socket_->WriteAll(&iov, 1); !s.ok()) return s;
    std::string line;
    if (Status s = socket_->ReadLine(&line); !s.ok()) return s;
    if (line == "END") return Result<uint64_t>(ErrorCode::OBJECT_NOT_FOUND, key);
    // "VALUE <key> <flags> <bytes>"
    auto last_space = line.rfind(' ');
    if (line.rfind("VALUE ", 0) != 0 || last_space == std::string::npos) {
      return Result<uint64_t>(ErrorCode::INVALID_READ, "memcached get: " + line);
    }
    const uint64_t size = std::strtoull(line.c_str() + last_space + 1, nullptr, 10);
    std::vector<std::byte> overflow;
    void* dst = buffer.data();
    if (size > buffer.size()) {  // drain it anyway so the connection stays in step
      overflow.resize(size);
      dst = overflow.data();
    }
    if (Status s = socket_->ReadExact(dst, size); !s.ok()) return s;
    char trailer[7];  // "\r\nEND\r\n"
    if (Status s = socket_->ReadExact(trailer, sizeof(trailer)); !s.ok()) return s;
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
      if (Status s = socket_->WriteAll(&iov, 1); !s.ok()) return s;
      std::string line;
      for (uint64_t i = first; i < end; ++i) {
        if (Status s = socket_->ReadLine(&line); !s.ok()) return s;
      }
    }
    return Status::Ok();
  }

 private:
  std::unique_ptr<LineSocket> socket_;
};

}  // namespace

Result<std::unique_ptr<KvTarget>> ConnectMemcached(const std::string& address) {
  auto socket = LineSocket::Connect(address);
  if (!socket.ok()) return socket.status();
  return std::unique_ptr<KvTarget>(std::make_unique<MemcachedTarget>(std::move(*socket)));
}

}  // namespace granary::bench
