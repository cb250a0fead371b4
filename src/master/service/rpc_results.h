// master/service/rpc_results.h - turns per-key results into reply fields, the same way for every RPC of
// the master's gRPC service (internal to src/master).
#pragma once

#include <string>
#include <vector>

#include "granary/proto/master.pb.h"
#include "granary/status.h"

namespace granary::master {

inline int32_t Code(const Status& s) { return static_cast<int32_t>(s.code()); }

inline void SetStatus(const Status& s, proto::KeyStatus* out) {
  out->set_code(Code(s));
  if (!s.ok()) out->set_message(s.message());
}

template <typename Repeated>
std::vector<std::string> Keys(const Repeated& keys) {
  return std::vector<std::string>(keys.begin(), keys.end());
}

// Returns how many of them are errors.
inline size_t FillStatuses(const std::vector<Status>& statuses, proto::BatchStatusResponse* out) {
  size_t errors = 0;
  out->mutable_results()->Reserve(static_cast<int>(statuses.size()));
  for (const auto& s : statuses) {
    SetStatus(s, out->add_results());
    errors += !s.ok();
  }
  return errors;
}

}  // namespace granary::master
