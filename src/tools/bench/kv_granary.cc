// tools/bench/kv_granary.cc - Granary as a KvTarget: the public client, one object per call.
#include <memory>
#include <string>

#include "tools/bench/kv_target.h"

namespace granary::bench {
namespace {

class GranaryTarget final : public KvTarget {
 public:
  explicit GranaryTarget(std::unique_ptr<Client> client) : client_(std::move(client)) {}

  Status Put(const std::string& key, ByteSpan value) override { return client_->Put(key, value); }

  Result<uint64_t> GetInto(const std::string& key, MutableByteSpan buffer) override {
    return client_->GetInto(key, buffer);
  }

  Status Clear(const std::string& prefix, uint64_t) override {
    // Keys are the prefix plus digits; one regex scan on the master removes them all.
    auto removed = client_->RemoveByRegex("^" + prefix + "[0-9]+$", /*force=*/true);
    return removed.ok() ? Status::Ok() : removed.status();
  }

 private:
  std::unique_ptr<Client> client_;
};

}  // namespace

Result<std::unique_ptr<KvTarget>> ConnectGranary(const std::string& master, bool shm) {
  ClientOptions options;
  options.master_address = master;
  options.use_shared_memory = shm;
  auto client = Client::Connect(options);
  if (!client.ok()) return client.status();
  return std::unique_ptr<KvTarget>(std::make_unique<GranaryTarget>(std::move(*client)));
}

}  // namespace granary::bench
