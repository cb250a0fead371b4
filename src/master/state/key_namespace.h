// master/state/key_namespace.h - tenants' key namespaces inside the master's one key space.
//
// Promise: a tenant T's key K is held as "\0" T "\0" K; a key of the default namespace (callers
// without a tenant) is held as written and never begins with "\0": the service maps a caller's
// key that begins with it to InvalidKeyFromCaller(), which ValidateKey refuses (INVALID_KEY
// wherever keys are checked) and no object can have. So no key of one namespace names an
// object of another. A scope says which namespaces a query or a removal reaches; its pattern
// meets the key as its tenant wrote it.
// Thread safety: pure functions over values.
#pragma once

#include <string>
#include <string_view>

namespace granary::master {

inline constexpr char kNamespaceMark = '\0';

// "" for the default namespace, else "\0" tenant "\0".
inline std::string NamespacePrefix(std::string_view tenant) {
  if (tenant.empty()) return {};
  std::string prefix;
  prefix.reserve(tenant.size() + 2);
  prefix += kNamespaceMark;
  prefix += tenant;
  prefix += kNamespaceMark;
  return prefix;
}

// What a caller's key that begins with the mark becomes: refused by ValidateKey at a put, found
// nowhere by any other call.
inline std::string InvalidKeyFromCaller() { return std::string(1, kNamespaceMark); }

// The key as held, for a caller whose namespace prefix is `prefix`.
inline std::string HeldKey(std::string_view prefix, std::string_view key) {
  if (!key.empty() && key.front() == kNamespaceMark) return InvalidKeyFromCaller();
  if (prefix.empty()) return std::string(key);
  std::string held;
  held.reserve(prefix.size() + key.size());
  held += prefix;
  held += key;
  return held;
}

// The tenant a held key belongs to ("" for the default namespace).
inline std::string_view TenantOfKey(std::string_view key) {
  if (key.empty() || key.front() != kNamespaceMark) return {};
  const size_t end = key.find(kNamespaceMark, 1);
  return end == std::string_view::npos ? std::string_view() : key.substr(1, end - 1);
}

// Which namespaces a query or removal reaches: one (its prefix, "" the default), or every one.
struct KeyScope {
  std::string prefix;
  bool every = false;

  // The key as its tenant wrote it, if `held` is in scope; else false.
  bool Contains(std::string_view held, std::string_view* written) const {
    const bool marked = !held.empty() && held.front() == kNamespaceMark;
    if (every) {
      if (marked) {
        const size_t end = held.find(kNamespaceMark, 1);
        if (end == std::string_view::npos) return false;
        *written = held.substr(end + 1);
      } else {
        *written = held;
      }
      return true;
    }
    if (prefix.empty()) {
      if (marked) return false;
      *written = held;
      return true;
    }
    if (held.substr(0, prefix.size()) != prefix) return false;
    *written = held.substr(prefix.size());
    return true;
  }
};

}  // namespace granary::master
