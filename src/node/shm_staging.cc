#include "node/shm_staging.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <random>

#include "common/logging.h"
#include "common/units.h"
#include "transfer/shm_mapping.h"
#include "transfer/shm_staging.h"

namespace granary::node {

namespace {

using transfer::kStageAlign;

uint64_t RoundUp(uint64_t n) { return (n + kStageAlign - 1) / kStageAlign * kStageAlign; }

Status SysError(const std::string& what, const std::string& name, int err) {
  return Status(ErrorCode::INTERNAL_ERROR,
                what + " of staging region '" + name + "' failed: " + std::strerror(err));
}

// Opens a new file at `path`; a leftover whose flock is free (its node died) is replaced.
Result<int> OpenFresh(const std::string& name, const std::string& path) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
    if (errno != EEXIST) return SysError("creation", name, errno);
    int old = shm_open(path.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (old < 0) continue;  // gone meanwhile
    const bool stale = flock(old, LOCK_EX | LOCK_NB) == 0;
    if (stale) shm_unlink(path.c_str());
    close(old);
    if (!stale) {
      return Status(ErrorCode::SEGMENT_ALREADY_EXISTS,
                    "staging region '" + name + "' is held by a running node on this host");
    }
  }
  return Status(ErrorCode::INTERNAL_ERROR, "staging region '" + name + "' kept reappearing");
}

}  // namespace

Result<std::unique_ptr<ShmStaging>> ShmStaging::Create(const std::string& name, Options options) {
  if (Status s = transfer::ValidateShmName(name); !s.ok()) return s;
  if (options.bytes == 0 || options.bytes > (uint64_t{1} << 40) || options.slot_ttl_ms <= 0) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "staging region needs 0 < bytes <= 1 TiB and a positive slot TTL");
  }
  const uint64_t data_bytes = RoundUp(options.bytes);
  uint32_t slots = options.max_slots;
  if (slots == 0) {
    slots = static_cast<uint32_t>(std::clamp<uint64_t>(data_bytes / (64 << 10), 64, 16384));
  }
  slots = std::min<uint32_t>(slots, 1u << 20);
  const uint64_t header_bytes = transfer::StageHeaderBytes(slots);
  const uint64_t map_bytes = header_bytes + data_bytes;
  struct statvfs vfs {};
  if (statvfs(options.shm_dir.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (free_bytes < map_bytes) {
      return Status(ErrorCode::INVALID_PARAMS,
                    "staging region '" + name + "' of " + FormatSize(map_bytes) + " does not fit: " +
                        options.shm_dir + " has " + FormatSize(free_bytes) + " free");
    }
  }
  const std::string path = "/" + name;
  auto opened = OpenFresh(name, path);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  auto fail = [&](const char* what, int err) {
    shm_unlink(path.c_str());
    close(fd);
    return SysError(what, name, err);
  };
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) return fail("locking", errno);
  if (ftruncate(fd, static_cast<off_t>(map_bytes)) != 0) return fail("sizing", errno);
  void* p = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mapping", errno);
  // Pages are taken as staging first touches them (not prefaulted: the high-water mark of
  // staging, not the whole region, is what stays resident).
  std::unique_ptr<ShmStaging> s(new ShmStaging(name, fd, static_cast<std::byte*>(p), map_bytes,
                                               header_bytes, data_bytes, slots, options));
  return s;
}

