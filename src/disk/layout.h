// disk/layout.h - what the store's index (disk_store_impl.h) asks of an on-disk format. The
// three formats (bucket_layout.cc, file_layout.cc, offset_layout.cc) implement it.
//
// Promise of every layout:
//   - Its unit of eviction ("unit": a bucket, a key's file, an offset record) has an id taken
//     from one increasing sequence, so ids order units by creation (fifo) across restarts.
//   - Write() puts objects on disk and answers per object where its value lies, and which units it
//     made; an object whose write failed has an error and leaves no unit behind.
//   - A location (never 0) carries the backend's tag in its top 4 bits; CheckLocation() refuses
//     with INVALID_PARAMS a location that cannot be one of this layout's.
//   - Recover() lists the intact units of the directory with their objects, and deletes what is
//     torn (see each layout for how it tells).
//   - Destroy() deletes a unit; the index calls it once, when no read uses the unit any more.
//     Once it returned OK, no later Recover() lists anything of that unit (with sync_writes, even
//     after a power loss). On error the unit may be partly there, and the index Forget()s what
//     it held.
//   - ReleaseSpace() (where ReleasesCopySpace()) gives back a forgotten copy's value space while
//     its unit stays: the other copies of the unit keep their bytes and locations.
//   - Forget() is how a copy leaves the disk while its unit stays (other live copies in it, reads
//     in flight, or a Destroy that failed): once it returned OK, no later Recover() lists that
//     copy. The index keeps the unit from Destroy() until Forget() returns.
// Ownership: a layout owns its files and directories; FileHandle closes its fd when the last
// holder drops it (a unit's cached handle and the reads in flight share it).
// Thread safety: every method from any thread at once.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "disk/disk_io.h"
#include "disk/disk_store.h"
#include "granary/status.h"

namespace granary::disk {

struct FileHandle {
  explicit FileHandle(int fd_) : fd(fd_) {}
  ~FileHandle() {
    if (fd >= 0) ::close(fd);
  }
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  int fd;
};

struct PreparedObject {
  std::string_view key;
  uint64_t gen = 0;
  std::span<const std::byte> value;
  uint64_t checksum = 0;
};

struct Placement {
  uint64_t unit_id = 0;
  uint64_t location = 0;
  uint64_t value_offset = 0;  // of the value inside the unit's file (4 KiB-aligned)
  uint64_t length = 0;        // what the object occupies (for a bucket: its share)
  uint32_t slot = 0;          // its index in the unit (a bucket's slot; 0 in a one-copy unit)
};

// A value's bytes in its unit's file, 4 KiB-aligned at both ends.
struct ValueRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A copy the index dropped (Remove, a replacing write, the loser of two recovered copies).
struct ForgottenCopy {
  std::string_view key;
  uint64_t gen = 0;
  Placement placement;
};

struct WrittenUnit {
  uint64_t unit_id = 0;
  uint64_t bytes = 0;  // everything the unit occupies on disk
};

struct LayoutWrite {
  std::vector<Result<Placement>> placements;  // one per object, in order
  std::vector<WrittenUnit> units;
};

struct RecoveredObject {
  std::string key;
  uint64_t gen = 0, size = 0, checksum = 0;
  Placement placement;
};

struct RecoveredUnit {
  uint64_t unit_id = 0;
  uint64_t bytes = 0;
  std::vector<RecoveredObject> objects;
};

struct LayoutRecovery {
  std::vector<RecoveredUnit> units;
  RecoveryReport report;  // objects is filled in by the index
};

// Location tags (top 4 bits): a handle from one backend is never taken for another's.
inline constexpr uint64_t kTagBucket = 1, kTagFile = 2, kTagOffset = 3;
inline constexpr int kTagShift = 60;
inline constexpr uint64_t kTagMask = 0xFull << kTagShift;

// Settings every layout gets from the store.
struct LayoutContext {
  std::string dir;
  DiskIo* io = nullptr;
  bool direct_io = true;
  bool sync_writes = false;
  uint64_t salt = 0;  // seeds every on-disk checksum (record_format.h)
  uint64_t bucket_max_bytes = 0;  // the option; the bucket layout applies BucketBytes to it
  bool evict_copies = false;      // the policy takes copies where the layout can
  uint32_t bucket_max_keys = 0;
  uint64_t capacity = 0;  // offset: the file's size
};

class Layout {
 public:
  virtual ~Layout() = default;
  virtual DiskBackend kind() const = 0;
  // Upper bound of what an object will occupy: charged against the budget before writing.
  virtual uint64_t Footprint(uint32_t key_len, uint64_t size) const = 0;
  virtual LayoutWrite Write(std::span<const PreparedObject> objects) = 0;
  virtual Result<LayoutRecovery> Recover() = 0;
  virtual Status CheckLocation(uint64_t location) const = 0;
  // A handle to read the unit's file. CacheHandles(): whether the index keeps it with the unit
  // between reads (file-per-key opens per read: millions of files would exhaust descriptors).
  virtual Result<std::shared_ptr<FileHandle>> OpenUnit(uint64_t unit_id) = 0;
  virtual bool CacheHandles() const = 0;
  virtual Status Destroy(uint64_t unit_id) = 0;
  // The first error; every copy is attempted.
  virtual Status Forget(std::span<const ForgottenCopy> copies) = 0;
  // Whether ReleaseSpace gives a copy's space back while its unit stays (a bucket, on a
  // filesystem that punches holes): then lru eviction can take copies instead of whole units.
  virtual bool ReleasesCopySpace() const { return false; }
  // Gives back the space of values of copies already forgotten (Forget returned OK) that no read
  // uses: the ranges read as zeros afterwards. Returns the bytes given back (0 on error, logged).
  virtual uint64_t ReleaseSpace(uint64_t unit_id, std::span<const ValueRange> ranges) { return 0; }
  // The budget the layout itself imposes (the offset file's size), or 0 for none.
  virtual uint64_t Capacity() const { return 0; }
  // At a clean close, with no read in flight and every doomed unit destroyed: `live` is all the
  // layout still holds. The offset layout records it so the next open need not scan its file.
  virtual void SaveOnClose(const std::vector<RecoveredObject>& live) {}
};

// Opens a file of the store with O_DIRECT when ctx.direct_io (flags: O_RDONLY, O_RDWR|O_CREAT...).
int OpenStoreFile(const LayoutContext& ctx, const std::string& path, int flags);
// Whether a punched 4 KiB block of a file in `dir` gives its space back (fallocate PUNCH_HOLE):
// tried on a scratch file, never a file of the store, and only where the filesystem allocates
// in units of at most 4 KiB (a larger unit would only zero the block).
bool PunchesHoles(const std::string& dir);
// fsync of a directory, so a rename in it survives power loss (sync_writes). 0 or an errno.
int SyncDirectory(const std::string& dir);
// "what path: strerror" with the error code that fits errno (ENOSPC/EDQUOT: NO_AVAILABLE_HANDLE).
Status ErrnoStatus(int err, std::string_view what, ErrorCode otherwise = ErrorCode::WRITE_FAIL);

// Each creates its part of the directory. The offset layout creates or opens its preallocated
// file: NO_AVAILABLE_HANDLE when it cannot be allocated.
Result<std::unique_ptr<Layout>> MakeBucketLayout(LayoutContext ctx);
Result<std::unique_ptr<Layout>> MakeFileLayout(LayoutContext ctx);
Result<std::unique_ptr<Layout>> MakeOffsetLayout(LayoutContext ctx);

}  // namespace granary::disk
