// master/state/ghost_index.h - s3fifo's ghost index: a key's fingerprint -> the newest ghost
// entry naming it.
//
// Why: the ghost remembers eviction_ghost_ratio (4) x the objects held, so in a full cache it
// holds more entries than the master has objects. A slot is a 32-bit fingerprint of the key and
// the low 32 bits of the entry's number, 8 bytes, in an IntMap (common/int_map.h: between 1/4
// and 3/4 full): 11-21 bytes an entry while it grows, at most 32 after any set. With 64-bit
// hashes and numbers a slot was 16 bytes, and a ghost entry ~37 bytes with its FIFO's, ~150 an
// object held (issue 23). A fingerprint is not the key: two keys may share one, and the ghost
// then answers for both (an admission hint, never data; GhostFingerprint says how rare).
// Promise: IntMap's, for any key but 0 (GhostFingerprint never makes it) and any value.
// Thread safety: as a plain value (the stripe's mutex guards it).
#pragma once

#include <cstdint>

#include "common/int_map.h"

namespace granary::master {

// A key's fingerprint in the ghost of stripe `hash >> 60`: the 32 bits below the stripe's (the
// shards take the low bits), never 0. With the stripe, 36 bits tell keys apart: a ghost of 40M
// entries (10M objects held) answers for a key it never saw about once in 1,700 lookups.
inline uint32_t GhostFingerprint(uint64_t hash) {
  const auto fp = static_cast<uint32_t>(hash >> 28);
  return fp != 0 ? fp : 1;
}

// Fingerprint -> the low 32 bits of its newest entry's number; 8 bytes a slot.
using GhostIndex = IntMap<uint32_t, 0>;

}  // namespace granary::master
