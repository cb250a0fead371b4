/* tests/tools/sim_cudart.c - a stand-in for libcudart on machines without a GPU, for tests only.
 *
 * It exports the CUDA runtime functions Granary looks up (gpu/cuda_runtime.h), with the same
 * signatures and codes, over simulated "device memory" that the CPU cannot touch: cudaMalloc
 * returns an address mapped PROT_NONE, backed by a memfd whose only readable view is private to
 * this library. Any load or store Granary made through a device pointer would fault and kill the
 * test; only cudaMemcpy(Async) moves bytes in or out, as a GPU's copy engine would. So a test
 * that passes with it shows which bytes went through the runtime, not that a GPU was used: the
 * real thing runs on a GPU machine (bench/gpu/).
 *
 * Extras for tests (not CUDA): sim_bytes_to_device/sim_bytes_to_host count copied bytes,
 * sim_bytes_to_device_from_registered those read out of cudaHostRegister'ed memory,
 * sim_bytes_to_host_into_registered those written into it,
 * sim_registered_live the registrations not undone, sim_unregistered_unmapped the unregisters
 * of memory already unmapped (a bug a driver would punish),
 * sim_pinned_live counts cudaMallocHost blocks not freed, sim_fail_copies_to_device(n) makes the
 * next n copies to the device fail with cudaErrorInvalidValue (1), sim_fail_copies_to_device_at(p, n)
 * the next n whose destination range holds p; sim_async_copies counts cudaMemcpyAsync calls.
 * Loaded through GRANARY_CUDART=<path to this library>. Thread safety: one mutex.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { kSuccess = 0, kInvalidValue = 1, kMemoryAllocation = 2 };
enum { kHostToHost = 0, kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3, kDefault = 4 };

struct Allocation {
  uintptr_t device; /* PROT_NONE view handed out */
  char* shadow;     /* read-write view of the same pages */
  size_t size;
};

#define kMaxAllocations 256
static struct Allocation allocations[kMaxAllocations];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t to_device, to_host, to_device_from_registered, to_host_into_registered;
/* Host ranges registered with cudaHostRegister; an unregister of memory no longer mapped is
 * the bug a real driver would punish: counted. */
static struct { uintptr_t p; size_t len; } registered[kMaxAllocations];
static long registered_live, unregistered_unmapped;
static long pinned_live;
static int fail_to_device;
static uintptr_t fail_at;  /* with fail_to_device: only copies whose range holds this address */

/* The shadow address of [p, p + n) if it lies inside one allocation; NULL otherwise. */
static char* shadow_of(const void* p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  for (int i = 0; i < kMaxAllocations; ++i) {
    struct Allocation* x = &allocations[i];
    if (x->size != 0 && a >= x->device && a - x->device <= x->size && n <= x->size - (a - x->device)) {
      return x->shadow + (a - x->device);
    }
  }
  return NULL;
}

static int is_device(const void* p) { return shadow_of(p, 1) != NULL; }

/* Whether [a, a + n) lies inside one cudaHostRegister'ed range. */
static int in_registered(uintptr_t a, size_t n);

int cudaGetDeviceCount(int* count) {
  *count = 1;
  return kSuccess;
}

int cudaSetDevice(int device) {
  return device == 0 ? kSuccess : 101; /* cudaErrorInvalidDevice: the simulation has one GPU */
}

int cudaRuntimeGetVersion(int* version) {
  *version = 13000;
  return kSuccess;
}

const char* cudaGetErrorString(int code) {
  switch (code) {
    case kSuccess: return "no error (simulated runtime)";
    case kInvalidValue: return "invalid argument (simulated runtime)";
    case kMemoryAllocation: return "out of memory (simulated runtime)";
    default: return "unknown error (simulated runtime)";
  }
}

int cudaGetLastError(void) { return kSuccess; }

/* cudaPointerAttributes: type, device, devicePointer, hostPointer, reserved. */
int cudaPointerGetAttributes(void* attributes, const void* p) {
  int* fields = (int*)attributes;
  pthread_mutex_lock(&mu);
  int device = is_device(p);
  pthread_mutex_unlock(&mu);
  memset(attributes, 0, 88);
  fields[0] = device ? 2 : 0; /* cudaMemoryTypeDevice : cudaMemoryTypeUnregistered */
  fields[1] = device ? 0 : -2;
  return kSuccess;
}

int cudaMalloc(void** out, size_t size) {
  if (size == 0) return kInvalidValue;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t len = (size + page - 1) / page * page;
  int fd = memfd_create("sim-cuda-device", MFD_CLOEXEC);
  if (fd < 0) return kMemoryAllocation;
  if (ftruncate(fd, (off_t)len) != 0) {
    close(fd);
    return kMemoryAllocation;
  }
  void* device = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
  void* shadow = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (device == MAP_FAILED || shadow == MAP_FAILED) return kMemoryAllocation;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < kMaxAllocations; ++i) {
    if (allocations[i].size == 0) {
      allocations[i] = (struct Allocation){(uintptr_t)device, shadow, size};
      pthread_mutex_unlock(&mu);
      *out = device;
      return kSuccess;
    }
  }
  pthread_mutex_unlock(&mu);
  munmap(device, len);
  munmap(shadow, len);
  return kMemoryAllocation;
}

int cudaFree(void* p) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < kMaxAllocations; ++i) {
    struct Allocation* x = &allocations[i];
    if (x->size != 0 && x->device == (uintptr_t)p) {
      size_t page = (size_t)sysconf(_SC_PAGESIZE);
      size_t len = (x->size + page - 1) / page * page;
      munmap((void*)x->device, len);
      munmap(x->shadow, len);
      x->size = 0;
      pthread_mutex_unlock(&mu);
      return kSuccess;
    }
  }
  pthread_mutex_unlock(&mu);
  return kInvalidValue;
}

