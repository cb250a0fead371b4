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

Authenticator::Authenticator(std::string secret, MetricsRegistry* registry,
                             const std::string& prefix)
    : secret_(std::move(secret)), registry_(registry), metric_(prefix + "_unauthenticated_total") {
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

Status Authenticator::Check(std::optional<std::string_view> presented, const char* transport,
                            std::string_view peer) const {
  if (secret_.empty()) return Status::Ok();
  if (presented && SecretsEqual(*presented, secret_)) return Status::Ok();
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
