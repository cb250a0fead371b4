// common/http_client.h - one plain-HTTP GET, for tools that read a process's /metrics or /status.
//
// Promise: HttpGet connects to host:port, asks for `path` and returns the body of a 200 answer.
// A connection that fails or a read that passes timeout_ms (each of connect, send and receive) is
// RPC_FAIL, another status code is RPC_FAIL naming it; nothing is retried. No TLS: the HTTP ports
// of masters and nodes are plain (docs/operations.md).
// Ownership: nothing outlives the call.
// Thread safety: safe from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "granary/status.h"

namespace granary {

Result<std::string> HttpGet(const std::string& host, uint16_t port, const std::string& path,
                            int timeout_ms);

}  // namespace granary
