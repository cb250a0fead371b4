// disk/bucket_layout.cc - the bucket backend (the default): objects written in groups.
//
// A bucket is two files in <dir>/buckets/: <id>.data holds the values back to back, each at a
// 4 KiB-aligned offset and padded to 4 KiB; <id>.meta lists the keys, generations, offsets, sizes
// and checksums (record_format.h). Ids (16 hex digits) come from one increasing sequence, so they
// order buckets by creation. A Write() closes a bucket at bucket_max_bytes of data or
// bucket_max_keys objects, whichever comes first; buckets are never appended to afterwards.
//
// Crash safety comes from the order of writes: the data file is complete before the metadata is
// written, to <id>.meta.tmp, and renamed to <id>.meta. So a crash mid-write leaves a data file
// without metadata, or a .tmp: recovery deletes both. A data file shorter than its metadata says
// (truncated) is discarded whole. Destroy removes the metadata first, for the same reason.
//
// A copy removed, replaced or evicted while its bucket keeps other live copies stays listed in
// the bucket's metadata, so a tombstone naming it (record_format.h) is appended to <dir>/buckets/tombstones
// before Remove returns: recovery skips every copy a tombstone names, deletes a bucket whose
// copies all are, and rewrites the log without the tombstones of buckets that are gone. A torn
// or damaged record (a crash mid-append) is ignored. The log is also rewritten while the store
// runs once most of it names deleted buckets, so it stays proportional to the live tombstones.
// Once its tombstone is written, the copy's value range can be punched out of the data file
// (ReleaseSpace, where the filesystem supports it): its space goes back while the bucket stays.
//
// Location: tag 1 in bits 60..63 | bucket id in bits 24..59 | the object's index in the bucket
// in bits 0..23 (bucket_max_keys is capped at 2^24 - 1 accordingly).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <unordered_map>

#include "common/logging.h"
#include "disk/layout.h"
#include "disk/record_format.h"
#include "disk/staged_writer.h"

namespace granary::disk {

namespace {

constexpr int kIdBits = 36;
constexpr int kSlotBits = 24;
constexpr uint64_t kMaxBucketId = (1ull << kIdBits) - 1;
constexpr uint64_t kMaxMetaBytes = 256ull << 20;  // refuse to load anything larger at recovery
constexpr uint64_t kSlotMask = (1ull << kSlotBits) - 1;
// Allocated ahead of the tombstone log's end (fallocate, size kept): removes are how a full
// filesystem gets space back, so their appends must not need new blocks.
constexpr uint64_t kTombReserve = 64ull << 10;
// Records of deleted buckets the log may carry beyond the live ones before it is rewritten.
constexpr uint64_t kTombSlack = 1024;
constexpr size_t kTombReadChunk = kTombstoneBytes * 21845;  // ~1 MiB of whole records

// 0 or an errno; a write that makes no progress is ENOSPC.
int WriteFully(int fd, const std::string& bytes, uint64_t offset) {
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ENOSPC;
    done += static_cast<size_t>(n);
  }
  return 0;
}

uint64_t BucketLocation(uint64_t id, uint64_t slot) {
  return (kTagBucket << kTagShift) | (id << kSlotBits) | slot;
}

class BucketLayout final : public Layout {
 public:
  explicit BucketLayout(LayoutContext ctx) : ctx_(std::move(ctx)), dir_(ctx_.dir + "/buckets") {}

  Status Init() {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) return Status(ErrorCode::INVALID_PARAMS, "cannot create " + dir_ + ": " + ec.message());
    int fd = ::open(TombPath().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus(errno, "opening " + TombPath(), ErrorCode::INVALID_PARAMS);
    tomb_file_ = std::make_unique<FileHandle>(fd);
    punches_holes_ = PunchesHoles(dir_);
    // Eviction of whole buckets wants small ones; of copies, large ones write fastest.
    bucket_bytes_ = BucketBytes(ctx_.capacity, ctx_.bucket_max_bytes, ctx_.evict_copies && punches_holes_);
    return Status::Ok();
  }

