// tools/bench/kv_redis.cc - Redis as a KvTarget, through hiredis: binary-safe SET and GET.
//
// hiredis parses a reply into its own buffer; GetInto then copies it into the caller's buffer,
// as an application that needs the bytes in its own memory (a KV-cache block) must.
#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tools/bench/kv_target.h"

namespace granary::bench {
namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisTarget final : public KvTarget {
 public:
  explicit RedisTarget(redisContext* ctx) : ctx_(ctx) {}
  ~RedisTarget() override { redisFree(ctx_); }

  Status Put(const std::string& key, ByteSpan value) override {
    const char* argv[] = {"SET", key.data(), reinterpret_cast<const char*>(value.data())};
    const size_t lens[] = {3, key.size(), value.size()};
    auto reply = Command(3, argv, lens);
    if (!reply.ok()) return reply.status();
    if ((*reply)->type != REDIS_REPLY_STATUS) return Error("SET", reply->get());
    return Status::Ok();
  }

  Result<uint64_t> GetInto(const std::string& key, MutableByteSpan buffer) override {
    const char* argv[] = {"GET", key.data()};
    const size_t lens[] = {3, key.size()};
    auto reply = Command(2, argv, lens);
    if (!reply.ok()) return reply.status();
    const redisReply* r = reply->get();
    if (r->type == REDIS_REPLY_NIL) return Result<uint64_t>(ErrorCode::OBJECT_NOT_FOUND, key);
    if (r->type != REDIS_REPLY_STRING) return Error("GET", r);
    if (r->len > buffer.size()) return Result<uint64_t>(ErrorCode::BUFFER_OVERFLOW, key);
    std::memcpy(buffer.data(), r->str, r->len);
    return static_cast<uint64_t>(r->len);
  }

  Status Clear(const std::string& prefix, uint64_t count) override {
    // DEL of up to 1000 keys per command.
    for (uint64_t first = 0; first < count; first += 1000) {
      std::vector<std::string> keys;
      for (uint64_t i = first; i < std::min(count, first + 1000); ++i) keys.push_back(prefix + std::to_string(i));
      std::vector<const char*> argv{"DEL"};
      std::vector<size_t> lens{3};
      for (const auto& k : keys) {
        argv.push_back(k.data());
        lens.push_back(k.size());
      }
      auto reply = Command(static_cast<int>(argv.size()), argv.data(), lens.data());
      if (!reply.ok()) return reply.status();
    }
    return Status::Ok();
  }

 private:
  Result<Reply> Command(int argc, const char** argv, const size_t* lens) {
    auto* raw = static_cast<redisReply*>(redisCommandArgv(ctx_, argc, argv, lens));
    if (raw == nullptr) {
      return Result<Reply>(ErrorCode::TRANSFER_FAIL, std::string("redis: ") + ctx_->errstr);
    }
    return Reply(raw);
  }

  static Status Error(const char* what, const redisReply* r) {
    std::string text = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len)
                                                    : "reply type " + std::to_string(r->type);
    return Status(ErrorCode::WRITE_FAIL, std::string("redis ") + what + ": " + text);
  }

  redisContext* ctx_;
};

}  // namespace

Result<std::unique_ptr<KvTarget>> ConnectRedis(const std::string& address) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos) {
    return Result<std::unique_ptr<KvTarget>>(ErrorCode::INVALID_PARAMS, "redis address " + address);
  }
  std::string host = address.substr(0, colon);
  int port = std::atoi(address.c_str() + colon + 1);
  timeval timeout{30, 0};
  redisContext* ctx = redisConnectWithTimeout(host.c_str(), port, timeval{5, 0});
  if (ctx == nullptr || ctx->err) {
    std::string why = ctx ? ctx->errstr : "out of memory";
    if (ctx) redisFree(ctx);
    return Result<std::unique_ptr<KvTarget>>(ErrorCode::RPC_FAIL, "redis " + address + ": " + why);
  }
  redisSetTimeout(ctx, timeout);
  return std::unique_ptr<KvTarget>(std::make_unique<RedisTarget>(ctx));
}

}  // namespace granary::bench
