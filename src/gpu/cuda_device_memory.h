// gpu/cuda_device_memory.h - GPU memory as a client's DeviceMemory (granary/client.h), over the
// CUDA runtime found at run time.
//
// Promise: the client's CPU never loads or stores a range Holds accepts; bytes reach it or leave
// it only through cudaMemcpyAsync, on a stream of the calling thread's for the GPU that owns the
// range (the thread switches to that GPU first), and Wait returns once every copy the thread
// started since its last Wait is done. A copy that continues the thread's previous one (the
// next bytes of both ranges, same GPU and direction, the GPU side inside one range `device_of`
// knows) may join it as one DMA, handed to CUDA by 8 MiB or at the next Wait; a copy CUDA
// refuses fails that Wait, and every copy call after it until then, so no copy is ever reported
// done that was not made. The held copy and the failure are the thread's, whichever instance
// started them: a thread copies through one instance at a time, between Waits. Register pins a mapped segment (cudaHostRegister) so the
// GPUs' copy engines read and write it directly; the returned handle unregisters it when the
// client drops it, which the client does before unmapping. A segment that cannot be pinned
// still works (the driver stages the copy). Which ranges are GPU memory, and of which GPU, is the
// caller's to say (`device_of`: the Python binding's registry).
// Ownership: borrows the runtime. Thread safety: any thread; each thread copies on its own
// streams (one per GPU, made on the thread's first copy to it, kept for the thread's life).
#pragma once

#include <functional>

#include "gpu/cuda_runtime.h"
#include "granary/client.h"

namespace granary::gpu {

class CudaDeviceMemory final : public DeviceMemory {
 public:
  // The GPU whose memory holds all of [p, p + n), or -1 when that is not one GPU's memory.
  using DeviceOfFn = std::function<int(const std::byte*, uint64_t)>;
  CudaDeviceMemory(const CudaRuntime& cuda, DeviceOfFn device_of);

  bool Holds(const std::byte* p, uint64_t n) const override { return device_of_(p, n) >= 0; }
  Status CopyIn(std::byte* dst, const std::byte* src, uint64_t n) override;
  Status CopyOut(std::byte* dst, const std::byte* src, uint64_t n) override;
  Status Wait() override;
  std::shared_ptr<void> Register(std::byte* base, uint64_t size) override;

 private:
  // The calling thread's stream for `device`, made current on this thread.
  Result<CudaRuntime::Stream> StreamFor(int device);
  // Holds the copy back to merge with the next one (the header says when it is handed over).
  Status Copy(std::byte* dst, const std::byte* src, uint64_t n, bool to_device);
  // Hands the held copy to CUDA; a refusal is kept for the next Wait.
  void HandOver();

  const CudaRuntime& cuda_;
  DeviceOfFn device_of_;
};

}  // namespace granary::gpu
