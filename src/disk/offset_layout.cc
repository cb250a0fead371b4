// disk/offset_layout.cc - the offset backend: one preallocated file, <dir>/offset.data, whose
// space an ExtentAllocator hands out; each object is one record (record_format.h) at a
// 4 KiB-aligned offset: header and key padded to 4 KiB, then the value padded to 4 KiB.
//
// The file is preallocated (fallocate) at its full size when created, so a full filesystem shows
// at open, not mid-batch; an existing file keeps its size. Its metadata (which record lives
// where) is kept in memory, sharded by record id, and rebuilt at open by scanning the file:
// a block that starts a valid header (magic, salted checksum, sizes inside the file) starts a
// record, which the scan then skips whole; anything else is skipped a block at a time.
// Crash safety comes from write order: the value first, its header last, so a header is only on
// disk once its value is; and a freed record's header block is zeroed before its space is
// reused, so a stale header can neither come back nor hide the records written over its value.
// A removed record's header is zeroed before Remove returns, even while a read still uses its
// value (the space itself is freed once no read does).
//
// Location: tag 3 in bits 60..63 | the record's offset / 4096 in bits 0..59.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "common/logging.h"
#include "disk/extent_allocator.h"
#include "disk/layout.h"
#include "disk/record_format.h"
#include "disk/staged_writer.h"

namespace granary::disk {

namespace {

constexpr uint64_t kScanChunk = 4ull << 20;
constexpr size_t kMetaShards = 16;

class OffsetLayout final : public Layout {
 public:
  OffsetLayout(LayoutContext ctx, std::shared_ptr<FileHandle> file, uint64_t capacity)
      : ctx_(std::move(ctx)), file_(std::move(file)), allocator_(capacity) {}

  DiskBackend kind() const override { return DiskBackend::kOffset; }
  uint64_t Capacity() const override { return allocator_.capacity(); }

  uint64_t Footprint(uint32_t key_len, uint64_t size) const override {
    return RecordPrefixBytes(key_len) + AlignUp(size);
  }

  LayoutWrite Write(std::span<const PreparedObject> objects) override;
  Result<LayoutRecovery> Recover() override;
  void SaveOnClose(const std::vector<RecoveredObject>& live) override;

  Status CheckLocation(uint64_t location) const override {
    uint64_t block = location & ~kTagMask;
    if ((location & kTagMask) >> kTagShift != kTagOffset || block >= allocator_.capacity() / kBlockSize) {
      char b[24];
      std::snprintf(b, sizeof(b), "0x%016" PRIx64, location);
      return Status(ErrorCode::INVALID_PARAMS,
                    std::string("disk location ") + b + " is not an offset location inside the file");
    }
    return Status::Ok();
  }

  // Every record is in the one file, always open: nothing to open or cache per record.
  Result<std::shared_ptr<FileHandle>> OpenUnit(uint64_t) override { return file_; }
  bool CacheHandles() const override { return false; }

  Status Destroy(uint64_t unit_id) override {
    auto extent = Find(unit_id);
    if (!extent) return Status::Ok();
    // A header that could not be zeroed keeps its space: nothing may be written under a header
    // that still holds (the next open's scan would take the old record back, or lose the new).
    if (Status st = ZeroHeader(extent->offset, ctx_.sync_writes); !st.ok()) return st;
    {
      MetaShard& shard = ShardOf(unit_id);
      std::lock_guard lock(shard.mu);
      shard.records.erase(unit_id);
    }
    std::lock_guard lock(alloc_mu_);
    allocator_.Free(extent->offset, extent->length);
    return Status::Ok();
  }

