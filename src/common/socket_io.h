// common/socket_io.h - blocking steps over non-blocking TCP sockets, each bounded by a deadline.
//
// Promise: every function returns by its deadline (plus one poll() wake-up): a peer that stops
// reading or sending costs a timeout, never a hang. Errors are values: RPC_TIMEOUT when the
// deadline passed, RPC_FAIL for a closed or broken connection, with what failed in the message.
// Works on blocking and non-blocking descriptors alike (it polls before each step).
// Thread safety: none of its own; one thread per descriptor and direction.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "granary/status.h"

struct addrinfo;
struct sockaddr_un;

namespace granary::net {

using SteadyTime = std::chrono::steady_clock::time_point;

// Milliseconds to `deadline`, rounded up so poll() never wakes just before it; 0 once passed.
int MillisLeft(SteadyTime deadline);
// Waits until `fd` is ready for `events` (POLLIN / POLLOUT) or the deadline; false on timeout.
bool WaitFor(int fd, short events, SteadyTime deadline);

// A connected non-blocking socket (TCP_NODELAY) to the first of `addresses` (a getaddrinfo list)
// that accepts by `deadline`, trying each in turn: `localhost` may list ::1 before the 127.0.0.1
// a server listens on. `what` names the peer in errors.
Result<int> ConnectFirst(const addrinfo* addresses, SteadyTime deadline, const std::string& what);
// The same after resolving host:port.
Result<int> ConnectTcp(const std::string& host, uint16_t port, SteadyTime deadline);
// *sent (optional): the bytes that left before a failure (0: the peer saw nothing).
Status SendAll(int fd, std::string_view bytes, SteadyTime deadline, size_t* sent = nullptr);
// Exactly n bytes into out.
Status RecvExact(int fd, char* out, size_t n, SteadyTime deadline);

// Fills *addr with the abstract unix socket address `name` (no leading NUL in `name`) and
// returns its length for bind/connect; 0 if the name is empty or too long.
unsigned AbstractUnixAddress(std::string_view name, sockaddr_un* addr);

}  // namespace granary::net
