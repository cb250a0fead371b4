#include "gpu/cuda_device_memory.h"

namespace granary::gpu {

CudaDeviceMemory::CudaDeviceMemory(const CudaRuntime& cuda, HoldsFn holds)
    : cuda_(cuda), holds_(std::move(holds)) {}

Result<CudaRuntime::Stream> CudaDeviceMemory::ThreadStream() {
  // One per thread for the process's life: copies of different threads overlap, and Wait waits
  // for this thread's only. Never destroyed: the client's I/O threads live as long as it does.
  thread_local CudaRuntime::Stream stream = nullptr;
  if (stream == nullptr) {
    auto made = cuda_.CreateStream();
    if (!made.ok()) return made.status();
    stream = *made;
  }
  return stream;
}

Status CudaDeviceMemory::CopyIn(std::byte* dst, const std::byte* src, uint64_t n) {
  auto stream = ThreadStream();
  if (!stream.ok()) return stream.status();
  return cuda_.CopyToDeviceAsync(dst, src, n, *stream);
}

Status CudaDeviceMemory::CopyOut(std::byte* dst, const std::byte* src, uint64_t n) {
  auto stream = ThreadStream();
  if (!stream.ok()) return stream.status();
  return cuda_.CopyToHostAsync(dst, src, n, *stream);
}

Status CudaDeviceMemory::Wait() {
  auto stream = ThreadStream();
  if (!stream.ok()) return stream.status();
  return cuda_.Synchronize(*stream);
}

std::shared_ptr<void> CudaDeviceMemory::Register(std::byte* base, uint64_t size) {
  if (!cuda_.RegisterHost(base, size).ok()) return nullptr;
  const CudaRuntime* cuda = &cuda_;  // process-wide: outlives every handle
  return std::shared_ptr<void>(base, [cuda](void* p) { (void)cuda->UnregisterHost(p); });
}

}  // namespace granary::gpu
