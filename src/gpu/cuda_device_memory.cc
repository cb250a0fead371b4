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
  // The copy not yet handed to CUDA: a copy that continues it (the next bytes on both sides,
  // same GPU and direction) joins it, so that objects laid out back to back move in one DMA.
  struct Held {
    std::byte* dst = nullptr;
    const std::byte* src = nullptr;
    uint64_t n = 0;
    bool to_device = false;
    int device = -1;
    CudaRuntime::Stream stream = nullptr;
  } held;
  Status failed;  // the first copy CUDA refused since the last Wait: every copy since counts failed
};
thread_local ThreadStreams streams;

// A merged copy is handed over at this size, so the device starts while the CPU goes on.
constexpr uint64_t kMergeLimit = uint64_t{8} << 20;

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

void CudaDeviceMemory::HandOver() {
  ThreadStreams::Held& h = streams.held;
  if (h.n == 0) return;
  Status s = h.to_device ? cuda_.CopyToDeviceAsync(h.dst, h.src, h.n, h.stream)
                         : cuda_.CopyToHostAsync(h.dst, h.src, h.n, h.stream);
  if (streams.failed.ok() && !s.ok()) streams.failed = s;
  h = {};
}

Status CudaDeviceMemory::Copy(std::byte* dst, const std::byte* src, uint64_t n, bool to_device) {
  if (n == 0) return streams.failed;
  // The GPU's memory is the destination of a copy in and the source of a copy out.
  const int device = to_device ? device_of_(dst, n) : device_of_(src, n);
  ThreadStreams::Held& h = streams.held;
  // Both ranges continue the held copy's, and the GPU side stays inside one range of one GPU.
  const bool joins = h.n > 0 && h.device == device && h.to_device == to_device &&
                     h.dst + h.n == dst && h.src + h.n == src && h.n + n <= kMergeLimit &&
                     (to_device ? device_of_(h.dst, h.n + n) : device_of_(h.src, h.n + n)) == device;
  if (!joins) HandOver();  // while the held copy's GPU is still the thread's current one
  auto stream = StreamFor(device);
  if (!stream.ok()) return stream.status();
  if (joins) {
    h.n += n;
  } else {
    h = {dst, src, n, to_device, device, *stream};
  }
  if (h.n >= kMergeLimit) HandOver();
  return streams.failed;
}

Status CudaDeviceMemory::CopyIn(std::byte* dst, const std::byte* src, uint64_t n) {
  return Copy(dst, src, n, true);
}

Status CudaDeviceMemory::CopyOut(std::byte* dst, const std::byte* src, uint64_t n) {
  return Copy(dst, src, n, false);
}

Status CudaDeviceMemory::Wait() {
  HandOver();
  Status first = streams.failed;
  streams.failed = Status::Ok();
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
