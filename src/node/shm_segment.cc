#include "node/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <string_view>
#include <vector>
#include <utility>

#include "common/logging.h"
#include "common/populate.h"
#include "common/units.h"
#include "transfer/shm_mapping.h"

namespace granary::node {

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

Status SysError(const std::string& what, const std::string& name, int err) {
  return Status(ErrorCode::INTERNAL_ERROR,
                what + " of shared-memory segment '" + name + "' failed: " + std::strerror(err));
}

// The message an operator sees when the segment does not fit: how much is needed, how much is
// free, and the three ways out, with values ready to paste.
Status NoRoom(const std::string& name, uint64_t size, const std::string& dir, ShmSpace space) {
  uint64_t used = space.total_bytes > space.free_bytes ? space.total_bytes - space.free_bytes : 0;
  // The file is the segment plus its header page.
  uint64_t needed_total = used + size + transfer::kShmHeaderBytes;
  const uint64_t fits = space.free_bytes > transfer::kShmHeaderBytes
                            ? space.free_bytes - transfer::kShmHeaderBytes
                            : 0;
  uint64_t needed_mib = (needed_total + kMiB - 1) / kMiB;
  return Status(
      ErrorCode::INVALID_PARAMS,
      "cannot create shared-memory segment '" + name + "' of " + FormatSize(size) + " (" +
          std::to_string(size) + " bytes): " + dir + " has only " + FormatSize(space.free_bytes) +
          " free of " + FormatSize(space.total_bytes) + ", and " + dir + " must be at least " +
          FormatSize(needed_mib * kMiB) + ". Fixes: run the container with `docker run " +
          "--shm-size=" + std::to_string(needed_mib) + "m`; on Kubernetes mount a volume " +
          "`emptyDir: {medium: Memory, sizeLimit: " + std::to_string(needed_mib) + "Mi}` at " +
          dir + "; or start the node with a smaller --segment-size (at most " +
          FormatSize(fits) + " fits now).");
}

std::string ReadFileText(const char* path) {
  std::string text;
  if (FILE* f = std::fopen(path, "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

// Reserves every page of the segment in the tmpfs now, so running out shows up as ENOSPC here
// rather than as SIGBUS on first touch later.
int ReservePages(int fd, uint64_t size) {
  if (fallocate(fd, 0, 0, static_cast<off_t>(size)) == 0) return 0;
  if (errno != EOPNOTSUPP && errno != ENOSYS) return errno;
  // No fallocate: write one byte per page through the descriptor (pwrite fails with ENOSPC where
  // a store through the mapping would raise SIGBUS).
  const long page = sysconf(_SC_PAGESIZE);
  const char zero = 0;
  for (uint64_t off = 0; off < size; off += static_cast<uint64_t>(page)) {
    if (pwrite(fd, &zero, 1, static_cast<off_t>(off)) != 1) return errno;
  }
  return 0;
}

}  // namespace

std::string TmpfsHugeOption(std::string_view mounts, std::string_view dir) {
  // Lines: "source mountpoint fstype options dump pass"; the last mount at `dir` wins.
  std::string result = "never";
  size_t start = 0;
  while (start < mounts.size()) {
    size_t end = mounts.find('\n', start);
    if (end == std::string_view::npos) end = mounts.size();
    std::string_view line = mounts.substr(start, end - start);
    start = end + 1;
    std::vector<std::string_view> fields;
    for (size_t i = 0; i < line.size() && fields.size() < 4;) {
      size_t sp = line.find(' ', i);
      if (sp == std::string_view::npos) sp = line.size();
      fields.push_back(line.substr(i, sp - i));
      i = sp + 1;
    }
    if (fields.size() < 4 || fields[1] != dir || fields[2] != "tmpfs") continue;
    result = "never";
    for (size_t i = 0; i <= fields[3].size();) {
      size_t comma = fields[3].find(',', i);
      if (comma == std::string_view::npos) comma = fields[3].size();
      std::string_view option = fields[3].substr(i, comma - i);
      if (option.rfind("huge=", 0) == 0) result = std::string(option.substr(5));
      i = comma + 1;
    }
  }
  return result;
}

namespace {

// A segment already at `path`: stale (its node died without unlinking) if nobody holds its
// flock, in which case it is unlinked; live otherwise. Another node's reclaim scan holds the lock
// of a stale file for an instant, so a busy lock is looked at again for a moment before the name
// is declared taken.
Status RemoveStale(const std::string& name, const std::string& path) {
  constexpr int kLooks = 20;  // 20 x 10 ms
  for (int look = 0; look < kLooks; ++look) {
    int fd = shm_open(path.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
      if (errno == ENOENT) return Status::Ok();
      return SysError("opening the existing instance", name, errno);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int err = errno;
      close(fd);
      if (err != EWOULDBLOCK) return SysError("locking the existing instance", name, err);
      usleep(10'000);
      continue;
    }
    struct stat st {};
    fstat(fd, &st);
    GLOG_WARN(
        "removing stale shared-memory segment '{}' ({} bytes) left by a node that did not "
        "shut down cleanly; recreating it",
        name, static_cast<uint64_t>(st.st_size));
    int rc = shm_unlink(path.c_str());
    int err = errno;
    close(fd);
    if (rc != 0 && err != ENOENT) return SysError("unlinking the stale instance", name, err);
    return Status::Ok();
  }
  return Status(ErrorCode::SEGMENT_ALREADY_EXISTS,
                "shared-memory segment '" + name +
                    "' is held by a running node on this host; give each node its own "
                    "segment name");
}

}  // namespace

size_t ShmSegment::ReclaimOrphans(const std::string& shm_dir, std::chrono::seconds min_age) {
  DIR* dir = opendir(shm_dir.c_str());
  if (dir == nullptr) return 0;
  std::vector<std::string> names;
  while (dirent* e = readdir(dir)) {
    std::string_view n(e->d_name);
    if (n.starts_with(kNamePrefix)) names.emplace_back(n);
  }
  closedir(dir);
  size_t removed = 0;
  const auto now = std::chrono::system_clock::now();
  for (const std::string& name : names) {
    const std::string path = shm_dir + "/" + name;
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;  // gone meanwhile, or not ours to open
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
      close(fd);
      continue;
    }
    // Young files are left alone: a starting node creates its file, then locks it.
    const auto changed = std::chrono::system_clock::time_point(
        std::chrono::seconds(st.st_ctim.tv_sec) +
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::nanoseconds(st.st_ctim.tv_nsec)));
    if (now - changed < min_age || flock(fd, LOCK_EX | LOCK_NB) != 0) {
      close(fd);  // live (locked by its node, even a stopped one), or too young to judge
      continue;
    }
    // Ours now; unlink only if the name still refers to this very file.
    struct stat current {};
    if (stat(path.c_str(), &current) == 0 && current.st_dev == st.st_dev &&
        current.st_ino == st.st_ino && unlink(path.c_str()) == 0) {
      GLOG_WARN("reclaimed shared-memory segment '{}' ({}) of a node that is gone", name,
                FormatSize(static_cast<uint64_t>(st.st_size)));
      ++removed;
    }
    close(fd);
  }
  return removed;
}

Result<ShmSpace> ShmSegment::StatSpace(const std::string& dir) {
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) != 0) {
    return Status(ErrorCode::INTERNAL_ERROR, "statvfs(" + dir +
                                                 ") failed: " + std::strerror(errno) +
                                                 " (is the shared-memory filesystem mounted?)");
  }
  ShmSpace space;
  space.free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  space.total_bytes = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  return space;
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name, uint64_t size,
                                                       bool prefault) {
  Options options;
  options.prefault = prefault;
  return Create(name, size, options);
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name, uint64_t size,
                                                       const Options& options) {
  if (Status s = transfer::ValidateShmName(name); !s.ok()) return s;
  if (size == 0) {
    return Status(ErrorCode::INVALID_PARAMS, "segment '" + name + "' must not be of size 0");
  }
  if (size > static_cast<uint64_t>(INT64_MAX) - transfer::kShmHeaderBytes) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "segment '" + name + "' size " + std::to_string(size) + " is too large");
  }
  const uint64_t file_size = transfer::kShmHeaderBytes + size;
  const std::string path = "/" + name;
  // Stale first: its pages count as used until it is unlinked.
  if (Status s = RemoveStale(name, path); !s.ok()) return s;

  auto space =
      options.space_probe ? options.space_probe(options.shm_dir) : StatSpace(options.shm_dir);
  if (!space.ok()) return space.status();
  if (space->free_bytes < file_size) return NoRoom(name, size, options.shm_dir, *space);

  int fd = shm_open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) {
      return Status(ErrorCode::SEGMENT_ALREADY_EXISTS, "shared-memory segment '" + name +
                                                           "' was created by another process "
                                                           "while this node was starting");
    }
    return SysError("shm_open", name, errno);
  }
  // Held for the segment's lifetime: a node starting later with the same name sees it is live.
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);  // another starter took it for stale in the window above; it will recreate it
    return Status(ErrorCode::SEGMENT_ALREADY_EXISTS,
                  "shared-memory segment '" + name + "' is contended by another starting node");
  }
  auto fail = [&](Status status) {
    shm_unlink(path.c_str());
    close(fd);
    return status;
  };
  if (fchmod(fd, 0600) != 0) return fail(SysError("fchmod", name, errno));
  if (ftruncate(fd, static_cast<off_t>(file_size)) != 0) {
    return fail(SysError("ftruncate", name, errno));
  }
  const std::string huge =
      options.huge_option.empty()
          ? TmpfsHugeOption(ReadFileText("/proc/self/mounts"), options.shm_dir)
          : options.huge_option;
  const bool huge_advise = huge == "advise";
  auto reserve_failed = [&](int err) {
    if (err != ENOSPC) return fail(SysError("reserving the pages", name, err));
    ShmSpace now = space.value();
    if (auto again = options.space_probe ? options.space_probe(options.shm_dir)
                                         : StatSpace(options.shm_dir);
        again.ok()) {
      now = *again;
    }
    return fail(NoRoom(name, size, options.shm_dir, now));
  };
  // Under huge=advise fallocate reserves small pages; the populate below reserves huge ones.
  if (options.prefault && !huge_advise) {
    if (int err = ReservePages(fd, file_size); err != 0) return reserve_failed(err);
  }
  // No MAP_POPULATE: building this mapping's page tables took 9.5 s for 4 GiB on the 2-core VM
  // (fallocate 1.6 s), and the node only touches its segment inside send/recv, where a minor
  // fault is cheap next to the copy. The reservation above is what prevents SIGBUS.
  int flags = MAP_SHARED;
  void* p = mmap(nullptr, file_size, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED) return fail(SysError("mmap", name, errno));
  (void)madvise(p, file_size, MADV_HUGEPAGE);  // no effect where the mount allows none
  if (options.prefault && huge_advise) {
    int err = options.populate ? options.populate(p, file_size)
                               : (madvise(p, file_size, MADV_POPULATE_WRITE) == 0 ? 0 : errno);
    // EINVAL: a kernel without MADV_POPULATE_WRITE (before 5.14); small pages beat a SIGBUS.
    if (err == EINVAL) err = ReservePages(fd, file_size);
    if (err == ENOMEM || err == EFAULT) err = ENOSPC;  // populate's words for a full tmpfs
    if (err != 0) {
      munmap(p, file_size);
      return reserve_failed(err);
    }
  }
  // The header, before any client can learn the name (the node mounts only after Create).
  auto* header = new (p) transfer::ShmSegmentHeader{};
  header->magic = transfer::kShmMagic;
  header->layout_version = transfer::kShmLayoutVersion;
  header->header_bytes = static_cast<uint32_t>(transfer::kShmHeaderBytes);
  header->data_bytes = size;
  header->owner_pid = static_cast<uint64_t>(getpid());
  header->token.store(0, std::memory_order_release);
  GLOG_INFO("created shared-memory segment '{}' of {}{}", name, FormatSize(size),
            options.prefault ? " (pages reserved)" : "");
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(name, fd, static_cast<uint8_t*>(p), size, options));
}

