// security/authenticator.h - the check a server makes of every caller: which of the known
// secrets (the cluster's, the admin's, a tenant's) does it present, and so who is it
// (security/principal.h)?
//
// Promise: with no secret (the default) every caller passes, as an admin. With one, Identify
// passes only an exact known secret, compared in constant time against every known one (the
// time depends on their number and lengths, not on which matched or where a guess differs);
// anything else is UNAUTHENTICATED saying what was wrong (none presented, or a wrong one) and
// never a secret. The cluster's secret is the admin's too when no admin secret is set. Secrets
// must be distinct (the constructor's caller checks: Validate). Each refusal is counted in
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
#include <vector>

#include "common/metrics.h"
#include "granary/status.h"
#include "security/principal.h"
#include "security/tenants.h"

namespace granary::security {

struct Credentials {
  std::string cluster;  // --auth-token-file; required where either of the others is given
  std::string admin;    // --admin-token-file; "": the cluster's secret is the admin's
  std::vector<TenantSpec> tenants;
  // Secondary secrets, accepted too while a rotation rolls (the secret files' further lines):
  // each names the same principal as the first.
  std::vector<std::string> cluster_secondary;
  std::vector<std::string> admin_secondary;
  // Secrets present only where the cluster's is, and all distinct; else INVALID_PARAMS.
  Status Validate() const;
};

class Authenticator {
 public:
  // prefix: the metric's, e.g. "granary_master". registry may be null (no metric).
  Authenticator(Credentials credentials, MetricsRegistry* registry, const std::string& prefix);
  // The cluster's secret alone (or none).
  Authenticator(std::string secret, MetricsRegistry* registry, const std::string& prefix)
      : Authenticator(Credentials{std::move(secret), {}, {}}, registry, prefix) {}
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  bool required() const { return !cluster_.empty(); }
  // presented: what the caller sent (nullopt: nothing). transport: "grpc", "fast", ... (a
  // metric label: a fixed, small set). peer: for the log line. The principal lives as long as
  // the authenticator.
  Result<const Principal*> Identify(std::optional<std::string_view> presented,
                                    const char* transport, std::string_view peer) const;
  Status Check(std::optional<std::string_view> presented, const char* transport,
               std::string_view peer) const {
    return Identify(presented, transport, peer).status();
  }
  // Who a caller is where no secret is asked for.
  const Principal* open() const { return &open_; }
  // The tenants, in the file's order (their principals, for per-tenant state and metrics).
  const std::vector<Principal>& tenants() const { return tenant_principals_; }
  // Counts and logs (as Check's refusals) a caller refused for another reason before it could
  // present anything, e.g. a malformed first frame; `why` is a fixed phrase. UNAUTHENTICATED.
  Status Refuse(const char* transport, std::string_view peer, const char* why) const;
  uint64_t refused() const { return refused_.load(); }
  // Callers that presented a secondary secret (a further line of a secret file).
  uint64_t secondary_presented() const { return secondary_presented_.load(); }

 private:
  ::granary::Counter* CounterFor(const char* transport) const;  // registered on first use

  const std::string cluster_;
  const std::string admin_;
  const std::vector<std::string> cluster_secondary_;
  const std::vector<std::string> admin_secondary_;
  ::granary::Counter* secondary_counter_ = nullptr;
  mutable std::atomic<uint64_t> secondary_presented_{0};
  const std::vector<TenantSpec> tenant_specs_;
  const Principal open_{Principal::Role::kAdmin, "", 0};
  const Principal member_;
  const Principal admin_principal_{Principal::Role::kAdmin, "", 0};
  std::vector<Principal> tenant_principals_;  // tenant_specs_[i]'s; fixed after construction
  MetricsRegistry* registry_;
  const std::string metric_;
  mutable std::mutex mu_;
  mutable std::map<std::string, Counter*, std::less<>> counters_;  // by transport; guarded by mu_
  mutable int64_t last_log_ms_ = 0;                                 // guarded by mu_
  mutable uint64_t unlogged_ = 0;                                   // guarded by mu_
  mutable std::atomic<uint64_t> refused_{0};
};

}  // namespace granary::security
