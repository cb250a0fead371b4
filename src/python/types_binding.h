// python/types_binding.h - the `_granary` module's value types and memory helpers: Buffer (bytes
// a get_buffer call allocated), ReplicateConfig, MemPool, host_alloc/host_free, cuda_status.
//
// Promise: what these register holds no client and moves no object; ReplicateConfig's persistence
// takes only the master's --persistence names (plus "default") and raises on any other.
// Registered before the Client class (python/client_binding.h), whose calls take them.
// Thread safety: registration runs once, at import, with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include "granary/client.h"

namespace granary::python {

void RegisterTypes(pybind11::module_& m);

}  // namespace granary::python