  DiskBackend kind() const override { return DiskBackend::kBucket; }

  uint64_t Footprint(uint32_t key_len, uint64_t size) const override {
    // Its value, its metadata entry, and at most a block of metadata header and padding.
    return AlignUp(size) + kBucketEntryBytes + key_len + kBlockSize;
  }

  LayoutWrite Write(std::span<const PreparedObject> objects) override {
    LayoutWrite out;
    out.placements.assign(objects.size(), Result<Placement>(ErrorCode::INTERNAL_ERROR, "unwritten"));
    size_t begin = 0;
    while (begin < objects.size()) {
      size_t end = begin;
      uint64_t data_bytes = 0;
      while (end < objects.size() && end - begin < ctx_.bucket_max_keys &&
             (end == begin || data_bytes + AlignUp(objects[end].value.size()) <= bucket_bytes_)) {
        data_bytes += AlignUp(objects[end].value.size());
        ++end;
      }
      WriteBucket(objects, begin, end, &out);
      begin = end;
    }
    return out;
  }

  Result<LayoutRecovery> Recover() override;

  Status CheckLocation(uint64_t location) const override {
    // Structure only: the slot is not checked against bucket_max_keys, which may have been larger
    // when a recovered bucket was written. Whether the copy exists is the index's answer.
    uint64_t id = (location & ~kTagMask) >> kSlotBits;
    if ((location & kTagMask) >> kTagShift != kTagBucket || id == 0) {
      return Status(ErrorCode::INVALID_PARAMS, "disk location " + Hex(location) + " is not a bucket location");
    }
    return Status::Ok();
  }

  Result<std::shared_ptr<FileHandle>> OpenUnit(uint64_t unit_id) override {
    int fd = OpenStoreFile(ctx_, DataPath(unit_id), O_RDONLY);
    if (fd < 0) {
      int err = errno;
      if (err == ENOENT) {
        return Result<std::shared_ptr<FileHandle>>(ErrorCode::OBJECT_NOT_FOUND,
                                                   "bucket data file " + DataPath(unit_id) + " is missing");
      }
      return ErrnoStatus(err, "opening " + DataPath(unit_id), ErrorCode::INVALID_READ);
    }
    return std::make_shared<FileHandle>(fd);
  }
  bool CacheHandles() const override { return true; }

  Status Destroy(uint64_t unit_id) override {
    // Metadata first: a crash in between leaves a data file without metadata, which recovery drops.
    if (::unlink(MetaPath(unit_id).c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, "deleting " + MetaPath(unit_id));
    }
    Status st = Status::Ok();
    if (::unlink(DataPath(unit_id).c_str()) != 0 && errno != ENOENT) {
      st = ErrnoStatus(errno, "deleting " + DataPath(unit_id));
    }
    // The deletion must be durable before the tombstones that covered the bucket may go.
    if (ctx_.sync_writes) {
      if (int err = SyncDirectory(dir_); err != 0) return ErrnoStatus(err, "syncing " + dir_);
    }
    std::lock_guard lock(tomb_mu_);
    if (auto it = tombs_.find(unit_id); it != tombs_.end()) {
      tomb_live_ -= it->second.size();
      tombs_.erase(it);
    }
    if (tomb_end_ / kTombstoneBytes >= 2 * tomb_live_ + kTombSlack) {
      if (Status rw = RewriteTombsLocked(); !rw.ok()) GLOG_WARN("disk tier: compacting tombstones: {}", rw.ToString());
    }
    return st;
  }

  bool ReleasesCopySpace() const override { return punches_holes_; }

