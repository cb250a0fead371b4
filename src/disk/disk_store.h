// disk/disk_store.h - a storage node's disk tier: objects (key, generation, bytes, checksum) kept
// in a directory, under a byte budget, readable in batches, evictable in two phases, recovered
// after a restart.
//
// Promise:
//   - Write(batch) stores each object and answers, per object, where it went (StoredObject: an
//     opaque u64 `location` plus the bytes it occupies) or why not. Objects are written once: a
//     key already stored with the same generation answers its existing location without I/O; a
//     new generation replaces the old copy, which is then forgotten on disk like a removed one
//     (should that fail, it is logged, and recovery keeps the higher generation of the two). An
//     object that does not fit the budget (or the filesystem: ENOSPC) gets NO_AVAILABLE_HANDLE
//     while the rest of the batch goes on.
//   - Read(batch) reads every request together (up to queue_depth in flight) into the caller's
//     buffers, each 4 KiB-aligned and at least ReadBufferSize(size) long. Every read checks the
//     length and the checksum: a short (truncated/deleted) record is INVALID_READ or
//     OBJECT_NOT_FOUND, a corrupted one CHECKSUM_MISMATCH; either way the object is dropped from
//     the index and the caller must not use the buffer. Wrong bytes are never reported as OK.
//     An OK result carries the copy's generation and value checksum, so the caller can tell
//     which version it got (a key's location may name another version after a restart).
//   - Remove(key, location) drops the copy from the index now and from the disk before it
//     returns: once it has returned OK, no later Open() lists or serves that copy (with
//     sync_writes even after a power loss, else after a crash of the process). Its space is
//     freed once no read is using it (for a copy whose bucket stays, under lru, by the next
//     ReclaimVictims). When that durable step fails (an I/O error), the copy is
//     still out of the index and the error says it may come back at the next open.
//   - Eviction is two-phase, because the node must tell the master before bytes disappear:
//     SelectVictims(bytes) picks by the policy (fifo: oldest file first; lru: least recently
//     written or read copy first; lru-units: least recently used file first), drops their
//     objects from the index
//     without any I/O and returns them; ReclaimVictims(max_wait) then waits (bounded) for reads
//     still using them, closes their handles and deletes them, or, for a copy evicted from a
//     bucket that keeps others, writes its tombstone and punches its value out of the file.
//   - Open() on a directory that holds a store recovers it: ListObjects() then returns every
//     intact object not removed or replaced (of two copies of a key a crash left, the higher
//     generation, then the later write); torn writes (missing or inconsistent metadata, short
//     files) are discarded and reported in recovery(), never served. Evicted units are deleted
//     by ReclaimVictims: a crash between the two phases brings them back.
// Backends (DiskBackend): bucket (default), file-per-key, offset. docs/disk.md has the on-disk
// formats and how each encodes a location.
// Ownership: the store owns its files, handles and index; callers own their buffers.
// Thread safety: every method may be called from any thread at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "disk/disk_io.h"
#include "granary/status.h"

