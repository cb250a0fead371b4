#include "gpu/cuda_device_memory.h"

#include <cstdint>
#include <vector>

namespace granary::gpu {
namespace {

// A thread's streams, one per GPU it copied to, and which of them have copies not yet waited for.
// Never destroyed: the client's I/O threads live as long as it does.
struct ThreadStreams {
  std::vector<CudaRuntime::Stream> by_device;
  std::vector<char> pending;
};
thread_local ThreadStreams streams;

}  // namespace

CudaDeviceMemory::CudaDeviceMemory(const CudaRuntime& cuda, DeviceOfFn device_of)
    : cuda_(cuda), device_of_(std::move(device_of)) {}

Result<CudaRuntime::Stream> CudaDeviceMemory::StreamFor(int device) {
  if (device < 0) return Status(ErrorCode::INVALID_PARAMS, "not GPU memory");
  if (Status s = cuda_.SetDevice(device); !s.ok()) return s;
  if (streams.by_device.size() <= static_cast<size_t>(device)) {
    streams.by_device.resize(device + 1, nullptr);
    streams.pending.resize(device + 1, 0);
  }
  if (streams.by_device[device] == nullptr) {
    auto made = cuda_.CreateStream();
    if (!made.ok()) return made.status();
    streams.by_device[device] = *made;
  }
  streams.pending[device] = 1;
  return streams.by_device[device];
}

Status CudaDeviceMemory::CopyIn(std::byte* dst, const std::byte* src, uint64_t n) {
  auto stream = StreamFor(device_of_(dst, n));
  if (!stream.ok()) return stream.status();
  return cuda_.CopyToDeviceAsync(dst, src, n, *stream);
}

Status CudaDeviceMemory::CopyOut(std::byte* dst, const std::byte* src, uint64_t n) {
  auto stream = StreamFor(device_of_(src, n));
  if (!stream.ok()) return stream.status();
  return cuda_.CopyToHostAsync(dst, src, n, *stream);
}

Status CudaDeviceMemory::Wait() {
  Status first;
  for (size_t d = 0; d < streams.pending.size(); ++d) {
    if (!streams.pending[d]) continue;
    streams.pending[d] = 0;
    Status s = cuda_.Synchronize(streams.by_device[d]);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

std::shared_ptr<void> CudaDeviceMemory::Register(std::byte* base, uint64_t size) {
  // Portable: the pinning serves every GPU's copies, not only the current one's.
  if (!cuda_.RegisterHost(base, size).ok()) return nullptr;
  const CudaRuntime* cuda = &cuda_;  // process-wide: outlives every handle
  return std::shared_ptr<void>(base, [cuda](void* p) { (void)cuda->UnregisterHost(p); });
}

}  // namespace granary::gpu
