// disk/file_layout.cc - the file-per-key backend: one file per object.
//
// File <dir>/objects/<aa>/<bb>/<id>.obj, where <id> is 16 hex digits from one increasing sequence
// (creation order) and aa, bb are two bytes of a hash of the id: a two-level tree of at most
// 65,536 directories keeps each one small. The file is one record (record_format.h): header and
// key padded to 4 KiB, then the value padded to 4 KiB, so reads of the value are aligned. It is
// written as <id>.obj.tmp and renamed once complete: a crash leaves a .tmp, which recovery
// deletes, and a record whose header is bad or whose file is shorter than its header says
// (truncated) is discarded too. Removing a copy deletes its file; while a read still uses the
// file, its header block is zeroed first, so that the file, deleted later, cannot come back at
// recovery meanwhile (recovery deletes such a file without reporting it torn).
//
// Location: tag 2 in bits 60..63 | the file's id in bits 0..59.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <filesystem>

#include "disk/layout.h"
#include "disk/record_format.h"
#include "disk/staged_writer.h"

namespace granary::disk {

namespace {

constexpr uint64_t kIdMask = (1ull << kTagShift) - 1;
constexpr size_t kFilesPerFlush = 64;  // bounds the descriptors a batch holds open at once

class FileLayout final : public Layout {
 public:
  explicit FileLayout(LayoutContext ctx) : ctx_(std::move(ctx)), root_(ctx_.dir + "/objects") {}

  Status Init() {
    std::error_code ec;
    std::filesystem::create_directories(root_, ec);
    if (ec) return Status(ErrorCode::INVALID_PARAMS, "cannot create " + root_ + ": " + ec.message());
    return Status::Ok();
  }

  DiskBackend kind() const override { return DiskBackend::kFilePerKey; }

  uint64_t Footprint(uint32_t key_len, uint64_t size) const override {
    return RecordPrefixBytes(key_len) + AlignUp(size);
  }

  LayoutWrite Write(std::span<const PreparedObject> objects) override {
    LayoutWrite out;
    out.placements.assign(objects.size(), Result<Placement>(ErrorCode::INTERNAL_ERROR, "unwritten"));
    for (size_t begin = 0; begin < objects.size(); begin += kFilesPerFlush) {
      WriteSome(objects, begin, std::min(objects.size(), begin + kFilesPerFlush), &out);
    }
    return out;
  }

  Result<LayoutRecovery> Recover() override;

  Status CheckLocation(uint64_t location) const override {
    if ((location & kTagMask) >> kTagShift != kTagFile || (location & kIdMask) == 0) {
      char b[24];
      std::snprintf(b, sizeof(b), "0x%016" PRIx64, location);
      return Status(ErrorCode::INVALID_PARAMS, std::string("disk location ") + b + " is not a file location");
    }
    return Status::Ok();
  }

  Result<std::shared_ptr<FileHandle>> OpenUnit(uint64_t unit_id) override {
    const std::string path = PathOf(unit_id);
    int fd = OpenStoreFile(ctx_, path, O_RDONLY);
    if (fd < 0) {
      int err = errno;
      if (err == ENOENT) {
        return Result<std::shared_ptr<FileHandle>>(ErrorCode::OBJECT_NOT_FOUND, "object file " + path + " is missing");
      }
      return ErrnoStatus(err, "opening " + path, ErrorCode::INVALID_READ);
    }
    return std::make_shared<FileHandle>(fd);
  }
  bool CacheHandles() const override { return false; }

  Status Destroy(uint64_t unit_id) override {
    if (::unlink(PathOf(unit_id).c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, "deleting " + PathOf(unit_id));
    }
    if (ctx_.sync_writes) {
      if (int err = SyncDirectory(DirOf(unit_id)); err != 0) return ErrnoStatus(err, "syncing " + DirOf(unit_id));
    }
    return Status::Ok();
  }

