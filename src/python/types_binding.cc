#include "python/types_binding.h"

#include <pybind11/stl.h>

#include <iterator>
#include <string>
#include <vector>

#include "gpu/cuda_runtime.h"
#include "granary/client.h"
#include "python/buffers.h"
#include "python/errors.h"

namespace py = pybind11;

namespace granary::python {
namespace {

// ReplicateConfig.persistence by the names of the master's --persistence flag (plus "default").
constexpr const char* kPersistenceNames[] = {"default", "eager", "lazy", "none"};
const char* PersistenceName(Persistence p) {
  const auto i = static_cast<size_t>(p);
  return i < std::size(kPersistenceNames) ? kPersistenceNames[i] : "?";
}
Persistence PersistenceFromName(const std::string& name) {
  for (size_t i = 0; i < std::size(kPersistenceNames); ++i) {
    if (name == kPersistenceNames[i]) return static_cast<Persistence>(i);
  }
  Raise(Status(ErrorCode::INVALID_PARAMS, "persistence '" + name.substr(0, 64) +
                                              "' is none of default, eager, lazy, none"));
}

}  // namespace


void RegisterTypes(py::module_& m) {
  py::class_<OwnedBuffer>(m, "Buffer", py::buffer_protocol(),
                          "Bytes a get_buffer call allocated; supports the buffer protocol.")
      .def_buffer([](OwnedBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {1});
      })
      .def("ptr", [](const OwnedBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); })
      .def("size", &OwnedBuffer::size)
      .def("__len__", &OwnedBuffer::size)
      .def("__bytes__", [](const OwnedBuffer& b) {
        return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
      });

  py::class_<ReplicateConfig>(m, "ReplicateConfig")
      .def(py::init([](uint32_t replica_num, bool soft, bool hard, std::vector<std::string> pref,
                       uint64_t ttl, const std::string& persistence) {
             return ReplicateConfig{replica_num, soft, hard, std::move(pref), ttl,
                                    PersistenceFromName(persistence)};
           }),
           py::arg("replica_num") = 1, py::arg("with_soft_pin") = false,
           py::arg("with_hard_pin") = false,
           py::arg("preferred_segments") = std::vector<std::string>{},
           py::arg("soft_pin_ttl_ms") = 0, py::arg("persistence") = "default")
      .def_property(
          "persistence", [](const ReplicateConfig& c) { return PersistenceName(c.persistence); },
          [](ReplicateConfig& c, const std::string& name) {
            c.persistence = PersistenceFromName(name);
          },
          "\"default\" (the master's --persistence), \"eager\", \"lazy\" or \"none\"")
      .def_readwrite("replica_num", &ReplicateConfig::replica_num)
      .def_readwrite("with_soft_pin", &ReplicateConfig::with_soft_pin)
      .def_readwrite("with_hard_pin", &ReplicateConfig::with_hard_pin)
      .def_readwrite("preferred_segments", &ReplicateConfig::preferred_segments)
      .def_readwrite("soft_pin_ttl_ms", &ReplicateConfig::soft_pin_ttl_ms);

  py::class_<MemPool>(m, "MemPool")
      .def(py::init([](uint64_t size) { return Unwrap(MemPool::Create(size)); }), py::arg("size"))
      .def("alloc", &MemPool::Allocate, py::arg("size"), "an address, or 0 if the pool is full")
      .def("free", [](MemPool& p, uintptr_t a) {
        if (Status s = p.Free(a); !s.ok()) Raise(s);
      })
      .def_property_readonly("base", &MemPool::base)
      .def_property_readonly("size", &MemPool::size)
      .def_property_readonly("free_bytes", &MemPool::free_bytes);

  m.def("host_alloc", [](uint64_t size) {
    py::gil_scoped_release release;
    return HostMemory::Instance().Allocate(size);
  }, py::arg("size"), "shared host memory for MooncakeHostMemAllocator; 0 on failure");
  m.def("host_free", [](uintptr_t address) {
    Status s;
    {
      py::gil_scoped_release release;
      s = HostMemory::Instance().Free(address);
    }
    if (!s.ok()) Raise(s);
  }, py::arg("address"));
  m.def("cuda_status", [] {
    const auto& cuda = gpu::CudaRuntime::Instance();  // looked for once, on this first call
    py::dict d;
    d["available"] = cuda.available();
    d["reason"] = cuda.why_not();
    d["library"] = cuda.library();
    d["devices"] = cuda.device_count();
    d["runtime_version"] = cuda.runtime_version();
    return d;
  }, "whether GPU memory can be registered: the CUDA runtime found, its GPUs, or why not");
}

}  // namespace granary::python
