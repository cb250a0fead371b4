// security/capability.h - data-plane capabilities: the right to read or to write one byte range
// of one mount of a segment, until a deadline, that a master grants to a caller who must not hold
// the segment's token (a tenant: docs/security.md, "Capabilities").
//
// Promise: a capability is the grant (range, access, expiry) and an HMAC-SHA256 over it under the
// mount's capability key, a random kCapabilityKeyBytes that the node draws at every mount and
// tells only the master. Without the key no one can make a capability a node accepts, widen a
// range, turn a read into a write or extend a deadline (the MAC, truncated to 16 bytes, covers
// every field); a capability of an earlier mount fails under the new mount's key.
// VerifyCapability's time depends on nothing secret. No function here logs a key or a MAC.
// Thread safety: pure functions; NewCapabilityKey reads the kernel's random source.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace granary::security {

inline constexpr size_t kCapabilityKeyBytes = 32;
inline constexpr size_t kCapabilityMacBytes = 16;

enum class CapabilityAccess : uint32_t { kRead = 1, kWrite = 2 };

struct CapabilityGrant {
  uint64_t offset = 0;  // the granted range of the segment
  uint64_t length = 0;
  int64_t expiry_unix_ms = 0;  // wall clock; the node refuses the capability after it
  CapabilityAccess access = CapabilityAccess::kRead;
};

using CapabilityMac = std::array<uint8_t, kCapabilityMacBytes>;

// kCapabilityKeyBytes from the kernel's random source.
std::string NewCapabilityKey();
// The MAC of `grant` under `key` (any length; a mount's is kCapabilityKeyBytes).
CapabilityMac SignCapability(std::string_view key, const CapabilityGrant& grant);
// True when `mac` is grant's under `key`; false for an empty key.
bool VerifyCapability(std::string_view key, const CapabilityGrant& grant, const uint8_t* mac);
// True when [offset, offset + length) lies inside the grant's range (overflow-safe).
bool CapabilityCovers(const CapabilityGrant& grant, uint64_t offset, uint64_t length);

// SignCapability and VerifyCapability under one key, with the key's HMAC pads absorbed once at
// construction: a MAC then costs two SHA-256 blocks (0.3 us against 1.9 us for a one-shot HMAC
// on the dev VM), which matters to a master that signs every replica of every get.
// Immutable once made; any number of threads may sign and verify at once (each copies the
// absorbed states into a context of its own).
class CapabilitySigner {
 public:
  explicit CapabilitySigner(std::string_view key);  // an empty key verifies nothing
  ~CapabilitySigner();
  CapabilitySigner(const CapabilitySigner&) = delete;
  CapabilitySigner& operator=(const CapabilitySigner&) = delete;

  CapabilityMac Sign(const CapabilityGrant& grant) const;
  bool Verify(const CapabilityGrant& grant, const uint8_t* mac) const;

 private:
  struct Pads;
  std::unique_ptr<Pads> pads_;  // null for an empty key
};

}  // namespace granary::security
