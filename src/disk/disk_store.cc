// disk/disk_store.cc - DiskStore::Open: checks the directory, its FORMAT file and the options,
// probes O_DIRECT, picks the I/O engine, the budget and the layout, then recovers.
#include "disk/disk_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "common/logging.h"
#include "disk/disk_store_impl.h"
#include "disk/layout.h"

namespace granary::disk {

std::string_view BackendName(DiskBackend backend) {
  switch (backend) {
    case DiskBackend::kBucket: return "bucket";
    case DiskBackend::kFilePerKey: return "file";
    case DiskBackend::kOffset: return "offset";
  }
  return "?";
}

Result<DiskBackend> ParseBackend(std::string_view text) {
  if (text == "bucket") return DiskBackend::kBucket;
  if (text == "file" || text == "file-per-key") return DiskBackend::kFilePerKey;
  if (text == "offset") return DiskBackend::kOffset;
  return Result<DiskBackend>(ErrorCode::INVALID_PARAMS, "unknown disk backend '" +
                                                            std::string(text.substr(0, 64)) +
                                                            "': expected bucket, file or offset");
}

// Why 1/1024 (not below 2 MiB) when eviction takes whole buckets: the conversation trace with a
// 2.56 GB disk at x20 its pace (docs/eviction.md) gave 0.334 hit rate with buckets of 1/512
// (4 MiB), 0.347 at 1/1024, 0.353 at 1/2048 and 1/8192; flat out, where offload falls behind,
// 0.29, 0.30-0.31, 0.27-0.28 and 0.20: each bucket costs two file creations (0.5 ms each on this
// VM's ext4), so small buckets write slowly. When eviction takes copies, the bucket's size no
// longer decides what is kept, and large ones write fastest: flat out 0.30-0.31 at 1/1024,
// 0.318-0.321 at 1/128, 0.322-0.326 with no share. A bucket keeps one object at least.
uint64_t BucketBytes(uint64_t capacity, uint64_t bucket_max_bytes, bool evict_copies) {
  if (evict_copies) return bucket_max_bytes;
  const uint64_t share = capacity / kBucketShare / kBlockSize * kBlockSize;
  return std::min(bucket_max_bytes, std::max(kMinBucketBytes, share));
}

std::string_view EvictionPolicyName(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::kFifo: return "fifo";
    case EvictionPolicy::kLru: return "lru";
    case EvictionPolicy::kLruUnits: return "lru-units";
  }
  return "lru";
}

Result<EvictionPolicy> ParseEvictionPolicy(std::string_view text) {
  if (text == "fifo") return EvictionPolicy::kFifo;
  if (text == "lru") return EvictionPolicy::kLru;
  if (text == "lru-units") return EvictionPolicy::kLruUnits;
  return Result<EvictionPolicy>(ErrorCode::INVALID_PARAMS, "unknown disk eviction policy '" +
                                                               std::string(text.substr(0, 64)) +
                                                               "': expected fifo, lru or lru-units");
}

namespace {

Status Invalid(std::string message) { return Status(ErrorCode::INVALID_PARAMS, std::move(message)); }

// Whether files in `dir` take O_DIRECT: opening one and writing a block through it. EINVAL is
// the filesystem saying no (tmpfs on older kernels, ramfs, some FUSE and network filesystems).
// Also proves the directory writable (EROFS / EACCES come out here).
Result<bool> ProbeDirectIo(const std::string& dir) {
  const std::string path = dir + "/.granary-probe";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
  bool direct = true;
  if (fd < 0 && errno == EINVAL) {
    direct = false;
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  if (fd < 0) {
    return Result<bool>(ErrorCode::INVALID_PARAMS,
                        "disk dir " + dir + " is not writable: " + std::strerror(errno));
  }
  AlignedBuffer block(kBlockSize);
  ssize_t n = ::pwrite(fd, block.data(), kBlockSize, 0);
  int err = errno;
  ::close(fd);
  ::unlink(path.c_str());
  if (n == static_cast<ssize_t>(kBlockSize)) return direct;
  if (n < 0 && err == EINVAL && direct) return false;  // took the open, refused the write
  if (n < 0 && (err == ENOSPC || err == EDQUOT)) {
    return Result<bool>(ErrorCode::NO_AVAILABLE_HANDLE, "disk dir " + dir + " is full");
  }
  return Result<bool>(ErrorCode::INVALID_PARAMS, "disk dir " + dir + " refused a test write: " +
                                                     std::strerror(n < 0 ? err : EIO));
}

// FORMAT: "granary-disk 1\nbackend <name>\nsalt <16 hex>\n". Written once (temp file + rename);
// names the backend, so a directory is never read with another backend's eyes, and holds the
// salt of every on-disk checksum.
Result<uint64_t> LoadOrCreateFormat(const std::string& dir, DiskBackend backend) {
  const std::string path = dir + "/FORMAT";
  std::ifstream in(path);
  if (in) {
    std::string magic, version, backend_word, backend_name, salt_word, salt_hex;
    in >> magic >> version >> backend_word >> backend_name >> salt_word >> salt_hex;
    uint64_t salt = 0;
    if (magic != "granary-disk" || version != "1" || backend_word != "backend" || salt_word != "salt" ||
        std::sscanf(salt_hex.c_str(), "%" SCNx64, &salt) != 1) {
      return Result<uint64_t>(ErrorCode::INVALID_PARAMS, path + " is not a granary-disk v1 FORMAT file");
    }
    if (backend_name != BackendName(backend)) {
      return Result<uint64_t>(ErrorCode::INVALID_PARAMS,
                              "disk dir " + dir + " holds a '" + backend_name.substr(0, 32) +
                                  "' store, not '" + std::string(BackendName(backend)) + "'");
    }
    return salt;
  }
  std::random_device rd;
  const uint64_t salt = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char text[96];
  std::snprintf(text, sizeof(text), "granary-disk 1\nbackend %s\nsalt %016" PRIx64 "\n",
                std::string(BackendName(backend)).c_str(), salt);
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && ::write(fd, text, std::strlen(text)) == static_cast<ssize_t>(std::strlen(text)) &&
            ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Result<uint64_t>(ErrorCode::INVALID_PARAMS, "cannot write " + path + ": " + std::strerror(errno));
  }
  return salt;
}

}  // namespace