  uint64_t ReleaseSpace(uint64_t unit_id, std::span<const ValueRange> ranges) override {
    if (!punches_holes_ || ranges.empty()) return 0;
    int fd = ::open(DataPath(unit_id).c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno != ENOENT) GLOG_WARN("disk tier: opening {} to free space: {}", DataPath(unit_id), std::strerror(errno));
      return 0;  // ENOENT: the bucket went meanwhile, and its space with it
    }
    FileHandle file(fd);
    // Neighbours in one call: copies written together are often evicted together, and a punch
    // costs about 130 us a call on this VM's ext4 however little it frees.
    std::vector<ValueRange> merged(ranges.begin(), ranges.end());
    std::sort(merged.begin(), merged.end(),
              [](const ValueRange& a, const ValueRange& b) { return a.offset < b.offset; });
    size_t kept = 0;
    for (size_t i = 0; i < merged.size(); ++i) {
      if (kept > 0 && merged[kept - 1].offset + merged[kept - 1].length == merged[i].offset) {
        merged[kept - 1].length += merged[i].length;
      } else {
        merged[kept++] = merged[i];
      }
    }
    merged.resize(kept);
    uint64_t freed = 0;
    for (const ValueRange& r : merged) {
      if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(r.offset),
                      static_cast<off_t>(r.length)) != 0) {
        GLOG_WARN("disk tier: freeing {} bytes of {}: {}", r.length, DataPath(unit_id), std::strerror(errno));
        continue;
      }
      freed += r.length;
    }
    return freed;
  }

  Status Forget(std::span<const ForgottenCopy> copies) override {
    if (copies.empty()) return Status::Ok();
    std::string records;
    std::vector<Tombstone> made;
    for (const ForgottenCopy& c : copies) {
      made.push_back(Tombstone{c.placement.unit_id, static_cast<uint32_t>(c.placement.location & kSlotMask), c.gen,
                               TombstoneKeyHash(c.key, ctx_.salt)});
      records += EncodeTombstone(made.back(), ctx_.salt);
    }
    std::lock_guard lock(tomb_mu_);
    ReserveTombsLocked(records.size());
    // At the end of the whole records: a failed append leaves nothing the next one keeps.
    if (int err = WriteFully(tomb_file_->fd, records, tomb_end_); err != 0) {
      return ErrnoStatus(err, "appending a tombstone to " + TombPath());
    }
    tomb_end_ += records.size();
    for (const Tombstone& t : made) tombs_[t.bucket_id].push_back(t);
    tomb_live_ += made.size();
    if (ctx_.sync_writes && ::fdatasync(tomb_file_->fd) != 0) return ErrnoStatus(errno, "syncing " + TombPath());
    return Status::Ok();
  }

 private:
  static std::string Hex(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof(b), "0x%016" PRIx64, v);
    return b;
  }
  std::string Name(uint64_t id) const {
    char b[24];
    std::snprintf(b, sizeof(b), "%016" PRIx64, id);
    return dir_ + "/" + b;
  }
  std::string DataPath(uint64_t id) const { return Name(id) + ".data"; }
  std::string MetaPath(uint64_t id) const { return Name(id) + ".meta"; }
  std::string TombPath() const { return dir_ + "/tombstones"; }

  void WriteBucket(std::span<const PreparedObject> objects, size_t begin, size_t end, LayoutWrite* out);

  struct TombScan {
    std::unordered_map<uint64_t, std::vector<Tombstone>> by_bucket;
    uint64_t valid = 0, damaged = 0, max_bucket = 0, file_bytes = 0;
    bool torn_tail = false;
  };
  Status ReadTombsLocked(TombScan* scan);
  // Replaces the log with the tombstones of tombs_ (temp file, fdatasync, rename).
  Status RewriteTombsLocked();
  void ReserveTombsLocked(uint64_t bytes);

  LayoutContext ctx_;
  std::string dir_;
  std::atomic<uint64_t> next_id_{1};

  std::mutex tomb_mu_;  // the log and tombs_; no other lock is taken under it
  std::unique_ptr<FileHandle> tomb_file_;
  uint64_t tomb_end_ = 0;       // bytes of whole records: the next one goes here
  uint64_t tomb_reserved_ = 0;  // blocks allocated up to here
  bool tomb_reserve_works_ = true;
  bool punches_holes_ = false;  // fallocate(PUNCH_HOLE) works here: ReleaseSpace frees copies
  uint64_t bucket_bytes_ = 0;   // a bucket's data at most
  std::unordered_map<uint64_t, std::vector<Tombstone>> tombs_;  // by bucket, buckets on disk only
  uint64_t tomb_live_ = 0;                                      // tombstones in tombs_
};

