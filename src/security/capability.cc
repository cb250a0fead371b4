#include "security/capability.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace granary::security {

namespace {

// What the MAC covers: a domain tag (a capability is never mistaken for another MAC made with
// the same key) and every field of the grant, little-endian.
std::array<uint8_t, 36> Message(const CapabilityGrant& grant) {
  std::array<uint8_t, 36> m{};
  std::memcpy(m.data(), "GRNYCAP1", 8);
  std::memcpy(m.data() + 8, &grant.offset, 8);
  std::memcpy(m.data() + 16, &grant.length, 8);
  std::memcpy(m.data() + 24, &grant.expiry_unix_ms, 8);
  const auto access = static_cast<uint32_t>(grant.access);
  std::memcpy(m.data() + 32, &access, 4);
  return m;
}

}  // namespace

std::string NewCapabilityKey() {
  std::string key(kCapabilityKeyBytes, '\0');
  size_t got = 0;
  // getrandom of at most 256 bytes never returns short once the pool is initialised; EINTR is
  // retried, and the loop ends when the key is full.
  while (got < key.size()) {
    const ssize_t r = ::getrandom(key.data() + got, key.size() - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (errno != EINTR) {
      std::abort();  // no randomness: no key may be made at all
    }
  }
  return key;
}

CapabilityMac SignCapability(std::string_view key, const CapabilityGrant& grant) {
  const auto message = Message(grant);
  uint8_t full[EVP_MAX_MD_SIZE];
  unsigned int full_len = 0;
  ::HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message.data(), message.size(),
         full, &full_len);
  CapabilityMac mac{};
  std::memcpy(mac.data(), full, mac.size());
  return mac;
}

bool VerifyCapability(std::string_view key, const CapabilityGrant& grant, const uint8_t* mac) {
  if (key.empty()) return false;
  const CapabilityMac expected = SignCapability(key, grant);
  return CRYPTO_memcmp(expected.data(), mac, expected.size()) == 0;
}

bool CapabilityCovers(const CapabilityGrant& grant, uint64_t offset, uint64_t length) {
  if (offset < grant.offset) return false;
  const uint64_t skip = offset - grant.offset;
  return skip <= grant.length && length <= grant.length - skip;
}

}  // namespace granary::security