ShmStaging::ShmStaging(std::string name, int fd, std::byte* base, uint64_t map_bytes,
                       uint64_t header_bytes, uint64_t data_bytes, uint32_t slots, Options options)
    : name_(std::move(name)),
      fd_(fd),
      base_(base),
      map_bytes_(map_bytes),
      data_(base + header_bytes),
      data_bytes_(data_bytes),
      slot_count_(slots),
      options_(std::move(options)),
      generations_(reinterpret_cast<std::atomic<uint64_t>*>(base + transfer::kStageGenerationsAt)),
      slots_(slots) {
  std::random_device rd;
  token_ = (uint64_t{rd()} << 32 | rd()) ^ static_cast<uint64_t>(getpid());
  if (token_ == 0) token_ = 1;
  for (uint32_t i = 0; i < slots; ++i) {
    new (&generations_[i]) std::atomic<uint64_t>(1);
  }
  free_ids_.reserve(slots);
  for (uint32_t i = slots; i > 0; --i) free_ids_.push_back(i - 1);  // lowest id first
  free_extents_[0] = data_bytes_;
  transfer::StageRegionHeader h{};
  h.layout_version = transfer::kStageLayoutVersion;
  h.slot_count = slots;
  h.header_bytes = header_bytes;
  h.data_bytes = data_bytes;
  h.region_token = token_;
  h.owner_pid = static_cast<uint64_t>(getpid());
  h.magic = transfer::kStageMagic;
  std::memcpy(base_, &h, sizeof(h));
  GLOG_INFO("disk staging region {} ({}, {} slots, slot TTL {} ms) for same-host loads", name_,
            FormatSize(data_bytes_), slots, options_.slot_ttl_ms);
}

ShmStaging::~ShmStaging() {
  munmap(base_, map_bytes_);
  // Unlink only if the name is still this file (a newer node may have replaced a stale one).
  struct stat mine {}, current {};
  const std::string path = "/dev/shm/" + name_;
  if (fstat(fd_, &mine) == 0 && stat(path.c_str(), &current) == 0 &&
      mine.st_ino == current.st_ino && mine.st_dev == current.st_dev) {
    shm_unlink(("/" + name_).c_str());
  }
  close(fd_);
}

uint64_t ShmStaging::generation(uint32_t slot) const {
  if (slot >= slot_count_) return 0;
  return generations_[slot].load(std::memory_order_acquire);
}

bool ShmStaging::TakeExtent(uint64_t bytes, uint64_t* offset) {
  for (auto it = free_extents_.begin(); it != free_extents_.end(); ++it) {
    if (it->second < bytes) continue;
    *offset = it->first;
    const uint64_t rest = it->second - bytes;
    const uint64_t rest_at = it->first + bytes;
    free_extents_.erase(it);
    if (rest > 0) free_extents_[rest_at] = rest;
    return true;
  }
  return false;
}