  // Zeroes the header block in place: a read in flight reads the value, after it.
  Status Forget(std::span<const ForgottenCopy> copies) override {
    Status first = Status::Ok();
    for (const ForgottenCopy& c : copies) {
      const std::string path = PathOf(c.placement.unit_id);
      int fd = OpenStoreFile(ctx_, path, O_WRONLY);
      if (fd < 0) {
        if (errno != ENOENT && first.ok()) first = ErrnoStatus(errno, "opening " + path);
        continue;  // ENOENT: already deleted
      }
      FileHandle file(fd);
      StagedWriter writer(*ctx_.io);
      static const std::array<std::byte, 1> kZero{};
      writer.Put(fd, 0, kZero, 0);  // one zero byte, padded: a whole zero block
      auto failures = writer.Flush();
      int err = failures.empty() ? 0 : failures.begin()->second;
      if (err == 0 && ctx_.sync_writes && ::fdatasync(fd) != 0) err = errno;
      if (err != 0 && first.ok()) first = ErrnoStatus(err, "clearing the header of " + path);
    }
    return first;
  }

 private:
  std::string DirOf(uint64_t id) const {
    uint64_t h = XXH3_64bits(&id, sizeof(id));
    char b[16];
    std::snprintf(b, sizeof(b), "/%02x/%02x", static_cast<unsigned>(h & 0xFF), static_cast<unsigned>((h >> 8) & 0xFF));
    return root_ + b;
  }
  std::string PathOf(uint64_t id) const {
    char b[24];
    std::snprintf(b, sizeof(b), "/%016" PRIx64 ".obj", id);
    return DirOf(id) + b;
  }

  void WriteSome(std::span<const PreparedObject> objects, size_t begin, size_t end, LayoutWrite* out);

