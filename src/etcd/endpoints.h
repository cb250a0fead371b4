// etcd/endpoints.h - etcd endpoint lists: parsing "h1:p1;h2:p2" and resolving it into the one gRPC
// target that the client's channel is built on.
//
// Promise: ParseEndpoints accepts exactly the forms etcd_client.h documents and answers
// INVALID_PARAMS for anything else; nothing here talks to etcd. ResolveTarget calls getaddrinfo,
// which the system's resolver bounds, not the client's timeout.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "granary/status.h"

namespace granary::etcd {

struct HostPort {
  std::string host;  // a name, an IPv4 address or an IPv6 address (without brackets)
  uint16_t port = 0;
};

// "h1:p1;h2:p2" (';' or ',' between entries, blanks around them ignored, "[v6]:port" for IPv6
// addresses). An "etcd://" or "http://" prefix, on the whole string or on any entry, and a
// trailing '/' are dropped; "https://" is refused (the client speaks plain TCP).
Result<std::vector<HostPort>> ParseEndpoints(const std::string& endpoints);

// "h1:p1;h2:p2", the canonical form of a parsed list.
std::string JoinEndpoints(const std::vector<HostPort>& endpoints);

// Every address of every endpoint, in list order and without repeats, as one gRPC target:
// "ipv4:1.2.3.4:5,6.7.8.9:10", or "ipv6:[::1]:5,..." when no endpoint has an IPv4 address (one
// target holds one family; IPv4 wins because a name like "localhost" resolves to both and etcd
// commonly listens on one). A host that does not resolve is skipped with a warning;
// ETCD_OPERATION_ERROR when none resolves.
Result<std::string> ResolveTarget(const std::vector<HostPort>& endpoints);

}  // namespace granary::etcd