void BucketLayout::ReserveTombsLocked(uint64_t bytes) {
  if (!tomb_reserve_works_ || tomb_end_ + bytes <= tomb_reserved_) return;
  const uint64_t want = tomb_end_ + bytes + kTombReserve;
  if (::fallocate(tomb_file_->fd, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(tomb_end_),
                  static_cast<off_t>(want - tomb_end_)) == 0) {
    tomb_reserved_ = want;
  } else if (errno == EOPNOTSUPP || errno == ENOSYS) {
    tomb_reserve_works_ = false;  // appends then allocate as they go
  }
}

Status BucketLayout::RewriteTombsLocked() {
  std::string bytes;
  bytes.reserve(tomb_live_ * kTombstoneBytes);
  for (const auto& [id, list] : tombs_) {
    for (const Tombstone& t : list) bytes += EncodeTombstone(t, ctx_.salt);
  }
  const std::string tmp = TombPath() + ".tmp";
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "creating " + tmp);
  // Synced even without sync_writes: the rename must never put a log the disk does not hold yet
  // in place of one it does.
  int err = WriteFully(fd, bytes, 0);
  if (err == 0 && ::fdatasync(fd) != 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), TombPath().c_str()) != 0) err = errno;
  if (err != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "rewriting " + TombPath());
  }
  tomb_file_ = std::make_unique<FileHandle>(fd);
  tomb_end_ = bytes.size();
  tomb_reserved_ = tomb_end_;
  ReserveTombsLocked(0);
  // Should the rename not survive a power loss, the old log comes back: a superset, still right.
  if (int sync_err = SyncDirectory(dir_); sync_err != 0) return ErrnoStatus(sync_err, "syncing " + dir_);
  return Status::Ok();
}

Status BucketLayout::ReadTombsLocked(TombScan* scan) {
  const int fd = tomb_file_->fd;
  struct stat st{};
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "reading " + TombPath(), ErrorCode::INVALID_READ);
  scan->file_bytes = static_cast<uint64_t>(st.st_size);
  std::string chunk(kTombReadChunk, '\0');
  for (uint64_t pos = 0; pos < scan->file_bytes;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk.size(), scan->file_bytes - pos));
    size_t got = 0;
    while (got < want) {
      ssize_t n = ::pread(fd, chunk.data() + got, want - got, static_cast<off_t>(pos + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, "reading " + TombPath(), ErrorCode::INVALID_READ);
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    if (got < want) return Status(ErrorCode::INVALID_READ, TombPath() + " shrank while being read");
    size_t at = 0;
    for (; at + kTombstoneBytes <= got; at += kTombstoneBytes) {
      auto t = DecodeTombstone(std::as_bytes(std::span(chunk.data() + at, kTombstoneBytes)), ctx_.salt);
      if (!t) {
        scan->damaged++;
        continue;
      }
      scan->valid++;
      scan->max_bucket = std::max(scan->max_bucket, t->bucket_id);
      scan->by_bucket[t->bucket_id].push_back(*t);
    }
    if (at < got) {  // only the file's last chunk can end mid-record
      scan->torn_tail = true;
      break;
    }
    pos += got;
  }
  return Status::Ok();
}

