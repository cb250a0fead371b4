// python/buffers.h - the memory a Python caller hands to the store, and the memory it gets back.
//
// BufferHold: a Python object's bytes, exported through the buffer protocol (bytes, bytearray,
//   memoryview, NumPy arrays) and pinned until the hold is destroyed, so a transfer can run with
//   the GIL released. Contiguous buffers only; a write needs a writable one. Create and destroy
//   with the GIL held.
// OwnedBuffer: memory the store allocated for a get_buffer result; exposes the buffer protocol.
// MemoryRegistry: the address ranges a caller declared (register_buffer, the memory pool); a
//   raw-address call is refused unless its whole range lies inside one of them, so a bad address
//   is an error, not a crash. A range is host memory if this process can read all of it
//   (/proc/self/maps; CUDA is then not looked for), else GPU memory if the CUDA runtime
//   (gpu/cuda_runtime.h) says it is one GPU's; anything else is refused at registration, saying
//   why CUDA is not there when it is not. Only the calls that take GPU memory (ResolveRange) see
//   GPU ranges; Resolve refuses them.
//   Thread safety: any thread (internal mutex).
// MemPool: a private anonymous mapping carved into 64-byte-aligned blocks (first fit with
//   coalescing). Pages are committed on first touch, so a large pool costs nothing until used.
//   Thread safety: any thread (internal mutex).
// HostMemory: the process-wide allocator behind MooncakeHostMemAllocator. Each block is its own
//   page-aligned shared anonymous mapping (MAP_SHARED: inherited by forked children, committed on
//   first touch) and goes back to the system on Free. Thread safety: any thread (internal mutex).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>

#include "granary/status.h"

namespace granary::python {

class BufferHold {
 public:
  BufferHold(pybind11::handle object, bool writable);
  ~BufferHold();
  // Not movable: a Py_buffer may point into itself (CPython sets shape = &len), so it stays put.
  BufferHold(const BufferHold&) = delete;
  BufferHold& operator=(const BufferHold&) = delete;

  std::span<std::byte> bytes() const {
    return {static_cast<std::byte*>(view_.buf), static_cast<size_t>(view_.len)};
  }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

class OwnedBuffer {
 public:
  explicit OwnedBuffer(uint64_t size);  // uninitialised: the get fills every byte
  std::byte* data() const { return data_.get(); }
  uint64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  std::unique_ptr<std::byte[], Free> data_;
  uint64_t size_;
};

class MemoryRegistry {
 public:
  Status Register(uintptr_t address, uint64_t size);
  Status Unregister(uintptr_t address);
  // The range as bytes if [address, address + size) lies inside one registered host range.
  Result<std::span<std::byte>> Resolve(uintptr_t address, uint64_t size) const;
  // The same for a host or a GPU range, saying which.
  struct Range {
    std::byte* address = nullptr;
    uint64_t size = 0;
    int gpu = -1;  // which GPU holds it; -1: host memory
    bool device() const { return gpu >= 0; }
  };
  Result<Range> ResolveRange(uintptr_t address, uint64_t size) const;
  // The GPU whose registered range holds [p, p + size), or -1.
  int DeviceOf(const std::byte* p, uint64_t size) const {
    auto r = ResolveRange(reinterpret_cast<uintptr_t>(p), size);
    return r.ok() ? r->gpu : -1;
  }

 private:
  struct Entry {
    uint64_t size = 0;
    int gpu = -1;  // -1: host memory
  };
  mutable std::mutex mu_;
  std::map<uintptr_t, Entry> ranges_;  // start -> size, kind
};

class MemPool {
 public:
  static Result<std::unique_ptr<MemPool>> Create(uint64_t size);
  ~MemPool();
  MemPool(const MemPool&) = delete;
  MemPool& operator=(const MemPool&) = delete;

  // 0 when no free block is large enough.
  uintptr_t Allocate(uint64_t size);
  Status Free(uintptr_t address);
  uintptr_t base() const { return reinterpret_cast<uintptr_t>(base_); }
  uint64_t size() const { return size_; }
  uint64_t free_bytes() const;

 private:
  MemPool(std::byte* base, uint64_t size);

  std::byte* base_;
  uint64_t size_;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, coalesced
  std::map<uint64_t, uint64_t> used_;  // offset -> length
};

class HostMemory {
 public:
  static HostMemory& Instance();
  // 0 when size is 0 or the mapping fails.
  uintptr_t Allocate(uint64_t size);
  // INVALID_PARAMS for an address Allocate did not return (or already freed).
  Status Free(uintptr_t address);

 private:
  HostMemory() = default;
  std::mutex mu_;
  std::map<uintptr_t, uint64_t> blocks_;  // address -> mapped length
};

}  // namespace granary::python
