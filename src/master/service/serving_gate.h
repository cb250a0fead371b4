// master/service/serving_gate.h - what a call must pass before and after it changes the state, so
// that only a leader serves and no reply runs ahead of the replication its mode promises.
//
// Promise: MasterService asks Enter() before a call touches the state: an error means this
// master must not serve it (a standby, a leader whose lease is not fresh, a leader with no
// synchronous standby) and nothing was applied. After the call applied its operations and
// before the reply, Commit(seq) waits until operation `seq` (and so every earlier one) is where
// the mode needs it; an error then means the operation happened here but may not survive a
// failover: the caller learns an unknown outcome, never a success. Exit() pairs with every
// successful Enter(): a role change waits for the calls in flight to leave before it touches
// the state (master/ha/coordinator.h).
// A master without HA has no gate (MasterService's gate is null): every call is served.
// Thread safety: every method from any thread, concurrently.
#pragma once

#include <cstdint>

#include "granary/status.h"

namespace granary::master {

class ServingGate {
 public:
  virtual ~ServingGate() = default;
  // update: the call may change the state (it then needs a synchronous standby, where required).
  virtual Status Enter(bool update) = 0;
  virtual void Exit() = 0;
  virtual Status Commit(uint64_t seq) = 0;
  // The leader's term (etcd revision of its win), carried by replies that hand out space or
  // locations; 0 without HA.
  virtual uint64_t term() const = 0;
};

}  // namespace granary::master
