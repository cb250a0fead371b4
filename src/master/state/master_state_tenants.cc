// master/state/master_state_tenants.cc - tenants' namespaces in the state (key_namespace.h):
// each tenant's usage, kept as its objects come and go, and removals scoped to namespaces.
#include <re2/re2.h>

#include "master/state/master_state.h"
#include "master/state/state_internal.h"

namespace granary::master {

RemoveCountResult MasterState::ApplyRemoveScoped(const RemoveScopedOp& op, int64_t now) {
  const KeyScope scope{op.prefix, op.every_namespace};
  if (op.pattern.empty()) {
    return ApplyRemoveMatching(
        [&](std::string_view key) {
          std::string_view written;
          return scope.Contains(key, &written);
        },
        op.force, now);
  }
  auto re = internal::CompilePattern(op.pattern);
  if (!re.ok()) return {re.status(), 0, 0};
  const RE2& pattern = **re;
  return ApplyRemoveMatching(
      [&](std::string_view key) {
        std::string_view written;
        return scope.Contains(key, &written) && RE2::PartialMatch(written, pattern);
      },
      op.force, now);
}

void MasterState::CountTenantSlow(std::string_view tenant, int64_t bytes, int64_t objects,
                                  int64_t reserved) {
  std::lock_guard lock(tenants_mu_);
  auto it = tenant_usage_.find(tenant);
  if (it == tenant_usage_.end()) {
    it = tenant_usage_.emplace(std::string(tenant), TenantUsage{}).first;
  }
  it->second.bytes += bytes;
  it->second.objects += objects;
  it->second.reserved += reserved;
  if (it->second.bytes == 0 && it->second.objects == 0 && it->second.reserved == 0) {
    tenant_usage_.erase(it);
  }
}

MasterState::TenantUsage MasterState::UsageOf(std::string_view tenant) const {
  std::lock_guard lock(tenants_mu_);
  auto it = tenant_usage_.find(tenant);
  return it == tenant_usage_.end() ? TenantUsage{} : it->second;
}

}  // namespace granary::master
