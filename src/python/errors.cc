#include "python/errors.h"

namespace py = pybind11;

namespace granary::python {
namespace {

// granary.errors.error_for(code, message) -> an exception instance; set once at import.
py::object* error_factory = nullptr;

}  // namespace

void RegisterErrors(py::module_& m) {
  m.def("_set_error_factory", [](py::object factory) {
    if (error_factory == nullptr) error_factory = new py::object();  // lives as long as Python
    *error_factory = std::move(factory);
  });
  m.def("error_name", [](int code) { return std::string(ErrorCodeName(ErrorCodeFromInt(code))); },
        "the name of an error code, e.g. -704 -> OBJECT_NOT_FOUND");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusException& e) {
      const int code = static_cast<int>(e.code());
      if (error_factory == nullptr || error_factory->is_none()) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return;
      }
      try {
        py::object exc = (*error_factory)(code, e.what());
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
      } catch (py::error_already_set& inner) {
        inner.restore();
      }
    }
  });
}

}  // namespace granary::python
