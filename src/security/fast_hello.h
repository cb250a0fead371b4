// security/fast_hello.h - how a connection to the master's fast port presents the cluster's
// secret: a kHello frame (proto/fast_frame.h) whose body is the secret, answered before any call.
//
// Promise: PresentSecret returns by its deadline: OK once the master accepted the connection
// (a master without a secret accepts any hello), UNAUTHENTICATED when it refused the secret (it
// then closes the connection), UNAVAILABLE_IN_CURRENT_STATUS when it was over its connection cap
// (nothing was read), or the transport's RPC_FAIL / RPC_TIMEOUT.
// Thread safety: one caller per connection.
#pragma once

#include <string_view>

#include "common/byte_stream.h"
#include "granary/status.h"

namespace granary::security {

Status PresentSecret(net::ByteStream& conn, std::string_view secret, net::SteadyTime deadline);

}  // namespace granary::security
