#include "transfer/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/units.h"

namespace granary::transfer {

Result<std::unique_ptr<ShmMapping>> ShmMapping::Attach(const std::string& name,
                                                       uint64_t expected_size) {
  if (Status s = ValidateShmName(name); !s.ok()) return s;
  if (expected_size == 0) {
    return Status(ErrorCode::INVALID_PARAMS, "cannot attach segment '" + name + "' of size 0");
  }
  const std::string path = "/" + name;
  int fd = shm_open(path.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) {
      return Status(ErrorCode::SEGMENT_NOT_FOUND, "no shared-memory segment '" + name +
                                                      "' on this host (/dev/shm" + path +
                                                      "): the node is not running here or "
                                                      "has restarted");
    }
    return Status(ErrorCode::TRANSFER_FAIL, "cannot open shared-memory segment '" + name +
                                                "': " + std::strerror(err) +
                                                (err == EACCES ? " (segments are mode 0600: the "
                                                                 "client must run as the node's "
                                                                 "user)"
                                                               : ""));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return Status(ErrorCode::TRANSFER_FAIL,
                  "cannot stat shared-memory segment '" + name + "': " + std::strerror(err));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  const uint64_t data_size = file_size >= kShmHeaderBytes ? file_size - kShmHeaderBytes : 0;
  if (file_size < kShmHeaderBytes || data_size != expected_size) {
    close(fd);
    return Status(ErrorCode::INVALID_PARAMS,
                  "shared-memory segment '" + name + "' holds " + std::to_string(data_size) +
                      " data bytes (" + FormatSize(data_size) + ") but " +
                      std::to_string(expected_size) + " bytes (" + FormatSize(expected_size) +
                      ") were expected: stale metadata or another node's segment");
  }
  const uint64_t map_size = kShmHeaderBytes + expected_size;
  void* p = mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);  // the mapping keeps the object alive; the descriptor is not needed any more
  if (p == MAP_FAILED) {
    return Status(ErrorCode::TRANSFER_FAIL,
                  "cannot map shared-memory segment '" + name + "': " + std::strerror(err));
  }
  // Where the node's tmpfs gives huge pages, this mapping takes them too (node/shm_segment.h).
  (void)madvise(p, map_size, MADV_HUGEPAGE);
  const auto* header = static_cast<const ShmSegmentHeader*>(p);
  if (header->magic != kShmMagic || header->layout_version != kShmLayoutVersion ||
      header->header_bytes != kShmHeaderBytes || header->data_bytes != expected_size) {
    munmap(p, map_size);
    return Status(ErrorCode::INVALID_PARAMS,
                  "shared-memory segment '" + name +
                      "' has no Granary segment header of layout version " +
                      std::to_string(kShmLayoutVersion) +
                      " (another program's file, or a node of another version)");
  }
  if (header->token.load(std::memory_order_acquire) == kShmRetiredToken) {
    munmap(p, map_size);
    return Status(ErrorCode::SEGMENT_NOT_FOUND, "shared-memory segment '" + name +
                                                    "' is being remounted (its memory retired)");
  }
  return std::unique_ptr<ShmMapping>(new ShmMapping(name, p, expected_size, st.st_dev, st.st_ino));
}

ShmMapping::~ShmMapping() {
  hold_.reset();  // e.g. a device's registration of this memory ends while it is still mapped
  munmap(base_, kShmHeaderBytes + size_);
}

void ShmMapping::HoldUntilUnmapped(const std::function<std::shared_ptr<void>()>& make) {
  std::call_once(hold_once_, [&] { hold_ = make(); });
}

bool ShmMapping::StillLinked() const {
  const std::string path = "/" + name_;
  int fd = shm_open(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return false;
  struct stat st {};
  bool same = fstat(fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
  close(fd);
  return same;
}

Result<std::shared_ptr<ShmMapping>> ShmMappingCache::Get(const std::string& name, uint64_t size) {
  {
    std::lock_guard lock(mu_);
    auto it = mappings_.find(name);
    if (it != mappings_.end() && it->second->size() == size) return it->second;
  }
  // Attach outside the lock: it costs syscalls, and other names must not wait for it. Two threads
  // racing here both attach; the second insert wins and the first mapping is simply released.
  auto attached = ShmMapping::Attach(name, size);
  if (!attached.ok()) return attached.status();
  std::shared_ptr<ShmMapping> mapping = std::move(attached).value();
  {
    std::lock_guard lock(mu_);
    auto& slot = mappings_[name];
    if (slot && slot->size() == size) return slot;
    slot = mapping;
  }
  if (on_attach_) on_attach_(mapping);
  return mapping;
}

void ShmMappingCache::Drop(const std::string& name) {
  std::shared_ptr<ShmMapping> released;  // unmapped after the lock is released
  std::lock_guard lock(mu_);
  auto it = mappings_.find(name);
  if (it == mappings_.end()) return;
  released = std::move(it->second);
  mappings_.erase(it);
}

void ShmMappingCache::DropIf(const std::string& name, const ShmMapping* mapping) {
  std::shared_ptr<ShmMapping> released;
  std::lock_guard lock(mu_);
  auto it = mappings_.find(name);
  if (it == mappings_.end() || it->second.get() != mapping) return;
  released = std::move(it->second);
  mappings_.erase(it);
}

size_t ShmMappingCache::Retain(const std::set<std::string>& live) {
  std::vector<std::shared_ptr<ShmMapping>> candidates;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, mapping] : mappings_) candidates.push_back(mapping);
  }
  size_t dropped = 0;
  for (const auto& m : candidates) {  // the syscalls of StillLinked outside the lock
    if (live.count(m->name()) == 0 || !m->StillLinked()) {
      DropIf(m->name(), m.get());
      ++dropped;
    }
  }
  return dropped;
}

size_t ShmMappingCache::size() const {
  std::lock_guard lock(mu_);
  return mappings_.size();
}

}  // namespace granary::transfer
