// node/wire_capability.h - a replica's capability as the master's answer carries it, made into
// the data plane's (transfer::Capability; security/capability.h), for every reader of replicas
// the master names: the client's reads and writes, a node's re-replication copies.
// A replica with none (a trusted cluster's, or one that quotes the segment token) gives nullopt.
// One whose MAC is not 16 bytes is sent as it is: the node refuses it.
#pragma once

#include <algorithm>
#include <cstring>
#include <optional>

#include "granary/proto/master.pb.h"
#include "transfer/protocol.h"

namespace granary::node {

inline std::optional<transfer::Capability> WireCapability(const proto::Replica& replica) {
  if (!replica.has_capability()) return std::nullopt;
  const proto::Capability& c = replica.capability();
  transfer::Capability cap;
  cap.grant_offset = c.grant_offset();
  cap.grant_length = c.grant_length();
  cap.expiry_unix_ms = c.expiry_unix_ms();
  cap.access = c.access();
  std::memcpy(cap.mac, c.mac().data(), std::min(c.mac().size(), sizeof(cap.mac)));
  return cap;
}

}  // namespace granary::node
