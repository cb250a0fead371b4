#include "python/buffers.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>

#include <new>
#include <string>

#include "gpu/cuda_runtime.h"

namespace py = pybind11;

namespace granary::python {

BufferHold::BufferHold(py::handle object, bool writable) {
  const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(object.ptr(), &view_, flags) != 0) throw py::error_already_set();
  held_ = true;
}

BufferHold::~BufferHold() {
  if (held_) PyBuffer_Release(&view_);
}

OwnedBuffer::OwnedBuffer(uint64_t size)
    : data_(static_cast<std::byte*>(::operator new[](size == 0 ? 1 : size, std::align_val_t(64)))),
      size_(size) {}

namespace {

// Whether every byte of [address, address + size) lies in mappings this process may read.
bool HostReadable(uintptr_t address, uint64_t size) {
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return true;  // cannot tell: as before this check existed
  uintptr_t covered = address;  // everything below is known readable
  const uintptr_t end = address + size;
  char line[512];
  while (covered < end && std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (lo <= covered && covered < hi && perms[0] == 'r') covered = hi;
  }
  std::fclose(maps);
  return covered >= end;
}

}  // namespace

Status MemoryRegistry::Register(uintptr_t address, uint64_t size) {
  if (address == 0 || size == 0 || address + size < address) {
    return Status(ErrorCode::INVALID_PARAMS, "cannot register " + std::to_string(size) +
                                                 " bytes at address " + std::to_string(address));
  }
  int gpu = -1;
  // Memory this process can read is host memory, and CUDA is not even looked for: a process
  // that only registers host memory never initialises CUDA (which would break CUDA in children
  // it forks). GPU memory is never readable from the CPU (PROT_NONE in the host's view).
  if (!HostReadable(address, size)) {
    const auto& cuda = gpu::CudaRuntime::Instance();
    auto refuse = [&](const std::string& why) {
      return Status(ErrorCode::INVALID_PARAMS,
                    std::to_string(size) + " bytes at address " + std::to_string(address) + why);
    };
    if (!cuda.available()) {
      return refuse(" are not memory of this process; if they are GPU memory: " + cuda.why_not());
    }
    auto first = cuda.Classify(reinterpret_cast<const void*>(address));
    auto last = cuda.Classify(reinterpret_cast<const void*>(address + size - 1));
    if (!first.ok() || first->memory != gpu::CudaRuntime::Memory::kDevice) {
      return refuse(" are neither memory of this process nor GPU memory");
    }
    if (!last.ok() || last->memory != gpu::CudaRuntime::Memory::kDevice ||
        last->device != first->device) {
      return refuse(" start in GPU memory but do not end in the same GPU's memory");
    }
    gpu = first->device;
  }
  std::lock_guard lock(mu_);
  Entry& e = ranges_[address];
  e.size = std::max(e.size, size);
  e.gpu = gpu;
  return Status::Ok();
}

Status MemoryRegistry::Unregister(uintptr_t address) {
  std::lock_guard lock(mu_);
  if (ranges_.erase(address) == 0) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "no buffer registered at address " + std::to_string(address));
  }
  return Status::Ok();
}

Result<MemoryRegistry::Range> MemoryRegistry::ResolveRange(uintptr_t address, uint64_t size) const {
  auto refuse = [&] {
    return Status(ErrorCode::INVALID_PARAMS,
                  std::to_string(size) + " bytes at address " + std::to_string(address) +
                      " are not inside a registered buffer (register_buffer)");
  };
  if (address + size < address) return refuse();
  std::lock_guard lock(mu_);
  // Registered ranges may nest or overlap: any one that holds the whole range will do.
  for (auto it = ranges_.upper_bound(address); it != ranges_.begin();) {
    --it;
    const uint64_t len = it->second.size;
    if (address - it->first <= len && size <= len - (address - it->first)) {
      return Range{reinterpret_cast<std::byte*>(address), size, it->second.gpu};
    }
  }
  return refuse();
}

Result<std::span<std::byte>> MemoryRegistry::Resolve(uintptr_t address, uint64_t size) const {
  auto range = ResolveRange(address, size);
  if (!range.ok()) return range.status();
  if (range->device()) {
    return Status(ErrorCode::INVALID_PARAMS,
                  std::to_string(size) + " bytes at address " + std::to_string(address) +
                      " are GPU memory, which this call does not take");
  }
  return std::span<std::byte>(range->address, range->size);
}

Result<std::unique_ptr<MemPool>> MemPool::Create(uint64_t size) {
  if (size == 0) return Status(ErrorCode::INVALID_PARAMS, "memory pool size is 0");
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "cannot map a memory pool of " + std::to_string(size) + " bytes");
  }
  return std::unique_ptr<MemPool>(new MemPool(static_cast<std::byte*>(p), size));
}

MemPool::MemPool(std::byte* base, uint64_t size) : base_(base), size_(size) { free_[0] = size; }

MemPool::~MemPool() { munmap(base_, size_); }

uintptr_t MemPool::Allocate(uint64_t size) {
  constexpr uint64_t kAlign = 64;
  if (size == 0 || size > size_) return 0;
  const uint64_t need = (size + kAlign - 1) / kAlign * kAlign;
  std::lock_guard lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_[offset + need] = rest;
    used_[offset] = need;
    return base() + offset;
  }
  return 0;
}

Status MemPool::Free(uintptr_t address) {
  std::lock_guard lock(mu_);
  auto it = address >= base() ? used_.find(address - base()) : used_.end();
  if (it == used_.end()) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "address " + std::to_string(address) + " was not allocated from this pool");
  }
  uint64_t offset = it->first, length = it->second;
  used_.erase(it);
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + length) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += length;
      return Status::Ok();
    }
  }
  free_[offset] = length;
  return Status::Ok();
}

uint64_t MemPool::free_bytes() const {
  std::lock_guard lock(mu_);
  uint64_t total = 0;
  for (const auto& [offset, length] : free_) total += length;
  return total;
}

HostMemory& HostMemory::Instance() {
  static HostMemory* instance = new HostMemory();  // never destroyed: blocks may outlive exit
  return *instance;
}

uintptr_t HostMemory::Allocate(uint64_t size) {
  if (size == 0) return 0;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 0;
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(mu_);
  blocks_[address] = size;
  return address;
}

Status HostMemory::Free(uintptr_t address) {
  uint64_t length = 0;
  {
    std::lock_guard lock(mu_);
    auto it = blocks_.find(address);
    if (it == blocks_.end()) {
      return Status(ErrorCode::INVALID_PARAMS, "address " + std::to_string(address) +
                                                   " was not allocated by "
                                                   "MooncakeHostMemAllocator (or is freed)");
    }
    length = it->second;
    blocks_.erase(it);
  }
  munmap(reinterpret_cast<void*>(address), length);
  return Status::Ok();
}

}  // namespace granary::python