void ShmStaging::PutExtent(uint64_t offset, uint64_t bytes) {
  auto next = free_extents_.lower_bound(offset);
  if (next != free_extents_.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = free_extents_.erase(next);
  }
  if (next != free_extents_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  free_extents_[offset] = bytes;
}

void ShmStaging::FreeLocked(uint32_t id) {
  Slot& s = slots_[id];
  // The bump comes before the space can be granted again (both under mu_): a reader that copied
  // reused bytes sees a new generation after its copy.
  generations_[id].fetch_add(1, std::memory_order_seq_cst);
  PutExtent(s.offset, s.bytes);
  stats_.bytes_in_use -= s.bytes;
  stats_.slots_in_use--;
  s = Slot{};
  free_ids_.push_back(id);
}

Result<std::vector<ShmStaging::Grant>> ShmStaging::Acquire(const std::vector<uint64_t>& sizes,
                                                           uint64_t owner, int wait_ms) {
  std::vector<uint64_t> need;
  uint64_t total = 0;
  for (uint64_t size : sizes) {
    if (size > data_bytes_) {
      return Status(ErrorCode::NO_AVAILABLE_HANDLE, "an object larger than the staging region");
    }
    need.push_back(std::max<uint64_t>(RoundUp(size), kStageAlign));
    total += need.back();
  }
  if (total > data_bytes_ || sizes.size() > slot_count_) {
    return Status(ErrorCode::NO_AVAILABLE_HANDLE, "a window larger than the staging region");
  }
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(std::max(0, wait_ms));
  std::unique_lock lock(mu_);
  while (true) {  // bounded: every pass either succeeds or waits towards `deadline`
    const Clock::time_point now = Clock::now();
    ReclaimExpiredLocked(now);
    if (free_ids_.size() >= need.size() && data_bytes_ - stats_.bytes_in_use >= total) {
      std::vector<Grant> grants;
      bool ok = true;
      for (uint64_t bytes : need) {
        uint64_t offset = 0;
        if (!TakeExtent(bytes, &offset)) {
          ok = false;
          break;
        }
        const uint32_t id = free_ids_.back();
        free_ids_.pop_back();
        slots_[id] = Slot{State::kFilling, owner, offset, bytes, {}};
        stats_.bytes_in_use += bytes;
        stats_.slots_in_use++;
        grants.push_back({id, generations_[id].load(std::memory_order_relaxed), offset,
                          std::span<std::byte>(data_ + offset, bytes)});
      }
      if (ok) {
        stats_.granted += grants.size();
        return grants;
      }
      for (const Grant& g : grants) FreeLocked(g.slot);  // fragmented: give back, wait
    }
    if (now >= deadline) {
      return Status(ErrorCode::NO_AVAILABLE_HANDLE, "the staging region stayed full");
    }
    cv_.wait_until(lock, std::min(deadline, next_expiry_));
  }
}

void ShmStaging::Hand(uint32_t id) {
  {
    std::lock_guard lock(mu_);
    if (id >= slot_count_ || slots_[id].state != State::kFilling) return;
    slots_[id].state = State::kHanded;
    slots_[id].deadline = Clock::now() + std::chrono::milliseconds(options_.slot_ttl_ms);
    if (slots_[id].deadline >= next_expiry_) return;
    next_expiry_ = slots_[id].deadline;
  }
  cv_.notify_all();  // a waiter may now wake at this expiry rather than at its own deadline
}

void ShmStaging::Free(uint32_t id) {
  {
    std::lock_guard lock(mu_);
    if (id >= slot_count_ || slots_[id].state == State::kFree) return;
    FreeLocked(id);
  }
  cv_.notify_all();
}

ErrorCode ShmStaging::Release(uint32_t id, uint64_t generation, uint64_t owner) {
  ErrorCode code = ErrorCode::OK;
  {
    std::lock_guard lock(mu_);
    if (id >= slot_count_) {
      code = ErrorCode::INVALID_PARAMS;
    } else if (slots_[id].state != State::kHanded ||
               generations_[id].load(std::memory_order_relaxed) != generation) {
      code = ErrorCode::OBJECT_NOT_FOUND;
    } else if (slots_[id].owner != owner) {
      code = ErrorCode::ILLEGAL_CLIENT;
    } else {
      FreeLocked(id);
      stats_.released++;
    }
    if (code != ErrorCode::OK) stats_.refused_releases++;
  }
  if (code == ErrorCode::OK) cv_.notify_all();
  return code;
}

size_t ShmStaging::ReleaseOwner(uint64_t owner) {
  size_t n = 0;
  {
    std::lock_guard lock(mu_);
    for (uint32_t id = 0; id < slot_count_; ++id) {
      if (slots_[id].state == State::kHanded && slots_[id].owner == owner) {
        FreeLocked(id);
        ++n;
      }
    }
    stats_.closed += n;
  }
  if (n > 0) cv_.notify_all();
  return n;
}

size_t ShmStaging::ReclaimExpiredLocked(Clock::time_point now) {
  if (now < next_expiry_) return 0;
  size_t n = 0;
  Clock::time_point next = Clock::time_point::max();
  for (uint32_t id = 0; id < slot_count_; ++id) {
    if (slots_[id].state != State::kHanded) continue;
    if (slots_[id].deadline <= now) {
      FreeLocked(id);
      ++n;
    } else {
      next = std::min(next, slots_[id].deadline);
    }
  }
  next_expiry_ = next;
  stats_.reclaimed += n;
  if (n > 0) GLOG_WARN("staging region {}: reclaimed {} slots not released within {} ms", name_, n,
                       options_.slot_ttl_ms);
  return n;
}

size_t ShmStaging::ReclaimExpired() {
  size_t n;
  {
    std::lock_guard lock(mu_);
    n = ReclaimExpiredLocked(Clock::now());
  }
  if (n > 0) cv_.notify_all();
  return n;
}

ShmStaging::Stats ShmStaging::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace granary::node
