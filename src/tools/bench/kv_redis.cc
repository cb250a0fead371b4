// tools/bench/kv_redis.cc - Redis as a KvTarget: SET, GET and DEL in RESP over one LineSocket.
//
// Not hiredis: hiredis 0.14 (Debian 12) copies a value into its output buffer and memmoves the
// rest after every partial write, and grows its reply buffer by copying; `perf` showed memmove at
// 38% of the client's time for 16 MiB values. Here a value goes out in one writev and a reply is
// received straight into the caller's buffer, as the memcached client does, so Redis is measured,
// not its client library.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tools/bench/kv_socket.h"
#include "tools/bench/kv_target.h"

namespace granary::bench {
namespace {

std::string Bulk(const std::string& s) { return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n"; }

class RedisTarget final : public KvTarget {
 public:
  explicit RedisTarget(std::unique_ptr<LineSocket> socket) : socket_(std::move(socket)) {}

  Status Put(const std::string& key, ByteSpan value) override {
    std::string header = "*3\r\n" + Bulk("SET") + Bulk(key) + "$" + std::to_string(value.size()) + "\r\n";
    iovec iov[3] = {{header.data(), header.size()},
                    {const_cast<std::byte*>(value.data()), value.size()},
                    {const_cast<char*>("\r\n"), 2}};
    if (Status s = socket_->WriteAll(iov, 3); !s.ok()) return s;
    std::string line;
    if (Status s = socket_->ReadLine(&line); !s.ok()) return s;
    if (line != "+OK") return Status(ErrorCode::WRITE_FAIL, "redis SET: " + line);
    return Status::Ok();
  }

  Result<uint64_t> GetInto(const std::string& key, MutableByteSpan buffer) override {
    std::string request = "*2\r\n" + Bulk("GET") + Bulk(key);
    iovec iov{request.data(), request.size()};
    if (Status s = socket_->WriteAll(&iov, 1); !s.ok()) return s;
    std::string line;
    if (Status s = socket_->ReadLine(&line); !s.ok()) return s;
    if (line == "$-1") return Result<uint64_t>(ErrorCode::OBJECT_NOT_FOUND, key);
    if (line.empty() || line[0] != '$') return Result<uint64_t>(ErrorCode::INVALID_READ, "redis GET: " + line);
    const uint64_t size = std::strtoull(line.c_str() + 1, nullptr, 10);
    std::vector<std::byte> overflow;
    void* dst = buffer.data();
    if (size > buffer.size()) {  // drain it anyway so the connection stays in step
      overflow.resize(size);
      dst = overflow.data();
    }
    if (Status s = socket_->ReadExact(dst, size); !s.ok()) return s;
    char crlf[2];
    if (Status s = socket_->ReadExact(crlf, 2); !s.ok()) return s;
    if (size > buffer.size()) return Result<uint64_t>(ErrorCode::BUFFER_OVERFLOW, key);
    return size;
  }

  Status Clear(const std::string& prefix, uint64_t count) override {
    // DEL of up to 1000 keys per command.
    for (uint64_t first = 0; first < count; first += 1000) {
      const uint64_t end = std::min(count, first + 1000);
      std::string request = "*" + std::to_string(end - first + 1) + "\r\n" + Bulk("DEL");
      for (uint64_t i = first; i < end; ++i) request += Bulk(prefix + std::to_string(i));
      iovec iov{request.data(), request.size()};
      if (Status s = socket_->WriteAll(&iov, 1); !s.ok()) return s;
      std::string line;
      if (Status s = socket_->ReadLine(&line); !s.ok()) return s;
      if (line.empty() || line[0] != ':') return Status(ErrorCode::WRITE_FAIL, "redis DEL: " + line);
    }
    return Status::Ok();
  }

 private:
  std::unique_ptr<LineSocket> socket_;
};

}  // namespace

Result<std::unique_ptr<KvTarget>> ConnectRedis(const std::string& address) {
  auto socket = LineSocket::Connect(address);
  if (!socket.ok()) return socket.status();
  return std::unique_ptr<KvTarget>(std::make_unique<RedisTarget>(std::move(*socket)));
}

}  // namespace granary::bench