int cudaMemcpy(void* dst, const void* src, size_t n, int kind) {
  pthread_mutex_lock(&mu);
  char* d = is_device(dst) ? shadow_of(dst, n) : (char*)dst;
  const char* s = is_device(src) ? shadow_of(src, n) : (const char*)src;
  int dst_device = is_device(dst), src_device = is_device(src);
  int ok = d != NULL && s != NULL;
  if (kind == kHostToDevice) ok = ok && dst_device && !src_device;
  if (kind == kDeviceToHost) ok = ok && src_device && !dst_device;
  if (ok && dst_device && fail_to_device > 0 &&
      (fail_at == 0 || (fail_at >= (uintptr_t)dst && fail_at - (uintptr_t)dst < n))) {
    --fail_to_device;
    ok = 0;
  }
  if (ok) {
    memcpy(d, s, n);
    if (dst_device) to_device += n;
    if (src_device) to_host += n;
    if (src_device && !dst_device && in_registered((uintptr_t)dst, n)) to_host_into_registered += n;
    if (dst_device && !src_device && in_registered((uintptr_t)src, n)) to_device_from_registered += n;
  }
  pthread_mutex_unlock(&mu);
  return ok ? kSuccess : kInvalidValue;
}

static long async_copies;

int cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, void* stream) {
  (void)stream;
  __atomic_add_fetch(&async_copies, 1, __ATOMIC_RELAXED);
  return cudaMemcpy(dst, src, n, kind);
}

int cudaStreamCreate(void** stream) {
  *stream = malloc(1);
  return *stream != NULL ? kSuccess : kMemoryAllocation;
}

int cudaStreamDestroy(void* stream) {
  free(stream);
  return kSuccess;
}

int cudaStreamSynchronize(void* stream) {
  (void)stream;
  return kSuccess;
}

static struct { void* p; size_t len; } pinned[kMaxAllocations];

int cudaMallocHost(void** out, size_t size) {
  if (size == 0) return kInvalidValue;
  void* p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return kMemoryAllocation;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < kMaxAllocations; ++i) {
    if (pinned[i].p == NULL) {
      pinned[i].p = p;
      pinned[i].len = size;
      ++pinned_live;
      pthread_mutex_unlock(&mu);
      *out = p;
      return kSuccess;
    }
  }
  pthread_mutex_unlock(&mu);
  munmap(p, size);
  return kMemoryAllocation;
}

int cudaFreeHost(void* p) {
  if (p == NULL) return kSuccess;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < kMaxAllocations; ++i) {
    if (pinned[i].p == p) {
      munmap(p, pinned[i].len);
      pinned[i].p = NULL;
      --pinned_live;
      pthread_mutex_unlock(&mu);
      return kSuccess;
    }
  }
  pthread_mutex_unlock(&mu);
  return kInvalidValue;
}

static int in_registered(uintptr_t a, size_t n) {
  for (int i = 0; i < kMaxAllocations; ++i) {
    if (registered[i].len != 0 && a >= registered[i].p && a - registered[i].p <= registered[i].len &&
        n <= registered[i].len - (a - registered[i].p)) {
      return 1;
    }
  }
  return 0;
}

int cudaHostRegister(void* p, size_t n, unsigned flags) {
  (void)flags;
  if (p == NULL || n == 0) return kInvalidValue;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < kMaxAllocations; ++i) {
    if (registered[i].len == 0) {
      registered[i].p = (uintptr_t)p;
      registered[i].len = n;
      ++registered_live;
      pthread_mutex_unlock(&mu);
      return kSuccess;
    }
  }
  pthread_mutex_unlock(&mu);
  return kMemoryAllocation;
}

int cudaHostUnregister(void* p) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < kMaxAllocations; ++i) {
    if (registered[i].len != 0 && registered[i].p == (uintptr_t)p) {
      size_t page = (size_t)sysconf(_SC_PAGESIZE);
      unsigned char vec[1];
      /* mincore fails with ENOMEM on an address that is not mapped any more */
      if (mincore((void*)(registered[i].p & ~(uintptr_t)(page - 1)), 1, vec) != 0) {
        ++unregistered_unmapped;
      }
      registered[i].len = 0;
      --registered_live;
      pthread_mutex_unlock(&mu);
      return kSuccess;
    }
  }
  pthread_mutex_unlock(&mu);
  return kInvalidValue;
}

uint64_t sim_bytes_to_device_from_registered(void) { return to_device_from_registered; }
uint64_t sim_bytes_to_host_into_registered(void) { return to_host_into_registered; }
long sim_registered_live(void) { return registered_live; }
long sim_unregistered_unmapped(void) { return unregistered_unmapped; }
uint64_t sim_bytes_to_device(void) { return to_device; }
uint64_t sim_bytes_to_host(void) { return to_host; }
long sim_pinned_live(void) { return pinned_live; }
long sim_async_copies(void) { return __atomic_load_n(&async_copies, __ATOMIC_RELAXED); }
void sim_fail_copies_to_device(int n) {
  pthread_mutex_lock(&mu);
  fail_to_device = n;
  fail_at = 0;
  pthread_mutex_unlock(&mu);
}
void sim_fail_copies_to_device_at(const void* address, int n) {
  pthread_mutex_lock(&mu);
  fail_to_device = n;
  fail_at = (uintptr_t)address;
  pthread_mutex_unlock(&mu);
}
