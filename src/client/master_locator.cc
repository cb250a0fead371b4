#include "client/master_locator.h"

#include <cstdlib>
#include <thread>

#include "etcd/cluster_keys.h"

namespace granary::client {

namespace {
constexpr auto kPoll = std::chrono::milliseconds(25);  // while a failover is under way
}  // namespace

MasterLocator::MasterLocator(std::string address, std::string cluster_id, int timeout_ms,
                             bool own_connection, std::string secret,
                             std::shared_ptr<const security::TlsContext> tls)
    : address_(std::move(address)),
      cluster_id_(std::move(cluster_id)),
      timeout_ms_(std::max(timeout_ms, 1)),
      own_connection_(own_connection),
      secret_(std::move(secret)),
      tls_(std::move(tls)) {}

std::shared_ptr<grpc::Channel> MasterLocator::ChannelTo(const std::string& address) const {
  return rpc::MakeChannel(address, own_connection_, secret_,
                          tls_ ? tls_->ChannelCredentials() : nullptr);
}

MasterLocator::~MasterLocator() = default;

Result<std::shared_ptr<MasterLocator>> MasterLocator::Create(const std::string& address,
                                                             const std::string& cluster_id,
                                                             int timeout_ms,
                                                             bool own_connection,
                                                             const std::string& secret,
                                                             std::shared_ptr<const security::TlsContext> tls,
                                                             const etcd::EtcdCredentials& etcd_credentials) {
  std::string cluster = cluster_id;
  if (cluster.empty()) {
    const char* env = std::getenv("GRANARY_CLUSTER_ID");
    cluster = env && *env ? env : etcd::kDefaultClusterId;
  }
  std::shared_ptr<MasterLocator> locator(
      new MasterLocator(address, cluster, timeout_ms, own_connection, secret, std::move(tls)));
  locator->etcd_credentials_ = etcd_credentials;
  if (auto endpoints = etcd::EtcdEndpointsOf(address)) {
    // etcd's own calls are short; a failover is waited out by polling, bounded by each caller.
    auto client =
        etcd::EtcdClient::Connect(*endpoints, std::min(timeout_ms, 2000), etcd_credentials);
    if (!client.ok()) return client.status();
    locator->etcd_ = std::move(*client);
  } else {
    if (address.empty()) return Status(ErrorCode::INVALID_PARAMS, "no master address");
    auto target = std::make_shared<Target>();
    target->address = address;
    target->stub = proto::Master::NewStub(locator->ChannelTo(address));
    target->generation = locator->next_generation_++;
    locator->current_ = std::move(target);
  }
  return locator;
}

std::shared_ptr<const MasterLocator::Target> MasterLocator::Current(SteadyTime deadline,
                                                                    Status* why) {
  {
    std::unique_lock lock(mu_);
    if (!etcd_) return current_;  // a fixed address never changes
    // One lookup at a time; the others take its answer.
    while (looking_) {  // bounded by the deadline
      if (looked_up_.wait_until(lock, deadline) == std::cv_status::timeout) break;
    }
    if (current_ && !stale_) return current_;
    if (looking_) {
      if (why) *why = Status(ErrorCode::RPC_TIMEOUT, "looking up the leader took too long");
      return nullptr;
    }
    looking_ = true;
  }
  auto found = LookUp(deadline);
  std::lock_guard lock(mu_);
  looking_ = false;
  looked_up_.notify_all();
  if (!found.ok()) {
    if (why) *why = found.status();
    return nullptr;
  }
  stale_ = false;
  current_ = *found;
  return current_;
}

Result<std::shared_ptr<const MasterLocator::Target>> MasterLocator::LookUp(SteadyTime deadline) {
  const std::string key = etcd::LeaderKey(cluster_id_);
  Status last(ErrorCode::RPC_FAIL, "no serving leader of cluster '" + cluster_id_ +
                                       "' in etcd " + address_);
  for (;;) {  // bounded by the deadline: every pass asks etcd once or sleeps kPoll
    lookups_++;
    auto kv = etcd_->Get(key);
    if (!kv.ok()) {
      last = kv.status();
    } else if (*kv) {
      auto record = etcd::ParseLeaderRecord((*kv)->value);
      // Only a serving leader answers; a lower term than one seen is a deposed one's key.
      if (record.ok() && record->serving && record->term >= max_term_.load()) {
        std::shared_ptr<const Target> old;
        {
          std::lock_guard lock(mu_);
          old = current_;
        }
        if (old && old->term == record->term && old->address == record->grpc) return old;
        auto target = std::make_shared<Target>();
        target->address = record->grpc;
        target->stub = proto::Master::NewStub(ChannelTo(record->grpc));
        target->term = record->term;
        target->fast_port = record->fast_port;
        target->fast_local = record->fast_local;
        {
          std::lock_guard lock(mu_);
          target->generation = next_generation_++;
        }
        NoteTerm(record->term);
        return std::shared_ptr<const Target>(std::move(target));
      }
      if (!record.ok()) last = record.status();
    }
    if (std::chrono::steady_clock::now() + kPoll >= deadline) return last;
    std::this_thread::sleep_for(kPoll);
  }
}

void MasterLocator::Stale(uint64_t generation) {
  std::lock_guard lock(mu_);
  if (etcd_ && current_ && current_->generation == generation) stale_ = true;
}

bool MasterLocator::NoteTerm(uint64_t term) {
  uint64_t seen = max_term_.load();
  while (term > seen) {  // bounded: each failed exchange reloads a larger `seen`
    if (max_term_.compare_exchange_weak(seen, term)) return true;
  }
  return term >= seen || term == 0;
}

}  // namespace granary::client
