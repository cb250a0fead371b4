#include "transfer/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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
  if (static_cast<uint64_t>(st.st_size) != expected_size) {
    close(fd);
    return Status(ErrorCode::INVALID_PARAMS,
                  "shared-memory segment '" + name + "' is " +
                      std::to_string(static_cast<uint64_t>(st.st_size)) + " bytes (" +
                      FormatSize(static_cast<uint64_t>(st.st_size)) + ") but " +
                      std::to_string(expected_size) + " bytes (" + FormatSize(expected_size) +
                      ") were expected: stale metadata or another node's segment");
  }
  void* p = mmap(nullptr, expected_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);  // the mapping keeps the object alive; the descriptor is not needed any more
  if (p == MAP_FAILED) {
    return Status(ErrorCode::TRANSFER_FAIL,
                  "cannot map shared-memory segment '" + name + "': " + std::strerror(err));
  }
  return std::unique_ptr<ShmMapping>(
      new ShmMapping(name, static_cast<std::byte*>(p), expected_size));
}

ShmMapping::~ShmMapping() { munmap(data_, size_); }

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
  std::lock_guard lock(mu_);
  auto& slot = mappings_[name];
  if (slot && slot->size() == size) return slot;
  slot = mapping;
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

size_t ShmMappingCache::size() const {
  std::lock_guard lock(mu_);
  return mappings_.size();
}

}  // namespace granary::transfer