  // The index keeps these records from Destroy meanwhile: their extents cannot be reused under us.
  Status Forget(std::span<const ForgottenCopy> copies) override {
    Status first = Status::Ok();
    bool zeroed = false;
    for (const ForgottenCopy& c : copies) {
      auto extent = Find(c.placement.unit_id);
      if (!extent) continue;
      Status st = ZeroHeader(extent->offset, false);
      zeroed = zeroed || st.ok();
      if (!st.ok() && first.ok()) first = st;
    }
    if (zeroed && ctx_.sync_writes && ::fdatasync(file_->fd) != 0 && first.ok()) {
      first = ErrnoStatus(errno, "syncing the offset file");
    }
    return first;
  }

 private:
  struct Extent {
    uint64_t offset = 0, length = 0;
  };
  struct MetaShard {
    std::mutex mu;
    std::unordered_map<uint64_t, Extent> records;  // unit id -> its place in the file
  };
  MetaShard& ShardOf(uint64_t id) { return meta_[id % kMetaShards]; }
  std::optional<Extent> Find(uint64_t id) {
    MetaShard& shard = ShardOf(id);
    std::lock_guard lock(shard.mu);
    auto it = shard.records.find(id);
    if (it == shard.records.end()) return std::nullopt;
    return it->second;
  }

  Status ZeroHeader(uint64_t offset, bool sync) {
    StagedWriter writer(*ctx_.io);
    static const std::array<std::byte, 1> kZero{};
    writer.Put(file_->fd, offset, kZero, 0);  // one zero byte, padded: a whole zero block
    auto failures = writer.Flush();
    if (!failures.empty()) {
      return ErrnoStatus(failures.begin()->second, "zeroing a record's header in the offset file");
    }
    if (sync && ::fdatasync(file_->fd) != 0) return ErrnoStatus(errno, "syncing the offset file");
    return Status::Ok();
  }

  // Loads the shutdown index into the allocator and record table when it is valid; nullopt (and
  // `why`) when it must not be trusted. Leaves both untouched on failure.
  std::optional<LayoutRecovery> LoadShutdownIndex(std::string* why);
  Result<LayoutRecovery> ScanFile();
  std::string IndexPath() const { return ctx_.dir + "/offset.index"; }

