#include "security/authenticator.h"

#include <chrono>

#include "common/logging.h"
#include "security/secret.h"

namespace granary::security {

namespace {
constexpr int64_t kLogIntervalMs = 1000;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Status Credentials::Validate() const {
  if (cluster.empty() && (!admin.empty() || !tenants.empty())) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "an admin secret or tenants need the cluster's secret too (--auth-token-file: "
                  "nodes and standbys present it)");
  }
  if (admin.empty() && !admin_secondary.empty()) {
    return Status(ErrorCode::INVALID_PARAMS, "secondary admin secrets without a first one");
  }
  std::vector<std::string_view> all = {cluster};
  if (!admin.empty()) all.push_back(admin);
  for (const auto& t : tenants) all.push_back(t.token);
  for (const auto& s : cluster_secondary) all.push_back(s);
  for (const auto& s : admin_secondary) all.push_back(s);
  for (size_t i = 0; i < all.size(); ++i) {
    for (size_t j = i + 1; j < all.size(); ++j) {
      if (!all[i].empty() && all[i] == all[j]) {
        return Status(ErrorCode::INVALID_PARAMS,
                      "the cluster's secret, the admin's and each tenant's token must all differ "
                      "(one caller would hold two roles)");
      }
    }
  }
  return Status::Ok();
}

Authenticator::Authenticator(Credentials credentials, MetricsRegistry* registry,
                             const std::string& prefix)
    : cluster_(std::move(credentials.cluster)), admin_(std::move(credentials.admin)),
      cluster_secondary_(std::move(credentials.cluster_secondary)),
      admin_secondary_(std::move(credentials.admin_secondary)),
      tenant_specs_(std::move(credentials.tenants)),
      member_{admin_.empty() ? Principal::Role::kAdmin : Principal::Role::kMember, "", 0},
      registry_(registry), metric_(prefix + "_unauthenticated_total") {
  if (registry_ && (!cluster_secondary_.empty() || !admin_secondary_.empty())) {
    secondary_counter_ = registry_->AddCounter(
        prefix + "_secondary_secret_total",
        "calls and connections that presented a secondary secret (a further line of a secret "
        "file, accepted during a rotation)");
  }
  tenant_principals_.reserve(tenant_specs_.size());
  for (const auto& t : tenant_specs_) {
    tenant_principals_.push_back({Principal::Role::kTenant, t.name, t.quota_bytes});
  }
  // Shown at 0 from the start, so a dashboard has the series before the first refusal.
  if (required() && registry_) {
    for (const char* transport : {"grpc", "fast"}) CounterFor(transport);
  }
}

::granary::Counter* Authenticator::CounterFor(const char* transport) const {
  std::lock_guard lock(mu_);
  auto it = counters_.find(transport);
  if (it == counters_.end()) {
    ::granary::Counter* c =
        registry_ ? registry_->AddCounter(metric_,
                                          "calls and connections refused for presenting no "
                                          "secret or a wrong one",
                                          {{"transport", transport}})
                  : nullptr;
    it = counters_.emplace(transport, c).first;
  }
  return it->second;
}

Result<const Principal*> Authenticator::Identify(std::optional<std::string_view> presented,
                                                 const char* transport,
                                                 std::string_view peer) const {
  if (cluster_.empty()) return &open_;
  if (presented) {
    // Every known secret is compared, whichever matches: the time tells nothing of which.
    const Principal* found = nullptr;
    bool secondary = false;
    if (SecretsEqual(*presented, cluster_)) found = &member_;
    if (!admin_.empty() && SecretsEqual(*presented, admin_)) found = &admin_principal_;
    for (size_t i = 0; i < tenant_specs_.size(); ++i) {
      if (SecretsEqual(*presented, tenant_specs_[i].token)) found = &tenant_principals_[i];
    }
    for (const auto& s : cluster_secondary_) {
      if (SecretsEqual(*presented, s)) {
        found = &member_;
        secondary = true;
      }
    }
    for (const auto& s : admin_secondary_) {
      if (SecretsEqual(*presented, s)) {
        found = &admin_principal_;
        secondary = true;
      }
    }
    if (secondary) {
      secondary_presented_.fetch_add(1);
      if (secondary_counter_) secondary_counter_->Inc();
    }
    if (found) return found;
  }
  return Refuse(transport, peer, presented ? "a wrong secret" : "no secret");
}

Status Authenticator::Refuse(const char* transport, std::string_view peer,
                             const char* why) const {
  refused_.fetch_add(1);
  if (::granary::Counter* c = CounterFor(transport)) c->Inc();
  {
    std::lock_guard lock(mu_);
    const int64_t now = NowMs();
    if (now - last_log_ms_ >= kLogIntervalMs) {
      GLOG_WARN("refused a {} caller at {}: {} (and {} more refusals since the last line)",
                transport, peer, why, unlogged_);
      last_log_ms_ = now;
      unlogged_ = 0;
    } else {
      unlogged_++;
    }
  }
  return Status(ErrorCode::UNAUTHENTICATED,
                std::string("this store requires its secret (--auth-token-file or ") +
                    kSecretFileEnv + "); the call presented " + why);
}

}  // namespace granary::security
