// etcd/cluster_keys.h - where a Granary cluster keeps its coordination in etcd, and what the
// leader key says. Masters write these keys (master/ha/coordinator.h); nodes, clients and the
// CLI read the leader key to find the master to talk to.
//
//   /granary/<cluster>/leader         the leader's record (JSON below), under the leader's lease;
//                                     created by the winning campaign, deleted with the lease
//   /granary/<cluster>/sync           the member id of the one standby that may take over
//                                     (Patroni's synchronous standby); the leader's own id while
//                                     it has none
//   /granary/<cluster>/members/<id>   each running master (JSON: its addresses), under its lease
//
// Promise: a leader record with serving = false is a leader that is still taking over; clients
// use only a serving one (the address is published once it answers). ParseLeaderRecord accepts
// exactly what EncodeLeaderRecord writes (unknown JSON fields are ignored, a missing required
// one is an error).
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "granary/status.h"

namespace granary::etcd {

inline constexpr const char* kDefaultClusterId = "granary";

std::string ClusterPrefix(const std::string& cluster_id);  // "/granary/<cluster>/"
std::string LeaderKey(const std::string& cluster_id);
std::string SyncKey(const std::string& cluster_id);
std::string MembersPrefix(const std::string& cluster_id);
std::string MemberKey(const std::string& cluster_id, const std::string& member_id);

struct LeaderRecord {
  std::string id;          // the leader's member id (one per master process)
  std::string grpc;        // its gRPC address, host:port (what --advertise said)
  uint16_t fast_port = 0;  // its fast port on the same host (0: none)
  uint16_t http_port = 0;
  uint64_t term = 0;       // the etcd revision of its win
  bool serving = false;
  // Its fast port's local socket (an abstract unix socket name) for clients on its host; empty:
  // none. A record without it (an older master) parses with none.
  std::string fast_local;
};
std::string EncodeLeaderRecord(const LeaderRecord& record);
Result<LeaderRecord> ParseLeaderRecord(const std::string& json);

// The host of "host:port" or "[v6]:port" ("" if it has none).
std::string HostOf(const std::string& address);

}  // namespace granary::etcd