ShmSegment::ShmSegment(std::string name, int fd, uint8_t* base, uint64_t size, Options options)
    : name_(std::move(name)),
      options_(std::move(options)),
      fd_(fd),
      base_(base),
      data_(base + transfer::kShmHeaderBytes),
      size_(size) {}

uint64_t ShmSegment::token() const {
  return reinterpret_cast<const transfer::ShmSegmentHeader*>(base_)->token.load(
      std::memory_order_acquire);
}

void ShmSegment::PublishToken(uint64_t token) {
  reinterpret_cast<transfer::ShmSegmentHeader*>(base_)->token.store(token,
                                                                     std::memory_order_release);
}

void ShmSegment::Retire() {
  // The token first: a client that sees the punched zeros sees the retired token after its copy.
  PublishToken(transfer::kShmRetiredToken);
  retired_ = true;
  // Freed now, not when the last client unmaps: a page fault on the hole later gives a new zero
  // page (no SIGBUS: the file keeps its size).
  if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(transfer::kShmHeaderBytes), static_cast<off_t>(size_)) != 0) {
    GLOG_WARN("cannot release the pages of retired segment '{}': {} (freed when unmapped)", name_,
              std::strerror(errno));
  }
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::Renew() {
  Retire();  // first: its pages are free before the successor reserves its own
  // A temporary name under the common prefix: a crash before the rename leaves an orphan that
  // ReclaimOrphans removes; short, so any segment name fits.
  static std::atomic<uint64_t> renewals{0};
  const std::string temp = std::string(kNamePrefix) + "renew-" + std::to_string(getpid()) + "-" +
                           std::to_string(renewals.fetch_add(1) + 1);
  auto next = Create(temp, size_, options_);
  if (!next.ok()) return next.status();
  // rename(2) replaces the name atomically: it always refers to a file this node holds locked,
  // so a node started under the same name meanwhile still finds it taken.
  const std::string from = std::string(kShmDir) + "/" + temp;
  const std::string to = std::string(kShmDir) + "/" + name_;
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return SysError("renaming the renewed instance", name_, errno);  // *next unlinks `temp`
  }
  (*next)->name_ = name_;
  GLOG_INFO("shared-memory segment '{}' renewed: a new file for the new mount", name_);
  return next;
}

ShmSegment::~ShmSegment() {
  munmap(base_, transfer::kShmHeaderBytes + size_);
  // Unlink only if the name still refers to this segment; never someone else's newer one.
  const std::string path = "/" + name_;
  struct stat mine {};
  struct stat current {};
  int cur = shm_open(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (cur >= 0) {
    if (fstat(fd_, &mine) == 0 && fstat(cur, &current) == 0 && mine.st_dev == current.st_dev &&
        mine.st_ino == current.st_ino) {
      shm_unlink(path.c_str());
    }
    close(cur);
  }
  close(fd_);
}

}  // namespace granary::node
