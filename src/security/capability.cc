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

// The inner and outer hashes of HMAC (RFC 2104) with the key's padded blocks already absorbed.
struct CapabilitySigner::Pads {
  EVP_MD_CTX* inner = EVP_MD_CTX_new();
  EVP_MD_CTX* outer = EVP_MD_CTX_new();
  ~Pads() {
    EVP_MD_CTX_free(inner);
    EVP_MD_CTX_free(outer);
  }
};

CapabilitySigner::CapabilitySigner(std::string_view key) {
  if (key.empty()) return;
  constexpr size_t kBlock = 64;  // SHA-256's
  uint8_t block[kBlock] = {};
  if (key.size() > kBlock) {  // RFC 2104: a key longer than a block is hashed first
    unsigned int len = 0;
    EVP_Digest(key.data(), key.size(), block, &len, EVP_sha256(), nullptr);
  } else {
    std::memcpy(block, key.data(), key.size());
  }
  uint8_t ipad[kBlock], opad[kBlock];
  for (size_t i = 0; i < kBlock; ++i) {
    ipad[i] = block[i] ^ 0x36;
    opad[i] = block[i] ^ 0x5c;
  }
  auto pads = std::make_unique<Pads>();
  if (pads->inner == nullptr || pads->outer == nullptr ||
      EVP_DigestInit_ex(pads->inner, EVP_sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(pads->inner, ipad, kBlock) != 1 ||
      EVP_DigestInit_ex(pads->outer, EVP_sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(pads->outer, opad, kBlock) != 1) {
    std::abort();  // no SHA-256 in this OpenSSL: nothing could be signed or checked
  }
  OPENSSL_cleanse(block, sizeof(block));
  OPENSSL_cleanse(ipad, sizeof(ipad));
  OPENSSL_cleanse(opad, sizeof(opad));
  pads_ = std::move(pads);
}

CapabilitySigner::~CapabilitySigner() = default;

CapabilityMac CapabilitySigner::Sign(const CapabilityGrant& grant) const {
  CapabilityMac mac{};
  if (!pads_) return mac;
  // One work context per thread, reused: copying a state into it is the whole per-MAC setup.
  thread_local std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> work(EVP_MD_CTX_new(),
                                                                      EVP_MD_CTX_free);
  const auto message = Message(grant);
  uint8_t inner[EVP_MAX_MD_SIZE], outer[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_MD_CTX_copy_ex(work.get(), pads_->inner) != 1 ||
      EVP_DigestUpdate(work.get(), message.data(), message.size()) != 1 ||
      EVP_DigestFinal_ex(work.get(), inner, &len) != 1 ||
      EVP_MD_CTX_copy_ex(work.get(), pads_->outer) != 1 ||
      EVP_DigestUpdate(work.get(), inner, len) != 1 ||
      EVP_DigestFinal_ex(work.get(), outer, &len) != 1) {
    std::abort();  // out of memory in OpenSSL
  }
  std::memcpy(mac.data(), outer, mac.size());
  return mac;
}

bool CapabilitySigner::Verify(const CapabilityGrant& grant, const uint8_t* mac) const {
  if (!pads_) return false;
  const CapabilityMac expected = Sign(grant);
  return CRYPTO_memcmp(expected.data(), mac, expected.size()) == 0;
}

bool CapabilityCovers(const CapabilityGrant& grant, uint64_t offset, uint64_t length) {
  if (offset < grant.offset) return false;
  const uint64_t skip = offset - grant.offset;
  return skip <= grant.length && length <= grant.length - skip;
}

}  // namespace granary::security
