#include "gpu/cuda_runtime.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

namespace granary::gpu {
namespace {

// The values CUDA's runtime API documents for the few enums used here.
constexpr int kSuccess = 0;
constexpr int kMemcpyHostToDevice = 1;
constexpr int kMemcpyDeviceToHost = 2;
constexpr int kMemoryTypeDevice = 2;
constexpr int kMemoryTypeManaged = 3;
// cudaPointerAttributes: {int type; int device; void* devicePointer; void* hostPointer; ...}, 88
// bytes in CUDA 13; room for a later, longer one.
struct PointerAttributes {
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
  char rest[224];
};

// A libcudart already mapped into this process (torch loads its own): the same runtime, so
// pointers and streams mean the same thing to both.
std::string LoadedCudart() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        const char* name = info->dlpi_name;
        if (name != nullptr && std::strstr(name, "/libcudart") != nullptr) {
          *static_cast<std::string*>(out) = name;
          return 1;
        }
        return 0;
      },
      &found);
  return found;
}

}  // namespace

CudaRuntime& CudaRuntime::Instance() {
  static CudaRuntime* runtime = new CudaRuntime();  // never destroyed: may be used at exit
  return *runtime;
}

CudaRuntime::CudaRuntime() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("GRANARY_CUDART"); env != nullptr && *env != '\0') {
    if (std::string(env) == "none") {
      why_not_ = "CUDA is turned off (GRANARY_CUDART=none)";
      return;
    }
    candidates.push_back(env);
  } else {
    if (std::string loaded = LoadedCudart(); !loaded.empty()) candidates.push_back(loaded);
    for (const char* name :
         {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}) {
      candidates.push_back(name);
    }
  }
  std::string errors;
  for (const std::string& path : candidates) {
    std::string error;
    if (Load(path, &error)) break;
    errors += (errors.empty() ? "" : "; ") + error;
  }
  if (handle_ == nullptr) {
    why_not_ = "no CUDA runtime found (" + errors +
               "); install CUDA or torch with CUDA, or set GRANARY_CUDART to libcudart's path";
    return;
  }
  runtime_get_version_(&runtime_version_);
  int count = 0;
  if (int rc = get_device_count_(&count); rc != kSuccess) {
    why_not_ = "the CUDA runtime " + library_ + " found no usable GPU: cudaGetDeviceCount: " +
               get_error_string_(rc);
    return;
  }
  if (count <= 0) {
    why_not_ = "the CUDA runtime " + library_ + " sees no GPU";
    return;
  }
  device_count_ = count;
  available_ = true;
}

bool CudaRuntime::Load(const std::string& path, std::string* error) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    *error = e != nullptr ? e : path + ": cannot be loaded";
    return false;
  }
  bool all = true;
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (fn == nullptr) {
      if (all) *error = path + " lacks " + name;
      all = false;
    }
  };
  bind(get_device_count_, "cudaGetDeviceCount");
  bind(set_device_, "cudaSetDevice");
  bind(runtime_get_version_, "cudaRuntimeGetVersion");
  bind(get_error_string_, "cudaGetErrorString");
  bind(get_last_error_, "cudaGetLastError");
  bind(pointer_get_attributes_, "cudaPointerGetAttributes");
  bind(memcpy_, "cudaMemcpy");
  bind(memcpy_async_, "cudaMemcpyAsync");
  bind(stream_create_, "cudaStreamCreate");
  bind(stream_destroy_, "cudaStreamDestroy");
  bind(stream_synchronize_, "cudaStreamSynchronize");
  bind(malloc_host_, "cudaMallocHost");
  bind(free_host_, "cudaFreeHost");
  bind(malloc_, "cudaMalloc");
  bind(free_, "cudaFree");
  bind(host_register_, "cudaHostRegister");
  bind(host_unregister_, "cudaHostUnregister");
  if (!all) {
    dlclose(handle);
    return false;
  }
  handle_ = handle;
  library_ = path;
  return true;
}

Status CudaRuntime::Check(int code, const char* call) const {
  if (code == kSuccess) return Status::Ok();
  return Status(ErrorCode::TRANSFER_FAIL, std::string(call) + ": " + get_error_string_(code));
}