Result<std::unique_ptr<DiskStore>> DiskStore::Open(DiskStoreOptions options) {
  using R = Result<std::unique_ptr<DiskStore>>;
  if (options.dir.empty()) return R(Invalid("disk dir is empty"));
  while (options.dir.size() > 1 && options.dir.back() == '/') options.dir.pop_back();
  struct stat st{};
  if (::stat(options.dir.c_str(), &st) != 0) {
    return R(Invalid("disk dir " + options.dir + " does not exist: " + std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) return R(Invalid("disk dir " + options.dir + " is not a directory"));
  if (options.bucket_max_keys == 0 || options.bucket_max_keys >= (1u << 24)) {
    return R(Invalid("bucket_max_keys must be 1 to 16777215"));
  }
  if (options.bucket_max_bytes < kBlockSize) return R(Invalid("bucket_max_bytes must be at least 4 KiB"));
  if (options.max_object_size > UINT32_MAX) {
    return R(Invalid("max_object_size above 4 GiB - 1 (records store a 32-bit length)"));
  }
  if (::access(options.dir.c_str(), W_OK) != 0) {
    return R(Invalid("disk dir " + options.dir + " is not writable: " + std::strerror(errno)));
  }
  auto direct = ProbeDirectIo(options.dir);
  if (!direct.ok()) return R(direct.status());
  if (options.direct_io && !*direct) {
    GLOG_WARN("disk tier: the filesystem of {} does not support O_DIRECT; using buffered I/O "
              "(reads then go through the page cache)", options.dir);
  }
  const bool direct_io = options.direct_io && *direct;

  // One store per directory: a second process (or a second Open in this one) would reuse ids,
  // offsets and files under the first. flock: released by the kernel when its holder dies.
  const std::string lock_path = options.dir + "/LOCK";
  auto dir_lock = std::make_unique<FileHandle>(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (dir_lock->fd < 0) return R(Invalid("cannot open " + lock_path + ": " + std::strerror(errno)));
  if (::flock(dir_lock->fd, LOCK_EX | LOCK_NB) != 0) {
    return R(Invalid("disk dir " + options.dir + " is in use by another store (" + lock_path + " is locked)"));
  }

  auto salt = LoadOrCreateFormat(options.dir, options.backend);
  if (!salt.ok()) return R(salt.status());

  uint64_t capacity = options.disk_size;
  if (capacity == 0) {
    struct statvfs vfs{};
    if (::statvfs(options.dir.c_str(), &vfs) != 0) {
      return R(Invalid("statvfs " + options.dir + ": " + std::strerror(errno)));
    }
    capacity = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize / 10 * 8;
  }

  auto io = MakeDiskIo(options.io, options.queue_depth);
  if (!io.ok()) return R(io.status());

  LayoutContext ctx;
  ctx.dir = options.dir;
  ctx.io = io->get();
  ctx.direct_io = direct_io;
  ctx.sync_writes = options.sync_writes;
  ctx.salt = *salt;
  ctx.evict_copies = options.eviction == EvictionPolicy::kLru;
  ctx.bucket_max_bytes = options.bucket_max_bytes;
  ctx.bucket_max_keys = options.bucket_max_keys;
  ctx.capacity = capacity;
  Result<std::unique_ptr<Layout>> layout = Status(ErrorCode::INTERNAL_ERROR, "no layout");
  switch (options.backend) {
    case DiskBackend::kBucket: layout = MakeBucketLayout(ctx); break;
    case DiskBackend::kFilePerKey: layout = MakeFileLayout(ctx); break;
    case DiskBackend::kOffset: layout = MakeOffsetLayout(ctx); break;
  }
  if (!layout.ok()) return R(layout.status());
  if ((*layout)->Capacity() != 0) capacity = (*layout)->Capacity();

  auto store = std::make_unique<DiskStoreImpl>(std::move(options), std::move(dir_lock), std::move(*io),
                                               std::move(*layout), capacity, direct_io);
  if (Status rs = store->LoadRecovery(); !rs.ok()) return R(rs);
  const RecoveryReport& rec = store->recovery();
  if (rec.units_discarded > 0) {
    GLOG_WARN("disk tier: recovery discarded {} torn file(s) ({} bytes); first: {}", rec.units_discarded,
              rec.bytes_discarded, rec.problems.empty() ? "" : rec.problems.front());
  }
  return R(std::unique_ptr<DiskStore>(std::move(store)));
}

}  // namespace granary::disk
