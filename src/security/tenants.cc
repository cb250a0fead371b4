#include "security/tenants.h"

#include <set>

#include "common/units.h"
#include "security/secret.h"

namespace granary::security {

namespace {
constexpr size_t kMaxTenantsFileBytes = 1 << 20;

// The next blank-separated field of `line`, which loses it.
std::string_view Field(std::string_view* line) {
  *line = TrimBlanks(*line);
  size_t end = 0;
  while (end < line->size() && (*line)[end] != ' ' && (*line)[end] != '\t') end++;
  std::string_view field = line->substr(0, end);
  line->remove_prefix(end);
  return field;
}
}  // namespace

bool ValidTenantName(std::string_view name) {
  if (name.empty() || name.size() > kMaxTenantName || name == "default") return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Result<std::vector<TenantSpec>> ParseTenants(std::string_view text, const std::string& path) {
  std::vector<TenantSpec> tenants;
  std::set<std::string, std::less<>> names, tokens;
  for (size_t number = 1; !text.empty(); ++number) {  // each pass consumes a line
    std::string_view line = NextLine(&text);
    if (line.empty() || line.front() == '#') continue;
    const auto bad = [&](const std::string& why) {
      return Status(ErrorCode::INVALID_PARAMS,
                    "tenants file " + path + " line " + std::to_string(number) + ": " + why);
    };
    TenantSpec t;
    t.name = std::string(Field(&line));
    const std::string_view token = Field(&line);
    const std::string_view quota = TrimBlanks(line);
    if (!ValidTenantName(t.name)) {
      return bad("a tenant's name is 1-64 of A-Z a-z 0-9 _ . - and not \"default\"");
    }
    if (token.empty()) return bad("no token (the form is NAME TOKEN [QUOTA])");
    if (Status s = CheckSecret(token); !s.ok()) return bad("the token: " + s.message());
    if (!quota.empty()) {
      auto q = ParseSize(quota);
      if (!q.ok()) return bad(q.status().message());
      if (*q == 0) return bad("a quota of 0 would refuse every put (leave it out for none)");
      t.quota_bytes = *q;
    }
    if (!names.insert(t.name).second) return bad("tenant " + t.name + " is named twice");
    if (!tokens.insert(std::string(token)).second) {
      return bad("tenant " + t.name + " has another tenant's token");
    }
    t.token = std::string(token);
    tenants.push_back(std::move(t));
  }
  return tenants;
}

Result<std::vector<TenantSpec>> LoadTenantsFile(const std::string& path) {
  auto text = ReadPrivateFile(path, kMaxTenantsFileBytes, "tenants file");
  if (!text.ok()) return text.status();
  return ParseTenants(*text, path);
}

}  // namespace granary::security
