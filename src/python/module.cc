// python/module.cc - the `granary._granary` extension module: the C++ client for Python.
// The Pythonic API (granary.Store) and the Mooncake-compatible layer are written in Python on
// top of it (python/granary/).
#include <pybind11/pybind11.h>

#include <cstdlib>

#include "common/logging.h"
#include "common/units.h"
#include "python/client_binding.h"
#include "python/errors.h"
#include "python/types_binding.h"

namespace py = pybind11;

PYBIND11_MODULE(_granary, m) {
  using namespace granary;
  m.doc() = "Granary's C++ client (use the granary package, not this module)";
  // Quiet by default inside someone else's program: warnings and errors only.
  const char* level = std::getenv("GRANARY_LOG_LEVEL");
  (void)InitLogging("python", level != nullptr ? level : "warn");
  python::RegisterErrors(m);
  python::RegisterTypes(m);  // before the Client, whose calls take them
  python::RegisterClient(m);
  m.def("parse_size", [](const std::string& text) { return python::Unwrap(ParseSize(text)); },
        py::arg("text"), "bytes in a size such as \"16MB\", \"1 GB\", \"4KiB\" (units of 1024)");
  m.def("set_log_level", [](const std::string& level) {
    if (Status s = InitLogging("python", level); !s.ok()) python::Raise(s);
  }, py::arg("level"), "trace, debug, info, warn, error or off");
}
