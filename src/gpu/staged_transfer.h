// gpu/staged_transfer.h - batch puts from and gets into GPU memory, through pinned host buffers.
//
// Promise: a put stores exactly the bytes the GPU ranges held when the call began; a get
// reports an object read only once its bytes are in the GPU ranges (a failed copy to the GPU
// fails that key: never partial bytes reported as read). Host ranges in the same call go
// straight through. Two pinned buffers (64 MiB each by default, made on first use) alternate:
// a put copies the next group of objects off the GPU while the store writes the current one; a
// get copies a group onto the GPU while the store reads the next. A group is as many whole
// objects as fit in a buffer; an object larger than a buffer gets a pinned buffer of its own
// for that call.
// What it does not do yet: copy between a same-host segment and the GPU in one DMA
// (cudaHostRegister of the mapped segment); every byte crosses a pinned buffer.
// Ownership: owns its pinned buffers and streams. Thread safety: any thread; one transfer at a
// time (internal mutex), so concurrent callers queue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "gpu/cuda_runtime.h"
#include "granary/client.h"

namespace granary::gpu {

// One range of an object: `device` ranges are GPU memory, the others host memory.
struct Range {
  std::byte* address = nullptr;
  uint64_t size = 0;
  bool device = false;
};

class StagedTransfer {
 public:
  static constexpr size_t kDefaultBufferBytes = 64ull << 20;

  explicit StagedTransfer(const CudaRuntime& cuda, size_t buffer_bytes = kDefaultBufferBytes);
  ~StagedTransfer();
  StagedTransfer(const StagedTransfer&) = delete;
  StagedTransfer& operator=(const StagedTransfer&) = delete;

  // `put` stores objects `index` (positions in `objects`) from host spans, one status each.
  using PutFn = std::function<std::vector<Status>(const std::vector<size_t>& index,
                                                  const std::vector<std::vector<ByteSpan>>&)>;
  std::vector<Status> Put(const std::vector<std::vector<Range>>& objects, const PutFn& put);

  // `get` reads objects `index` into host spans: bytes read, or why not, one result each.
  using GetFn = std::function<std::vector<Result<uint64_t>>(
      const std::vector<size_t>& index, const std::vector<std::vector<MutableByteSpan>>&)>;
  std::vector<Result<uint64_t>> Get(const std::vector<std::vector<Range>>& objects,
                                    const GetFn& get);

  uint64_t pinned_bytes() const;  // pinned host memory held now (the two buffers)

 private:
  struct Buffer {
    std::byte* data = nullptr;
    size_t size = 0;
    CudaRuntime::Stream stream = nullptr;
  };
  Status Prepare();  // both buffers and streams, once
  // Consecutive objects whose GPU bytes fit one buffer (always at least one object).
  std::vector<std::vector<size_t>> Groups(const std::vector<std::vector<Range>>& objects) const;

  const CudaRuntime& cuda_;
  const size_t buffer_bytes_;
  mutable std::mutex mu_;
  Buffer buffers_[2];
  bool prepared_ = false;
};

}  // namespace granary::gpu
