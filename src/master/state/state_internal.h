// master/state/state_internal.h - helpers shared by the files that implement MasterState.
// Internal to src/master: error values and limits every operation applies the same way.
#pragma once

#include <re2/re2.h>

#include <limits>
#include <memory>
#include <string>

#include "master/state/master_state.h"

namespace granary::master::internal {

inline Status NotFound(const std::string& key) {
  return Status(ErrorCode::OBJECT_NOT_FOUND, "no object '" + key.substr(0, 128) + "'");
}

// Compiles a user pattern with RE2: linear-time matching, bounded memory, no crash on bad input.
inline Result<std::unique_ptr<RE2>> CompilePattern(const std::string& pattern) {
  if (pattern.size() > kMaxPatternBytes) {
    return Status(ErrorCode::INVALID_PARAMS, "pattern of " + std::to_string(pattern.size()) +
                                                 " bytes exceeds the limit of " +
                                                 std::to_string(kMaxPatternBytes));
  }
  RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(8 << 20);
  auto re = std::make_unique<RE2>(pattern, options);
  if (!re->ok()) {
    return Status(ErrorCode::INVALID_PARAMS, "invalid pattern: " + re->error());
  }
  return re;
}

// now + ttl without overflow: a client may ask for a TTL of 2^63 - 1.
// What a reservation of `length` bytes takes from its segment and from its client's cap.
inline uint64_t ReservedCost(uint64_t length) { return OffsetAllocator::AllocationSize(length); }

inline int64_t SaturatingAdd(int64_t now, int64_t ttl) {
  if (ttl <= 0) return now;
  if (now > std::numeric_limits<int64_t>::max() - ttl) return std::numeric_limits<int64_t>::max();
  return now + ttl;
}

inline Status BatchLimit(size_t keys) {
  if (keys <= kMaxBatchKeys) return Status::Ok();
  return Status(ErrorCode::INVALID_PARAMS, "batch of " + std::to_string(keys) +
                                               " keys exceeds the limit of " +
                                               std::to_string(kMaxBatchKeys));
}

// The error every key of a batch gets when the batch as a whole is refused: per-key arrays of
// another length than the keys (`mismatch` says which), or too many keys. OK otherwise.
inline Status BatchShapeError(size_t keys, bool lengths_match, const char* mismatch) {
  if (!lengths_match) return Status(ErrorCode::INVALID_PARAMS, mismatch);
  return BatchLimit(keys);
}

// Load-aware placement's second candidate (puts and reservations): of the `rest` rotating
// segments after the preferred ones, the offset (1..rest-1) of the one compared with the
// rotation's pick. Chosen by the put generation `gen`, so a replay picks the same. rest >= 2.
inline size_t SecondChoice(uint64_t gen, size_t rest) {
  return 1 + (gen * 0x9E3779B97F4A7C15ull >> 33) % (rest - 1);
}

// A put's persistence beyond the enum (a newer client's, or junk): INVALID_PARAMS; else OK.
inline Status PersistenceError(PutPersistence p) {
  if (static_cast<uint8_t>(p) <= kMaxPutPersistence) return Status::Ok();
  return Status(ErrorCode::INVALID_PARAMS, "persistence " +
                                               std::to_string(static_cast<unsigned>(p)) +
                                               " is none of default, eager, lazy, none");
}

}  // namespace granary::master::internal