void BucketLayout::WriteBucket(std::span<const PreparedObject> objects, size_t begin, size_t end,
                               LayoutWrite* out) {
  auto fail_all = [&](const Status& st) {
    for (size_t i = begin; i < end; ++i) out->placements[i] = st;
  };
  const uint64_t id = next_id_.fetch_add(1);
  if (id > kMaxBucketId) return fail_all(Status(ErrorCode::INTERNAL_ERROR, "bucket ids exhausted"));
  const std::string data_path = DataPath(id), meta_path = MetaPath(id), tmp_path = meta_path + ".tmp";
  int data_fd = OpenStoreFile(ctx_, data_path, O_WRONLY | O_CREAT | O_EXCL);
  if (data_fd < 0) return fail_all(ErrnoStatus(errno, "creating " + data_path));
  FileHandle data_file(data_fd);

  StagedWriter writer(*ctx_.io);
  BucketMeta meta;
  meta.bucket_id = id;
  for (size_t i = begin; i < end; ++i) {
    const PreparedObject& o = objects[i];
    meta.entries.push_back(BucketEntry{std::string(o.key), o.gen, meta.data_bytes, o.value.size(), o.checksum});
    writer.Put(data_fd, meta.data_bytes, o.value, 0);
    meta.data_bytes += AlignUp(o.value.size());
  }
  auto failures = writer.Flush();
  if (failures.empty() && ctx_.sync_writes && ::fdatasync(data_fd) != 0) failures.emplace(0, errno);
  if (!failures.empty()) {
    ::unlink(data_path.c_str());
    return fail_all(ErrnoStatus(failures.begin()->second, "writing bucket " + data_path));
  }

  const std::string encoded = EncodeBucketMeta(meta, ctx_.salt);
  int meta_fd = OpenStoreFile(ctx_, tmp_path, O_WRONLY | O_CREAT | O_TRUNC);
  if (meta_fd < 0) {
    int err = errno;
    ::unlink(data_path.c_str());
    return fail_all(ErrnoStatus(err, "creating " + tmp_path));
  }
  FileHandle meta_file(meta_fd);
  // The metadata is padded to 4 KiB by the writer's aligned bounce area (O_DIRECT); its header
  // records its true length.
  writer.Put(meta_fd, 0, std::as_bytes(std::span(encoded.data(), encoded.size())), 1);
  failures = writer.Flush();
  if (failures.empty() && ctx_.sync_writes && ::fdatasync(meta_fd) != 0) failures.emplace(1, errno);
  if (failures.empty() && ::rename(tmp_path.c_str(), meta_path.c_str()) != 0) failures.emplace(1, errno);
  if (failures.empty() && ctx_.sync_writes) {
    if (int err = SyncDirectory(dir_); err != 0) failures.emplace(1, err);
  }
  if (!failures.empty()) {
    ::unlink(tmp_path.c_str());
    ::unlink(meta_path.c_str());  // renamed already when only the directory sync failed
    ::unlink(data_path.c_str());
    return fail_all(ErrnoStatus(failures.begin()->second, "writing bucket metadata " + meta_path));
  }
  const uint64_t meta_bytes = AlignUp(encoded.size());
  for (size_t i = begin; i < end; ++i) {
    const BucketEntry& e = meta.entries[i - begin];
    uint64_t slot = i - begin;
    out->placements[i] = Placement{id, BucketLocation(id, slot), e.offset,
                                   AlignUp(e.size) + kBucketEntryBytes + e.key.size(),
                                   static_cast<uint32_t>(slot)};
  }
  out->units.push_back(WrittenUnit{id, meta.data_bytes + meta_bytes});
}

