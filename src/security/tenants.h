// security/tenants.h - the tenants file (--tenants-file): who may work in which key namespace,
// with what quota.
//
// Promise: ParseTenants reads one tenant a line, "NAME TOKEN [QUOTA]" (blank lines and lines
// starting with '#' skipped; QUOTA a size such as 8GiB, the rest of the line; none: no quota).
// A name is 1-64 of [A-Za-z0-9_.-] and not "default" (the namespace of callers without a
// tenant); a token is a secret as secret.h requires. Names and tokens are unique. Any fault is
// INVALID_PARAMS naming the line, never quoting a token. LoadTenantsFile reads the file as
// ReadPrivateFile does (mode 0600 or 0400, at most 1 MiB).
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "granary/status.h"

namespace granary::security {

struct TenantSpec {
  std::string name;
  std::string token;
  uint64_t quota_bytes = 0;  // 0: none
};

inline constexpr size_t kMaxTenantName = 64;

bool ValidTenantName(std::string_view name);
Result<std::vector<TenantSpec>> ParseTenants(std::string_view text, const std::string& path);
Result<std::vector<TenantSpec>> LoadTenantsFile(const std::string& path);

}  // namespace granary::security