#define GRANARY_NEED_CUDA()                                                        \
  do {                                                                             \
    if (!available_) return Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, why_not_); \
  } while (0)

Result<CudaRuntime::Pointer> CudaRuntime::Classify(const void* address) const {
  GRANARY_NEED_CUDA();
  PointerAttributes attributes{};
  if (int rc = pointer_get_attributes_(&attributes, address); rc != kSuccess) {
    // Older runtimes answer an error for memory they never saw: that is host memory.
    get_last_error_();  // and leave it as this thread's last error otherwise
    return Pointer{Memory::kHost, -1};
  }
  if (attributes.type == kMemoryTypeDevice) return Pointer{Memory::kDevice, attributes.device};
  if (attributes.type == kMemoryTypeManaged) return Pointer{Memory::kManaged, attributes.device};
  return Pointer{Memory::kHost, -1};
}

Status CudaRuntime::CopyToDevice(void* device, const void* host, size_t bytes) const {
  GRANARY_NEED_CUDA();
  return Check(memcpy_(device, host, bytes, kMemcpyHostToDevice), "cudaMemcpy to the GPU");
}

Status CudaRuntime::CopyToHost(void* host, const void* device, size_t bytes) const {
  GRANARY_NEED_CUDA();
  return Check(memcpy_(host, device, bytes, kMemcpyDeviceToHost), "cudaMemcpy from the GPU");
}

Status CudaRuntime::SetDevice(int device) const {
  GRANARY_NEED_CUDA();
  return Check(set_device_(device), "cudaSetDevice");
}

Result<CudaRuntime::Stream> CudaRuntime::CreateStream() const {
  GRANARY_NEED_CUDA();
  Stream stream = nullptr;
  if (Status s = Check(stream_create_(&stream), "cudaStreamCreate"); !s.ok()) return s;
  return stream;
}

void CudaRuntime::DestroyStream(Stream stream) const {
  if (available_ && stream != nullptr) stream_destroy_(stream);
}

Status CudaRuntime::CopyToDeviceAsync(void* device, const void* host, size_t bytes,
                                      Stream stream) const {
  GRANARY_NEED_CUDA();
  return Check(memcpy_async_(device, host, bytes, kMemcpyHostToDevice, stream),
               "cudaMemcpyAsync to the GPU");
}

Status CudaRuntime::CopyToHostAsync(void* host, const void* device, size_t bytes,
                                    Stream stream) const {
  GRANARY_NEED_CUDA();
  return Check(memcpy_async_(host, device, bytes, kMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync from the GPU");
}

Status CudaRuntime::Synchronize(Stream stream) const {
  GRANARY_NEED_CUDA();
  return Check(stream_synchronize_(stream), "cudaStreamSynchronize");
}

Status CudaRuntime::RegisterHost(void* address, size_t bytes) const {
  GRANARY_NEED_CUDA();
  return Check(host_register_(address, bytes, 1 /* cudaHostRegisterPortable */),
               "cudaHostRegister");
}

Status CudaRuntime::UnregisterHost(void* address) const {
  GRANARY_NEED_CUDA();
  return Check(host_unregister_(address), "cudaHostUnregister");
}

Result<void*> CudaRuntime::AllocatePinned(size_t bytes) const {
  GRANARY_NEED_CUDA();
  void* p = nullptr;
  if (Status s = Check(malloc_host_(&p, bytes), "cudaMallocHost"); !s.ok()) return s;
  return p;
}

void CudaRuntime::FreePinned(void* address) const {
  if (available_ && address != nullptr) free_host_(address);
}

Result<void*> CudaRuntime::AllocateDevice(size_t bytes) const {
  GRANARY_NEED_CUDA();
  void* p = nullptr;
  if (Status s = Check(malloc_(&p, bytes), "cudaMalloc"); !s.ok()) return s;
  return p;
}

void CudaRuntime::FreeDevice(void* address) const {
  if (available_ && address != nullptr) free_(address);
}

}  // namespace granary::gpu
