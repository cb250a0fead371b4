// gpu/cuda_runtime.h - the CUDA runtime, found when the process runs, never when it is built.
//
// Promise: Granary builds, runs and passes its tests on machines without CUDA. The first call to
// Instance() looks for libcudart once: $GRANARY_CUDART (a path; "none" turns CUDA off), a
// libcudart the process has already loaded (torch's, when torch initialised CUDA), then the
// names the dynamic loader resolves (libcudart.so, .so.13, .so.12, .so.11). It is `available()`
// only when the library loads, every function below resolves and at least one device answers;
// otherwise `why_not()` says which step failed, in words a user can act on. Nothing here is
// called on a machine where it is not available: every call then returns UNAVAILABLE.
// Only the few declarations Granary needs are written out here (types as CUDA's runtime API
// documents them); no CUDA header is included.
// Ownership: one process-wide instance, never unloaded. Thread safety: any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "granary/status.h"

namespace granary::gpu {

class CudaRuntime {
 public:
  static CudaRuntime& Instance();

  bool available() const { return available_; }
  const std::string& why_not() const { return why_not_; }
  const std::string& library() const { return library_; }  // the path loaded, or ""
  int device_count() const { return device_count_; }
  int runtime_version() const { return runtime_version_; }  // e.g. 13000; 0 when unknown

  enum class Memory { kHost, kDevice, kManaged };
  struct Pointer {
    Memory memory = Memory::kHost;
    int device = -1;
  };
  // What CUDA knows of an address: device memory, managed memory, or host memory (registered
  // with CUDA or not).
  Result<Pointer> Classify(const void* address) const;

  // Synchronous copies (cudaMemcpy with the direction given).
  Status CopyToDevice(void* device, const void* host, size_t bytes) const;
  Status CopyToHost(void* host, const void* device, size_t bytes) const;

  // Makes `device` the calling thread's current GPU (cudaSetDevice): streams it creates and
  // copies it starts then belong to that GPU.
  Status SetDevice(int device) const;

  // Asynchronous copies on a stream the caller created; Synchronize waits for them.
  using Stream = void*;
  Result<Stream> CreateStream() const;
  void DestroyStream(Stream stream) const;
  Status CopyToDeviceAsync(void* device, const void* host, size_t bytes, Stream stream) const;
  Status CopyToHostAsync(void* host, const void* device, size_t bytes, Stream stream) const;
  Status Synchronize(Stream stream) const;

  // Pins existing host memory (cudaHostRegister) so the GPU's copy engines read it directly;
  // UnregisterHost must run before the memory is unmapped.
  Status RegisterHost(void* address, size_t bytes) const;
  Status UnregisterHost(void* address) const;

  // Page-locked host memory, which the GPU's copy engines read and write directly.
  Result<void*> AllocatePinned(size_t bytes) const;
  void FreePinned(void* address) const;

  // Memory on the current GPU (cudaMalloc): benchmarks and tests; the store never allocates any.
  Result<void*> AllocateDevice(size_t bytes) const;
  void FreeDevice(void* address) const;

 private:
  CudaRuntime();
  bool Load(const std::string& path, std::string* error);
  Status Check(int code, const char* call) const;

  bool available_ = false;
  std::string why_not_;
  std::string library_;
  int device_count_ = 0;
  int runtime_version_ = 0;
  void* handle_ = nullptr;

  // cudaError_t is an int; enums are ints; cudaStream_t is a pointer.
  int (*get_device_count_)(int*) = nullptr;
  int (*set_device_)(int) = nullptr;
  int (*runtime_get_version_)(int*) = nullptr;
  const char* (*get_error_string_)(int) = nullptr;
  int (*get_last_error_)() = nullptr;
  int (*pointer_get_attributes_)(void*, const void*) = nullptr;
  int (*memcpy_)(void*, const void*, size_t, int) = nullptr;
  int (*memcpy_async_)(void*, const void*, size_t, int, void*) = nullptr;
  int (*stream_create_)(void**) = nullptr;
  int (*stream_destroy_)(void*) = nullptr;
  int (*stream_synchronize_)(void*) = nullptr;
  int (*malloc_host_)(void**, size_t) = nullptr;
  int (*free_host_)(void*) = nullptr;
  int (*malloc_)(void**, size_t) = nullptr;
  int (*free_)(void*) = nullptr;
  int (*host_register_)(void*, size_t, unsigned) = nullptr;
  int (*host_unregister_)(void*) = nullptr;
};

}  // namespace granary::gpu