  LayoutContext ctx_;
  std::string root_;
  std::atomic<uint64_t> next_id_{1};
};

void FileLayout::WriteSome(std::span<const PreparedObject> objects, size_t begin, size_t end,
                           LayoutWrite* out) {
  struct Pending {
    size_t index;
    uint64_t id;
    std::unique_ptr<FileHandle> file;
    std::string prefix;
  };
  std::vector<Pending> pending;
  StagedWriter writer(*ctx_.io);
  for (size_t i = begin; i < end; ++i) {
    const PreparedObject& o = objects[i];
    const uint64_t id = next_id_.fetch_add(1);
    const std::string dir = DirOf(id), tmp = PathOf(id) + ".tmp";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    int fd = ec ? -1 : OpenStoreFile(ctx_, tmp, O_WRONLY | O_CREAT | O_EXCL);
    if (fd < 0) {
      out->placements[i] = ErrnoStatus(ec ? ec.value() : errno, "creating " + tmp);
      continue;
    }
    RecordHeader h{static_cast<uint32_t>(o.key.size()), static_cast<uint32_t>(o.value.size()), o.gen,
                   o.checksum, id};
    Pending p{i, id, std::make_unique<FileHandle>(fd), EncodeRecordPrefix(h, o.key, ctx_.salt)};
    const uint32_t tag = static_cast<uint32_t>(i);
    writer.Put(fd, 0, std::as_bytes(std::span(p.prefix.data(), p.prefix.size())), tag);
    writer.Put(fd, RecordPrefixBytes(h.key_len), o.value, tag);
    pending.push_back(std::move(p));
  }
  auto failures = writer.Flush();
  for (auto& p : pending) {
    const PreparedObject& o = objects[p.index];
    const std::string path = PathOf(p.id), tmp = path + ".tmp";
    int err = 0;
    if (auto f = failures.find(static_cast<uint32_t>(p.index)); f != failures.end()) err = f->second;
    if (!err && ctx_.sync_writes && ::fdatasync(p.file->fd) != 0) err = errno;
    p.file.reset();
    if (!err && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
    if (!err && ctx_.sync_writes) err = SyncDirectory(DirOf(p.id));
    if (err) {
      ::unlink(tmp.c_str());
      ::unlink(path.c_str());  // renamed already when only the directory sync failed
      out->placements[p.index] = ErrnoStatus(err, "writing " + path);
      continue;
    }
    const uint64_t prefix = RecordPrefixBytes(static_cast<uint32_t>(o.key.size()));
    const uint64_t length = prefix + AlignUp(o.value.size());
    out->placements[p.index] = Placement{p.id, (kTagFile << kTagShift) | p.id, prefix, length};
    out->units.push_back(WrittenUnit{p.id, length});
  }
}

Result<LayoutRecovery> FileLayout::Recover() {
  LayoutRecovery rec;
  auto problem = [&](std::string what) {
    if (rec.report.problems.size() < 100) rec.report.problems.push_back(std::move(what));
  };
  uint64_t max_id = 0;
  std::error_code ec;
  AlignedBuffer head(RecordPrefixBytes(kMaxKeyBytes));
  std::filesystem::recursive_directory_iterator it(root_, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (it.depth() != 2 || !it->is_regular_file(ec)) continue;
    const std::string path = it->path().string();
    const std::string name = it->path().filename().string();
    uint64_t id = 0;
    char suffix[16] = {0};
    if (name.size() < 17 || std::sscanf(name.c_str(), "%16" SCNx64 "%15s", &id, suffix) != 2) continue;
    max_id = std::max(max_id, id & kIdMask);
    auto discard = [&](const std::string& why) {
      problem("object file " + path + ": " + why + ", discarded");
      rec.report.units_discarded++;
      struct stat st{};
      if (::stat(path.c_str(), &st) == 0) rec.report.bytes_discarded += st.st_size;
      ::unlink(path.c_str());
    };
    if (std::string(suffix) == ".obj.tmp") {
      discard("never completed (crash mid-write)");
      continue;
    }
    if (std::string(suffix) != ".obj") continue;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st{};
    ssize_t got = fd < 0 ? -1 : ::pread(fd, head.data(), head.size(), 0);
    if (fd >= 0 && ::fstat(fd, &st) != 0) got = -1;
    if (fd >= 0) ::close(fd);
    // A header block of zeros: a removed copy whose file a crash kept from being deleted.
    if (got >= static_cast<ssize_t>(kBlockSize) &&
        std::all_of(head.data(), head.data() + kBlockSize, [](std::byte b) { return b == std::byte{0}; })) {
      ::unlink(path.c_str());
      continue;
    }
    std::string key;
    auto h = got <= 0 ? std::nullopt
                      : DecodeRecordPrefix(std::span<const std::byte>(head.data(), static_cast<size_t>(got)),
                                           ctx_.salt, &key);
    if (!h || h->unit_id != id || id == 0 || id > kIdMask) {
      discard("no valid record header");
      continue;
    }
    const uint64_t prefix = RecordPrefixBytes(h->key_len);
    const uint64_t length = prefix + AlignUp(h->value_len);
    if (static_cast<uint64_t>(st.st_size) < length) {
      discard("truncated (" + std::to_string(st.st_size) + " of " + std::to_string(length) + " bytes)");
      continue;
    }
    RecoveredUnit unit{id, static_cast<uint64_t>(st.st_size), {}};
    unit.objects.push_back(RecoveredObject{std::move(key), h->gen, h->value_len, h->value_checksum,
                                           Placement{id, (kTagFile << kTagShift) | id, prefix, length}});
    rec.units.push_back(std::move(unit));
  }
  if (ec) return Status(ErrorCode::INVALID_PARAMS, "cannot list " + root_ + ": " + ec.message());
  next_id_ = max_id + 1;
  return rec;
}

}  // namespace

Result<std::unique_ptr<Layout>> MakeFileLayout(LayoutContext ctx) {
  auto layout = std::make_unique<FileLayout>(std::move(ctx));
  if (Status st = layout->Init(); !st.ok()) return st;
  return std::unique_ptr<Layout>(std::move(layout));
}

}  // namespace granary::disk
