// tools/bench/trace_file.h - a request trace in Mooncake's FAST'25 format (JSON lines:
// timestamp, input_length, hash_ids of 512-token prefix blocks) and how a prefix hit is counted.
// Shared by the replay against a store (trace_bench.cc) and the offline simulator (trace_sim.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "granary/status.h"

namespace granary::bench {

inline constexpr uint64_t kTokensPerBlock = 512;

struct TraceRequest {
  uint64_t timestamp_ms = 0;  // arrival, from the start of the trace
  uint64_t input_length = 0;
  std::vector<uint64_t> hash_ids;
};

// The first `limit` requests (0: all) of a trace; requests without blocks are skipped.
Result<std::vector<TraceRequest>> LoadTrace(const std::string& path, uint64_t limit);

// Tokens a hit prefix of `hit_blocks` blocks saves: 512 a block, or the whole input when every
// block hit (the last block is partial), as shared/workloads/README.md counts them.
inline uint64_t HitTokens(const TraceRequest& r, size_t hit_blocks) {
  return hit_blocks < r.hash_ids.size() ? hit_blocks * kTokensPerBlock : r.input_length;
}

}  // namespace granary::bench
