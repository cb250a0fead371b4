// gpu/cuda_device_memory.h - GPU memory as a client's DeviceMemory (granary/client.h), over the
// CUDA runtime found at run time.
//
// Promise: the client's CPU never loads or stores a range Holds accepts; bytes reach it or leave
// it only through cudaMemcpyAsync on a stream of the calling thread's, and Wait returns once
// they are there. Register pins a mapped segment (cudaHostRegister) so the GPU's copy engine reads it
// directly; the returned handle unregisters it when the client drops it, which the client does
// before unmapping. A segment that cannot be pinned still works (the driver stages the copy).
// Which ranges are GPU memory is the caller's to say (`holds`: the Python binding's registry).
// Ownership: borrows the runtime. Thread safety: any thread; each thread copies on its own
// stream (made on its first copy, kept for the thread's life).
#pragma once

#include <functional>

#include "gpu/cuda_runtime.h"
#include "granary/client.h"

namespace granary::gpu {

class CudaDeviceMemory final : public DeviceMemory {
 public:
  using HoldsFn = std::function<bool(const std::byte*, uint64_t)>;
  CudaDeviceMemory(const CudaRuntime& cuda, HoldsFn holds);

  bool Holds(const std::byte* p, uint64_t n) const override { return holds_(p, n); }
  Status CopyIn(std::byte* dst, const std::byte* src, uint64_t n) override;
  Status CopyOut(std::byte* dst, const std::byte* src, uint64_t n) override;
  Status Wait() override;
  std::shared_ptr<void> Register(std::byte* base, uint64_t size) override;

 private:
  Result<CudaRuntime::Stream> ThreadStream();

  const CudaRuntime& cuda_;
  HoldsFn holds_;
};

}  // namespace granary::gpu
