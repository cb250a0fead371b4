// client/replica_admin.h - the client's calls for replica counts and drains (Client::
// BatchReplicate, Drain, Undrain, ListDrains; docs/operations.md), kept out of client.cc.
// Thread safety: any thread (the locator is thread-safe).
#pragma once

#include <string>
#include <vector>

#include "client/master_locator.h"
#include "granary/client.h"
#include "granary/status.h"

namespace granary::client {

// A status per key. A failed call fails every key with its error.
std::vector<Status> ReplicateKeys(MasterLocator& master, const std::string& client_id,
                                  const std::vector<std::string>& keys, uint32_t replica_num);
// Neither is retried where its outcome is unknown: starting a drain twice answers
// OBJECT_ALREADY_EXISTS, which the caller may read as done.
Status DrainSegment(MasterLocator& master, const std::string& segment, bool drop, bool undrain);
Result<std::vector<DrainStatus>> ListDrains(MasterLocator& master);

}  // namespace granary::client
