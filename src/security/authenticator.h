// security/authenticator.h - the check a server makes of every caller: does it present the
// cluster's secret (security/secret.h)?
//
// Promise: with no secret (the default) every caller passes. With one, Check passes only the
// exact secret, compared in constant time; anything else is UNAUTHENTICATED saying what was wrong
// (none presented, or a wrong one) and never the secret. Each refusal is counted in
// `<prefix>_unauthenticated_total{transport=...}` and logged with the peer's address, at most one
// line a second (thousands of hostile connections must not flood the log).
// Ownership: borrows the metrics registry, which must outlive it.
// Thread safety: Check from any thread; the secret is fixed at construction.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "common/metrics.h"
#include "granary/status.h"

namespace granary::security {

class Authenticator {
 public:
  // prefix: the metric's, e.g. "granary_master". registry may be null (no metric).
  Authenticator(std::string secret, MetricsRegistry* registry, const std::string& prefix);
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  bool required() const { return !secret_.empty(); }
  // presented: what the caller sent (nullopt: nothing). transport: "grpc", "fast", ... (a
  // metric label: a fixed, small set). peer: for the log line.
  Status Check(std::optional<std::string_view> presented, const char* transport,
               std::string_view peer) const;
  // Counts and logs (as Check's refusals) a caller refused for another reason before it could
  // present anything, e.g. a malformed first frame; `why` is a fixed phrase. UNAUTHENTICATED.
  Status Refuse(const char* transport, std::string_view peer, const char* why) const;
  uint64_t refused() const { return refused_.load(); }

 private:
  ::granary::Counter* CounterFor(const char* transport) const;  // registered on first use

  const std::string secret_;
  MetricsRegistry* registry_;
  const std::string metric_;
  mutable std::mutex mu_;
  mutable std::map<std::string, Counter*, std::less<>> counters_;  // by transport; guarded by mu_
  mutable int64_t last_log_ms_ = 0;                                 // guarded by mu_
  mutable uint64_t unlogged_ = 0;                                   // guarded by mu_
  mutable std::atomic<uint64_t> refused_{0};
};

}  // namespace granary::security