  LayoutContext ctx_;
  std::shared_ptr<FileHandle> file_;
  std::mutex alloc_mu_;
  ExtentAllocator allocator_;
  std::array<MetaShard, kMetaShards> meta_;
  std::atomic<uint64_t> next_id_{1};
};

LayoutWrite OffsetLayout::Write(std::span<const PreparedObject> objects) {
  LayoutWrite out;
  out.placements.assign(objects.size(), Result<Placement>(ErrorCode::INTERNAL_ERROR, "unwritten"));
  struct Slot {
    size_t index;
    uint64_t id;
    Extent extent;
    uint64_t prefix;
  };
  std::vector<Slot> slots;
  StagedWriter writer(*ctx_.io);
  const int fd = file_->fd;
  for (size_t i = 0; i < objects.size(); ++i) {
    const PreparedObject& o = objects[i];
    const uint64_t prefix = RecordPrefixBytes(static_cast<uint32_t>(o.key.size()));
    const uint64_t length = prefix + AlignUp(o.value.size());
    std::optional<uint64_t> offset;
    uint64_t largest = 0;
    {
      std::lock_guard lock(alloc_mu_);
      offset = allocator_.Allocate(length);
      if (!offset) largest = allocator_.largest_free();
    }
    if (!offset) {
      out.placements[i] = Status(ErrorCode::NO_AVAILABLE_HANDLE,
                                 "offset file full: a record of " + std::to_string(length) +
                                     " bytes does not fit (largest free range " + std::to_string(largest) + ")");
      continue;
    }
    slots.push_back(Slot{i, next_id_.fetch_add(1), Extent{*offset, length}, prefix});
    writer.Put(fd, *offset + prefix, o.value, static_cast<uint32_t>(i));
  }
  // Values first; a header is written only over a complete value.
  auto failures = writer.Flush();
  if (ctx_.sync_writes && ::fdatasync(fd) != 0) {
    for (auto& s : slots) failures.emplace(static_cast<uint32_t>(s.index), errno);
  }
  std::vector<std::string> headers(slots.size());
  for (size_t k = 0; k < slots.size(); ++k) {
    const Slot& s = slots[k];
    if (failures.count(static_cast<uint32_t>(s.index))) continue;
    const PreparedObject& o = objects[s.index];
    RecordHeader h{static_cast<uint32_t>(o.key.size()), static_cast<uint32_t>(o.value.size()), o.gen,
                   o.checksum, s.id};
    headers[k] = EncodeRecordPrefix(h, o.key, ctx_.salt);
    writer.Put(fd, s.extent.offset, std::as_bytes(std::span(headers[k].data(), headers[k].size())),
               static_cast<uint32_t>(s.index));
  }
  for (auto& [tag, err] : writer.Flush()) failures.emplace(tag, err);
  if (ctx_.sync_writes && ::fdatasync(fd) != 0) {
    for (auto& s : slots) failures.emplace(static_cast<uint32_t>(s.index), errno);
  }
  for (const Slot& s : slots) {
    auto f = failures.find(static_cast<uint32_t>(s.index));
    if (f != failures.end()) {
      (void)ZeroHeader(s.extent.offset, false);  // best effort: a half-written header must not survive
      std::lock_guard lock(alloc_mu_);
      allocator_.Free(s.extent.offset, s.extent.length);
      out.placements[s.index] = ErrnoStatus(f->second, "writing a record to the offset file");
      continue;
    }
    {
      MetaShard& shard = ShardOf(s.id);
      std::lock_guard lock(shard.mu);
      shard.records[s.id] = s.extent;
    }
    out.placements[s.index] = Placement{s.id, (kTagOffset << kTagShift) | (s.extent.offset / kBlockSize),
                                        s.extent.offset + s.prefix, s.extent.length};
    out.units.push_back(WrittenUnit{s.id, s.extent.length});
  }
  return out;
}

// The shutdown index is trusted only by the open that follows the clean close which wrote it:
// Recover() deletes it (and syncs the directory) before any write, so after a crash there is
// none and the file is scanned.
Result<LayoutRecovery> OffsetLayout::Recover() {
  struct stat st{};
  if (::stat(IndexPath().c_str(), &st) != 0) return ScanFile();
  std::string why;
  std::optional<LayoutRecovery> loaded = LoadShutdownIndex(&why);
  if (::unlink(IndexPath().c_str()) != 0 || SyncDirectory(ctx_.dir) != 0) {
    return ErrnoStatus(errno, "removing " + IndexPath() + " before writing", ErrorCode::INVALID_PARAMS);
  }
  if (loaded) return std::move(*loaded);
  GLOG_WARN("disk tier: {} not used ({}); scanning the offset file", IndexPath(), why);
  auto scanned = ScanFile();
  if (scanned.ok() && scanned->report.problems.size() < 100) {
    scanned->report.problems.push_back("shutdown index not used: " + why);
  }
  return scanned;
}

std::optional<LayoutRecovery> OffsetLayout::LoadShutdownIndex(std::string* why) {
  std::string bytes;
  {
    std::ifstream in(IndexPath(), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto index = DecodeOffsetIndex(std::as_bytes(std::span(bytes.data(), bytes.size())), ctx_.salt);
  if (!index.ok()) {
    *why = index.status().message();
    return std::nullopt;
  }
  const uint64_t capacity = allocator_.capacity();
  struct stat file_st{};
  if (index->capacity != capacity || ::fstat(file_->fd, &file_st) != 0 ||
      index->file_inode != static_cast<uint64_t>(file_st.st_ino)) {
    *why = "written for another offset file";
    return std::nullopt;
  }
  ExtentAllocator allocator(capacity);
  std::unordered_map<uint64_t, Extent> records;
  LayoutRecovery rec;
  rec.report.used_shutdown_index = true;
  uint64_t max_id = 0;
  for (size_t i = 0; i < index->records.size(); ++i) {
    auto& [h, key] = index->records[i];
    const uint64_t offset = index->offsets[i];
    const uint64_t prefix = RecordPrefixBytes(h.key_len);
    const uint64_t length = prefix + AlignUp(h.value_len);
    if (h.unit_id == 0 || h.unit_id >= kTagMask || records.count(h.unit_id) || !IsAligned(offset) ||
        offset > capacity || length > capacity - offset || !allocator.Reserve(offset, length)) {
      *why = "record " + std::to_string(i) + " is inconsistent";
      return std::nullopt;
    }
    records[h.unit_id] = Extent{offset, length};
    max_id = std::max(max_id, h.unit_id);
    RecoveredUnit unit{h.unit_id, length, {}};
    unit.objects.push_back(RecoveredObject{std::move(key), h.gen, h.value_len, h.value_checksum,
                                           Placement{h.unit_id, (kTagOffset << kTagShift) | (offset / kBlockSize),
                                                     offset + prefix, length}});
    rec.units.push_back(std::move(unit));
  }
  allocator_ = std::move(allocator);
  for (auto& [id, extent] : records) ShardOf(id).records[id] = extent;
  next_id_ = std::max(index->next_unit_id, max_id + 1);
  return rec;
}

void OffsetLayout::SaveOnClose(const std::vector<RecoveredObject>& live) {
  OffsetIndex index;
  index.capacity = allocator_.capacity();
  index.next_unit_id = next_id_.load();
  struct stat file_st{};
  if (::fstat(file_->fd, &file_st) != 0) return;
  index.file_inode = static_cast<uint64_t>(file_st.st_ino);
  for (const auto& o : live) {
    const uint64_t prefix = RecordPrefixBytes(static_cast<uint32_t>(o.key.size()));
    RecordHeader h{static_cast<uint32_t>(o.key.size()), static_cast<uint32_t>(o.size), o.gen, o.checksum,
                   o.placement.unit_id};
    index.records.emplace_back(h, o.key);
    index.offsets.push_back(o.placement.value_offset - prefix);
  }
  const std::string encoded = EncodeOffsetIndex(index, ctx_.salt);
  const std::string tmp = IndexPath() + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  for (size_t done = 0; ok && done < encoded.size();) {
    ssize_t n = ::write(fd, encoded.data() + done, encoded.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    done += n > 0 ? static_cast<size_t>(n) : 0;
  }
  // The records themselves must be on disk before an index that vouches for them.
  ok = ok && ::fdatasync(file_->fd) == 0 && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  ok = ok && ::rename(tmp.c_str(), IndexPath().c_str()) == 0 && SyncDirectory(ctx_.dir) == 0;
  if (!ok) {
    ::unlink(tmp.c_str());
    GLOG_WARN("disk tier: could not write {} ({}); the next open scans the offset file", IndexPath(),
              std::strerror(errno));
  }
}

Result<LayoutRecovery> OffsetLayout::ScanFile() {
  LayoutRecovery rec;
  const uint64_t capacity = allocator_.capacity();
  AlignedBuffer chunk(kScanChunk);
  uint64_t chunk_start = 0, chunk_len = 0;
  uint64_t max_id = 0;
  const uint64_t max_prefix = RecordPrefixBytes(kMaxKeyBytes);
  uint64_t pos = 0;
  while (pos + kBlockSize <= capacity) {
    if (pos < chunk_start || pos + std::min(max_prefix, capacity - pos) > chunk_start + chunk_len) {
      IoRequest r;
      r.fd = file_->fd;
      r.buffer = chunk.data();
      r.length = std::min(kScanChunk, capacity - pos);
      r.offset = pos;
      ctx_.io->Run(std::span(&r, 1));
      if (r.result < static_cast<int64_t>(kBlockSize)) {
        return Status(ErrorCode::INVALID_READ, "scanning the offset file at " + std::to_string(pos) +
                                                   ": read returned " + std::to_string(r.result));
      }
      chunk_start = pos;
      chunk_len = static_cast<uint64_t>(r.result);
    }
    std::span<const std::byte> here(chunk.data() + (pos - chunk_start), chunk_start + chunk_len - pos);
    std::string key;
    auto h = DecodeRecordPrefix(here, ctx_.salt, &key);
    if (!h) {
      pos += kBlockSize;
      continue;
    }
    const uint64_t length = RecordPrefixBytes(h->key_len) + AlignUp(h->value_len);
    bool fresh_id = h->unit_id != 0 && h->unit_id < kTagMask;
    if (fresh_id) {
      std::lock_guard lock(ShardOf(h->unit_id).mu);
      fresh_id = !ShardOf(h->unit_id).records.count(h->unit_id);
    }
    if (length > capacity - pos || !fresh_id || !allocator_.Reserve(pos, length)) {
      if (rec.report.problems.size() < 100) {
        rec.report.problems.push_back("offset record at " + std::to_string(pos) + " is inconsistent, dropped");
      }
      rec.report.units_discarded++;
      pos += kBlockSize;
      continue;
    }
    max_id = std::max(max_id, h->unit_id);
    {
      std::lock_guard lock(ShardOf(h->unit_id).mu);
      ShardOf(h->unit_id).records[h->unit_id] = Extent{pos, length};
    }
    RecoveredUnit unit{h->unit_id, length, {}};
    const uint64_t prefix = RecordPrefixBytes(h->key_len);
    unit.objects.push_back(RecoveredObject{std::move(key), h->gen, h->value_len, h->value_checksum,
                                           Placement{h->unit_id, (kTagOffset << kTagShift) | (pos / kBlockSize),
                                                     pos + prefix, length}});
    rec.units.push_back(std::move(unit));
    pos += length;
  }
  next_id_ = max_id + 1;
  return rec;
}

}  // namespace

Result<std::unique_ptr<Layout>> MakeOffsetLayout(LayoutContext ctx) {
  const std::string path = ctx.dir + "/offset.data";
  struct stat st{};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  int fd = OpenStoreFile(ctx, path, O_RDWR | O_CREAT);
  if (fd < 0) return ErrnoStatus(errno, "opening " + path, ErrorCode::INVALID_PARAMS);
  auto file = std::make_shared<FileHandle>(fd);
  uint64_t capacity = 0;
  if (exists && st.st_size >= static_cast<off_t>(kBlockSize)) {
    capacity = static_cast<uint64_t>(st.st_size) / kBlockSize * kBlockSize;
    if (ctx.capacity != 0 && capacity != ctx.capacity / kBlockSize * kBlockSize) {
      GLOG_WARN("disk tier: {} keeps its size of {} bytes (disk_size {} applies to a new file only)",
                path, capacity, ctx.capacity);
    }
  } else {
    ::unlink((ctx.dir + "/offset.index").c_str());  // describes a file that is no more
    capacity = ctx.capacity / kBlockSize * kBlockSize;
    if (capacity == 0) return Status(ErrorCode::INVALID_PARAMS, "offset backend: disk_size below 4 KiB");
    int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(capacity));
    if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
      GLOG_WARN("disk tier: {} cannot be preallocated here; sparse file (ENOSPC may come mid-write)", path);
      rc = ::ftruncate(fd, static_cast<off_t>(capacity));
    }
    if (rc != 0) {
      int err = errno;
      ::unlink(path.c_str());
      return ErrnoStatus(err, "preallocating " + std::to_string(capacity) + " bytes for " + path,
                         ErrorCode::INVALID_PARAMS);
    }
  }
  return std::unique_ptr<Layout>(std::make_unique<OffsetLayout>(std::move(ctx), std::move(file), capacity));
}

}  // namespace granary::disk
