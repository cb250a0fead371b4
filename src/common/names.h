// common/names.h - the one rule for names that end up in paths: segment and shared-memory names.
//
// Promise: a valid shared-memory name is one path component, 1..200 characters from
// [A-Za-z0-9._-], not "." or "..": it cannot escape /dev/shm, hide a NUL, or blow up a message.
// The node (create), the client (attach) and the master (mount) apply the same rule, so all three
// refuse the same names. A segment name follows the same rule but may also hold ':' '[' ']', so
// Mooncake's "host:port" names (and "[v6]:port") work; the node derives its shm name from it.
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "granary/status.h"

namespace granary {

inline constexpr size_t kMaxNameBytes = 200;

// OK, or INVALID_PARAMS naming `what`, the (truncated) name and the rule.
// `extra` lists characters allowed beyond [A-Za-z0-9._-] (never '/' or NUL).
inline Status ValidateName(std::string_view what, std::string_view name,
                           std::string_view extra = "") {
  bool ok = !name.empty() && name.size() <= kMaxNameBytes && name != "." && name != "..";
  for (char c : name) {
    bool allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '.' || c == '_' || c == '-' ||
                   (c != '/' && c != '\0' && extra.find(c) != std::string_view::npos);
    if (!allowed) ok = false;
  }
  if (ok) return Status::Ok();
  std::string shown;
  for (char c : name.substr(0, 210)) shown += (c >= 0x20 && c < 0x7F) ? c : '?';
  return Status(ErrorCode::INVALID_PARAMS,
                "invalid " + std::string(what) + " '" + shown + "': expected 1 to 200 characters from [A-Za-z0-9._-" +
                    std::string(extra) + "] (no '/')");
}

// Segment names: the shm rule plus ':' '[' ']' for "host:port" names.
inline Status ValidateSegmentName(std::string_view name) {
  return ValidateName("segment name", name, ":[]");
}

}  // namespace granary
