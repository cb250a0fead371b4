// tools/bench/kv_granary.cc - Granary as a KvTarget: the public client, one object per call.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "tools/bench/kv_target.h"

namespace granary::bench {
namespace {

class GranaryTarget final : public KvTarget {
 public:
  explicit GranaryTarget(std::unique_ptr<Client> client) : client_(std::move(client)) {}
  // How many puts took one master call (reserved space): tells whether the pool kept up.
  ~GranaryTarget() override {
    if (puts_ > 0) {
      std::fprintf(stderr, "granary client: %llu of %llu puts in one master call\n",
                   static_cast<unsigned long long>(client_->Stats().reserved_puts),
                   static_cast<unsigned long long>(puts_));
    }
  }

  Status Put(const std::string& key, ByteSpan value) override {
    puts_++;
    return client_->Put(key, value);
  }

  Result<uint64_t> GetInto(const std::string& key, MutableByteSpan buffer) override {
    return client_->GetInto(key, buffer);
  }

  Status Clear(const std::string& prefix, uint64_t) override {
    // Keys are the prefix plus digits; one regex scan on the master removes them all.
    const std::string pattern = "^" + prefix + "[0-9]+$";
    auto removed = client_->RemoveByRegex(pattern, /*force=*/true);
    // Only the admin forces a removal: anyone else (a tenant, a member beside an admin secret)
    // clears what no reader holds, which is all of it between the benchmark's rounds.
    if (removed.status().code() == ErrorCode::PERMISSION_DENIED) {
      removed = client_->RemoveByRegex(pattern, /*force=*/false);
    }
    return removed.ok() ? Status::Ok() : removed.status();
  }

  Warmup WaitWarm(double timeout_s) override {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s));
    ClientStats s = client_->Stats();
    while (s.shm_bytes_warm_pending > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      s = client_->Stats();
    }
    return {s.shm_bytes_warmed, s.shm_warm_ns / 1e9, s.shm_bytes_warm_pending == 0};
  }

 private:
  std::unique_ptr<Client> client_;
  uint64_t puts_ = 0;  // one target per bench thread
};

}  // namespace

Result<std::unique_ptr<KvTarget>> ConnectGranary(const std::string& master, bool shm, bool warm,
                                                 int64_t location_cache_ms) {
  ClientOptions options;
  options.master_address = master;
  options.use_shared_memory = shm;
  options.warm_shared_memory = warm;
  if (location_cache_ms >= 0) options.location_cache_ms = location_cache_ms;
  auto client = Client::Connect(options);
  if (!client.ok()) return client.status();
  return std::unique_ptr<KvTarget>(std::make_unique<GranaryTarget>(std::move(*client)));
}

}  // namespace granary::bench
