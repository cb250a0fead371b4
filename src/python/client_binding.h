// python/client_binding.h - granary::Client as the `_granary.Client` Python class.
//
// Promise: every call releases the GIL while it talks to the master or moves bytes; Python
// objects are touched only with the GIL held. Single-key calls raise (a StatusException becomes
// a granary.Error); batch calls return one int per key (a size, 1/0, or 0 for success, negative
// error codes otherwise) so one bad key never hides the others. Raw addresses must lie inside a
// range registered with register_buffer. Buffers are pinned (BufferHold) for the whole call.
// Ownership: owns the granary::Client; close() stops its embedded node, later calls raise
// UNAVAILABLE_IN_CURRENT_STATUS. Thread safety: any Python thread, concurrently.
#pragma once

#include <pybind11/pybind11.h>

namespace granary::python {

void RegisterClient(pybind11::module_& m);

}  // namespace granary::python