namespace granary::disk {

enum class DiskBackend { kBucket, kFilePerKey, kOffset };
std::string_view BackendName(DiskBackend backend);             // "bucket", "file", "offset"
Result<DiskBackend> ParseBackend(std::string_view text);       // also "file-per-key"

// lru: the least recently written or read copy first; on the bucket backend, where the
// filesystem punches holes, a copy's space goes back while its bucket stays. lru-units: lru over
// whole units (a bucket goes with all its copies), as every backend did before.
enum class EvictionPolicy { kFifo, kLru, kLruUnits };
std::string_view EvictionPolicyName(EvictionPolicy policy);
Result<EvictionPolicy> ParseEvictionPolicy(std::string_view text);

inline constexpr uint32_t kMaxKeyBytes = 4096;

struct DiskStoreOptions {
  std::string dir;  // must exist and be writable
  DiskBackend backend = DiskBackend::kBucket;
  IoMode io = IoMode::kAuto;
  int queue_depth = 32;
  // The byte budget. 0: 80% of the filesystem's free space at open. The offset backend
  // preallocates a file of this size (an existing file keeps its size).
  uint64_t disk_size = 0;
  EvictionPolicy eviction = EvictionPolicy::kFifo;
  // A bucket closes at this much data (and at BucketBytes' share of the budget)...
  uint64_t bucket_max_bytes = 256ull << 20;
  uint32_t bucket_max_keys = 500;            // ...or this many objects
  uint64_t max_object_size = 1ull << 30;     // larger values are refused (INVALID_PARAMS)
  bool direct_io = true;     // O_DIRECT where the filesystem supports it (buffered otherwise)
  bool sync_writes = false;  // fdatasync before an object is reported written (power loss)
  // Test hooks: called by Read() after its index lookups, before it pins the files it will read;
  // and after it has pinned them, before any I/O.
  std::function<void()> test_hook_after_lookup;
  std::function<void()> test_hook_after_pin;
};

// The data a bucket holds at most on a disk of `capacity` bytes: bucket_max_bytes, and unless
// eviction takes copies (evict_copies), at most 1/kBucketShare of the budget (not below
// kMinBucketBytes), so that bucket-grained eviction frees the disk in small steps and keeps close
// to per-object eviction (why these: disk_store.cc).
inline constexpr uint64_t kBucketShare = 1024;
inline constexpr uint64_t kMinBucketBytes = 2ull << 20;
uint64_t BucketBytes(uint64_t capacity, uint64_t bucket_max_bytes, bool evict_copies);

struct ObjectWrite {
  std::string_view key;
  uint64_t gen = 0;
  std::span<const std::byte> value;
  std::optional<uint64_t> checksum;  // when given, the value must hash to it (CHECKSUM_MISMATCH)
};

struct StoredObject {
  std::string key;
  uint64_t gen = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;  // granary::Checksum of the value
  uint64_t location = 0;  // opaque, never 0; names this copy to Read and Remove
  uint64_t length = 0;    // bytes this copy occupies on disk (value, padding, its header)
};

struct ReadRequest {
  std::string_view key;
  uint64_t location = 0;  // 0: whatever copy the store holds; else must be that copy
  std::span<std::byte> buffer;
};

struct ReadResult {
  Status status;
  uint64_t size = 0;  // value bytes at the start of the buffer when status is OK
  uint64_t gen = 0;
  uint64_t checksum = 0;  // when OK: the stored value checksum, which the bytes were checked against
};

struct DiskUsage {
  uint64_t capacity = 0;    // the budget
  uint64_t used = 0;        // bytes of files held, including those waiting to be reclaimed
  uint64_t reclaiming = 0;  // of used: evicted or removed, waiting for reads or ReclaimVictims
  uint64_t objects = 0;
  uint64_t files = 0;       // units: buckets, files or offset records
};

struct RecoveryReport {
  uint64_t objects = 0;          // recovered into the index
  uint64_t units_discarded = 0;  // torn buckets / files / records found and deleted
  uint64_t bytes_discarded = 0;
  std::vector<std::string> problems;  // what was discarded and why (the first 100)
  // Offset backend: the record table came from the index of the last clean close, not a scan.
  bool used_shutdown_index = false;
};

class DiskStore {
 public:
  // Opens (creating or recovering) a store in options.dir. Errors: INVALID_PARAMS for a missing,
  // non-directory or read-only dir, bad options, or a dir holding another backend's store;
  // NO_AVAILABLE_HANDLE when the offset backend cannot preallocate its file.
  static Result<std::unique_ptr<DiskStore>> Open(DiskStoreOptions options);
  virtual ~DiskStore() = default;

  virtual std::vector<Result<StoredObject>> Write(std::span<const ObjectWrite> objects) = 0;
  virtual std::vector<ReadResult> Read(std::span<const ReadRequest> requests) = 0;
  // OBJECT_NOT_FOUND when absent (or when `location` names another copy); WRITE_FAIL or
  // NO_AVAILABLE_HANDLE when the copy, out of the index all the same, could not be made gone on
  // disk (it may come back at the next open).
  virtual Status Remove(std::string_view key, uint64_t location = 0) = 0;

  virtual std::optional<StoredObject> Lookup(std::string_view key) const = 0;
  virtual std::vector<StoredObject> ListObjects() const = 0;
  virtual DiskUsage Usage() const = 0;
  virtual const RecoveryReport& recovery() const = 0;

  // Phase one: frees at least `bytes` (or everything there is) by the eviction policy. No I/O.
  virtual std::vector<StoredObject> SelectVictims(uint64_t bytes) = 0;
  // Phase two: deletes what phase one (and Remove) left. OBJECT_HAS_LEASE when reads still use
  // some of it after max_wait (those stay pending for a later call).
  virtual Status ReclaimVictims(std::chrono::milliseconds max_wait) = 0;

  virtual IoMode io_mode() const = 0;
  virtual bool direct_io() const = 0;  // false: the filesystem refused O_DIRECT (or options)
  virtual DiskBackend backend() const = 0;

  // The buffer a read of a `size`-byte object needs: size rounded up to 4 KiB.
  static uint64_t ReadBufferSize(uint64_t size) { return AlignUp(size); }
};

}  // namespace granary::disk
