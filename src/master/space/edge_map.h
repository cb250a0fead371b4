// master/space/edge_map.h - the allocator's lookup of its free blocks by where they start or end:
// a position in kAlignment units (below 2^58) -> the block's node. UINT64_MAX is no position.
// The table itself: common/int_map.h (its promises, its memory: 12 bytes a slot).
#pragma once

#include <cstdint>

#include "common/int_map.h"

namespace granary::master {

using EdgeMap = IntMap<uint64_t, UINT64_MAX>;

}  // namespace granary::master
