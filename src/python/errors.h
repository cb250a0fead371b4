// python/errors.h - how a granary::Status becomes a Python exception.
//
// Promise: a StatusException thrown by any binding reaches Python as the granary.Error subclass
// registered for its code (granary/errors.py registers them at import), carrying .code and the
// message; before registration it is a RuntimeError. Thread safety: Raise may be called on any
// thread; the translation runs with the GIL held, as pybind11 does.
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "granary/status.h"

namespace granary::python {

class StatusException : public std::runtime_error {
 public:
  explicit StatusException(const Status& s) : std::runtime_error(s.message()), code_(s.code()) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

[[noreturn]] inline void Raise(const Status& s) { throw StatusException(s); }

template <typename T>
T Unwrap(Result<T>&& r) {
  if (!r.ok()) Raise(r.status());
  return std::move(*r);
}

// Registers the translator and the `_set_error_factory` hook on the module.
void RegisterErrors(pybind11::module_& m);

}  // namespace granary::python
