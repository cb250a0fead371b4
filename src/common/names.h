// common/names.h - the one rule for names that end up in paths: segment and shared-memory names.
//
// Promise: a valid name is one path component, 1..200 characters from [A-Za-z0-9._-], not "."
// or "..": it cannot escape /dev/shm, hide a NUL, or blow up a message. The node (create), the
// client (attach) and the master (mount) apply the same rule, so all three refuse the same names.
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "granary/status.h"

namespace granary {

inline constexpr size_t kMaxNameBytes = 200;

// OK, or INVALID_PARAMS naming `what`, the (truncated) name and the rule.
inline Status ValidateName(std::string_view what, std::string_view name) {
  bool ok = !name.empty() && name.size() <= kMaxNameBytes && name != "." && name != "..";
  for (char c : name) {
    bool allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '.' || c == '_' || c == '-';
    if (!allowed) ok = false;
  }
  if (ok) return Status::Ok();
  std::string shown;
  for (char c : name.substr(0, 210)) shown += (c >= 0x20 && c < 0x7F) ? c : '?';
  return Status(ErrorCode::INVALID_PARAMS,
                "invalid " + std::string(what) + " '" + shown +
                    "': expected 1 to 200 characters from [A-Za-z0-9._-] (no '/')");
}

}  // namespace granary
