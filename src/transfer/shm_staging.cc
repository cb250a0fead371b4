#include "transfer/shm_staging.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/checksum.h"
#include "common/copy.h"
#include "transfer/shm_mapping.h"

namespace granary::transfer {

Result<std::unique_ptr<StagingView>> StagingView::Attach(const std::string& name,
                                                         uint64_t expected_token) {
  if (Status s = ValidateShmName(name); !s.ok()) return s;
  const std::string path = "/" + name;
  int fd = shm_open(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return Status(ErrorCode::SEGMENT_NOT_FOUND,
                    "no staging region '" + name + "' on this host: the node is elsewhere");
    }
    return Status(ErrorCode::TRANSFER_FAIL,
                  "cannot open staging region '" + name + "': " + std::strerror(err));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < kStageAlign) {
    close(fd);
    return Status(ErrorCode::INVALID_PARAMS, "staging region '" + name + "' is too small");
  }
  const uint64_t map_bytes = static_cast<uint64_t>(st.st_size);
  void* p = mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    return Status(ErrorCode::TRANSFER_FAIL,
                  "cannot map staging region '" + name + "': " + std::strerror(err));
  }
  StageRegionHeader h;
  std::memcpy(&h, p, sizeof(h));
  const bool sane = h.magic == kStageMagic && h.layout_version == kStageLayoutVersion &&
                    h.slot_count > 0 && h.header_bytes == StageHeaderBytes(h.slot_count) &&
                    h.data_bytes <= map_bytes && h.header_bytes <= map_bytes - h.data_bytes;
  if (!sane || h.region_token != expected_token) {
    munmap(p, map_bytes);
    return Status(ErrorCode::INVALID_PARAMS,
                  "staging region '" + name + "' is " +
                      (sane ? "another region than the node named (another host or process)"
                            : "not a staging region of layout version " +
                                  std::to_string(kStageLayoutVersion)));
  }
  return std::unique_ptr<StagingView>(new StagingView(name, p, map_bytes, h));
}

StagingView::StagingView(std::string name, void* base, uint64_t map_bytes,
                         const StageRegionHeader& h)
    : name_(std::move(name)),
      base_(base),
      map_bytes_(map_bytes),
      token_(h.region_token),
      data_bytes_(h.data_bytes),
      slot_count_(h.slot_count),
      generations_(reinterpret_cast<const std::atomic<uint64_t>*>(static_cast<std::byte*>(base) +
                                                                  kStageGenerationsAt)),
      data_(static_cast<const std::byte*>(base) + h.header_bytes) {}

StagingView::~StagingView() { munmap(base_, map_bytes_); }

uint64_t StagingView::generation(uint32_t slot) const {
  if (slot >= slot_count_) return 0;
  return generations_[slot].load(std::memory_order_acquire);
}

Status StagingView::Copy(const StagedSlot& s, const std::vector<std::span<std::byte>>& dst,
                         uint64_t* checksum) const {
  uint64_t total = 0;
  for (const auto& part : dst) total += part.size();
  if (s.region_token != token_ || s.slot >= slot_count_ || s.length != total ||
      s.offset > data_bytes_ || s.length > data_bytes_ - s.offset) {
    return Status(ErrorCode::INVALID_PARAMS, "a staged slot outside staging region " + name_);
  }
  // A slot already reclaimed is not worth copying; the check after the copy is the one that
  // counts (a reclaim may start at any moment during it).
  if (generation(s.slot) != s.generation) {
    return Status(ErrorCode::SEGMENT_NOT_FOUND,
                  "staging slot " + std::to_string(s.slot) + " was reclaimed before the copy");
  }
  ChecksumStream hash;
  const std::byte* from = data_ + s.offset;
  for (const auto& part : dst) {
    if (checksum != nullptr) {
      hash.CopyAndUpdate(part.data(), from, part.size());  // hashes the private copy
    } else {
      CopyBytes(part.data(), from, part.size());
    }
    from += part.size();
  }
  // The copy's loads before the second look at the generation (a seqlock's reader side): the
  // node bumps it before it reuses the space, so a copy that saw reused bytes sees the bump.
  std::atomic_thread_fence(std::memory_order_acquire);
  if (generation(s.slot) != s.generation) {
    return Status(ErrorCode::SEGMENT_NOT_FOUND,
                  "staging slot " + std::to_string(s.slot) +
                      " was reclaimed during the copy (TTL): the bytes were discarded");
  }
  if (checksum != nullptr) *checksum = hash.Digest();
  return Status::Ok();
}

}  // namespace granary::transfer