Result<LayoutRecovery> BucketLayout::Recover() {
  LayoutRecovery rec;
  auto problem = [&](std::string what) {
    if (rec.report.problems.size() < 100) rec.report.problems.push_back(std::move(what));
  };
  std::lock_guard lock(tomb_mu_);  // alone here (Open), but tombs_ is the mutex's
  // Without its tombstones the store would serve removed copies: unreadable, it does not open.
  TombScan tombs;
  if (Status st = ReadTombsLocked(&tombs); !st.ok()) return st;
  bool deleted_removed = false;  // a bucket whose every copy was removed
  // id -> (has data, has meta)
  std::map<uint64_t, std::pair<bool, bool>> seen;
  uint64_t max_id = tombs.max_bucket;  // an id a tombstone names is never reused
  std::error_code ec;
  // increment(ec), not a range-for: the latter's ++ throws, and no exception leaves this library.
  std::filesystem::directory_iterator it(dir_, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::filesystem::directory_entry& dirent = *it;
    const std::string name = dirent.path().filename().string();
    uint64_t id = 0;
    char suffix[16] = {0};
    if (name.size() < 17 || std::sscanf(name.c_str(), "%16" SCNx64 "%15s", &id, suffix) != 2) continue;
    std::string ext(suffix);
    max_id = std::max(max_id, id);
    if (ext == ".meta.tmp") {
      problem("bucket " + name + ": metadata never completed (crash mid-write), deleted");
      rec.report.units_discarded++;
      ::unlink(dirent.path().c_str());
    } else if (ext == ".data") {
      seen[id].first = true;
    } else if (ext == ".meta") {
      seen[id].second = true;
    }
  }
  if (ec) return Status(ErrorCode::INVALID_PARAMS, "cannot list " + dir_ + ": " + ec.message());
  next_id_ = max_id + 1;

  for (const auto& [id, files] : seen) {
    const std::string data_path = DataPath(id), meta_path = MetaPath(id);
    auto discard = [&](const std::string& why) {
      problem("bucket " + Name(id) + ": " + why + ", discarded");
      rec.report.units_discarded++;
      struct stat st{};
      if (::stat(data_path.c_str(), &st) == 0) rec.report.bytes_discarded += st.st_size;
      ::unlink(meta_path.c_str());
      ::unlink(data_path.c_str());
    };
    if (!files.second) {
      discard("data without metadata (crash mid-write)");
      continue;
    }
    if (!files.first) {
      discard("metadata without its data file");
      continue;
    }
    struct stat data_st{}, meta_st{};
    if (::stat(data_path.c_str(), &data_st) != 0 || ::stat(meta_path.c_str(), &meta_st) != 0) {
      discard("cannot stat its files");
      continue;
    }
    if (static_cast<uint64_t>(meta_st.st_size) > kMaxMetaBytes) {
      discard("metadata file larger than any bucket's");
      continue;
    }
    std::string bytes(static_cast<size_t>(meta_st.st_size), '\0');
    int fd = ::open(meta_path.c_str(), O_RDONLY | O_CLOEXEC);
    ssize_t got = fd < 0 ? -1 : ::pread(fd, bytes.data(), bytes.size(), 0);
    if (fd >= 0) ::close(fd);
    if (got != static_cast<ssize_t>(bytes.size())) {
      discard("metadata unreadable");
      continue;
    }
    auto meta = DecodeBucketMeta(std::as_bytes(std::span(bytes.data(), bytes.size())), ctx_.salt);
    if (!meta.ok()) {
      discard(meta.status().message());
      continue;
    }
    if (meta->bucket_id != id || meta->entries.size() >= (1ull << kSlotBits)) {
      discard("metadata names another bucket");
      continue;
    }
    if (static_cast<uint64_t>(data_st.st_size) < meta->data_bytes) {
      discard("data file truncated (" + std::to_string(data_st.st_size) + " of " +
              std::to_string(meta->data_bytes) + " bytes)");
      continue;
    }
    // A tombstone applies only to the copy it names: same slot, generation and key.
    std::vector<bool> removed(meta->entries.size(), false);
    std::vector<Tombstone> applied;
    if (auto t = tombs.by_bucket.find(id); t != tombs.by_bucket.end()) {
      for (const Tombstone& tomb : t->second) {
        if (tomb.slot >= meta->entries.size() || removed[tomb.slot]) continue;
        const BucketEntry& e = meta->entries[tomb.slot];
        if (e.gen != tomb.gen || TombstoneKeyHash(e.key, ctx_.salt) != tomb.key_hash) continue;
        removed[tomb.slot] = true;
        applied.push_back(tomb);
      }
    }
    if (applied.size() == meta->entries.size()) {
      // Every copy removed: finish deleting it (metadata first), which also retires its tombstones.
      if (::unlink(meta_path.c_str()) == 0 || errno == ENOENT) {
        ::unlink(data_path.c_str());
        deleted_removed = true;
        continue;
      }
      tomb_live_ += applied.size();  // still on disk: its tombstones stay
      tombs_[id] = std::move(applied);
      continue;
    }
    RecoveredUnit unit;
    unit.unit_id = id;
    // What the data file holds on disk: the values eviction punched out of it no longer count.
    uint64_t data_bytes = std::min(static_cast<uint64_t>(data_st.st_size),
                                   static_cast<uint64_t>(data_st.st_blocks) * 512);
    if (ctx_.evict_copies && punches_holes_ && !applied.empty()) {
      // More than its live values: copies tombstoned but never punched (a crash in between, or
      // a remove the store had not reclaimed yet). Their tombstones are read back: punched now.
      uint64_t live_bytes = 0;
      std::vector<ValueRange> dead;
      for (size_t slot = 0; slot < meta->entries.size(); ++slot) {
        const BucketEntry& e = meta->entries[slot];
        if (removed[slot]) {
          dead.push_back(ValueRange{e.offset, AlignUp(e.size)});
        } else {
          live_bytes += AlignUp(e.size);
        }
      }
      if (data_bytes > live_bytes && ReleaseSpace(id, dead) > 0 && ::stat(data_path.c_str(), &data_st) == 0) {
        data_bytes = std::min(static_cast<uint64_t>(data_st.st_size),
                              static_cast<uint64_t>(data_st.st_blocks) * 512);
      }
    }
    unit.bytes = data_bytes + static_cast<uint64_t>(meta_st.st_size);
    for (size_t slot = 0; slot < meta->entries.size(); ++slot) {
      if (removed[slot]) continue;
      BucketEntry& e = meta->entries[slot];
      uint64_t length = AlignUp(e.size) + kBucketEntryBytes + e.key.size();
      unit.objects.push_back(RecoveredObject{std::move(e.key), e.gen, e.size, e.checksum,
                                             Placement{id, BucketLocation(id, slot), e.offset, length,
                                                       static_cast<uint32_t>(slot)}});
    }
    rec.units.push_back(std::move(unit));
    if (!applied.empty()) {
      tomb_live_ += applied.size();
      tombs_[id] = std::move(applied);
    }
  }

  if (tombs.torn_tail) problem("tombstone log: a torn record at its end (crash mid-append) ignored");
  if (tombs.damaged > 0) problem("tombstone log: " + std::to_string(tombs.damaged) + " damaged record(s) ignored");
  // Those deletions go to disk before the rewrite below drops their tombstones.
  if (deleted_removed) (void)SyncDirectory(dir_);
  tomb_end_ = tombs.file_bytes / kTombstoneBytes * kTombstoneBytes;
  if (tombs.torn_tail || tombs.damaged > 0 || tomb_live_ != tombs.valid) {
    // Only what still applies is kept; the rewrite also drops a torn tail.
    if (Status st = RewriteTombsLocked(); !st.ok()) {
      // The old log stays: every tombstone in it still applies only to its own copy.
      GLOG_WARN("disk tier: {} (kept as it is)", st.ToString());
      problem("tombstone log not compacted: " + st.message());
    }
  }
  ReserveTombsLocked(0);
  return rec;
}

}  // namespace

Result<std::unique_ptr<Layout>> MakeBucketLayout(LayoutContext ctx) {
  auto layout = std::make_unique<BucketLayout>(std::move(ctx));
  if (Status st = layout->Init(); !st.ok()) return st;
  return std::unique_ptr<Layout>(std::move(layout));
}

}  // namespace granary::disk
