// disk/layout_common.cc - helpers the three layouts share.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "disk/layout.h"

namespace granary::disk {

int OpenStoreFile(const LayoutContext& ctx, const std::string& path, int flags) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC | (ctx.direct_io ? O_DIRECT : 0), 0644);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

int SyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

Status ErrnoStatus(int err, std::string_view what, ErrorCode otherwise) {
  ErrorCode code = (err == ENOSPC || err == EDQUOT) ? ErrorCode::NO_AVAILABLE_HANDLE : otherwise;
  std::string message(what);
  message += ": ";
  message += std::strerror(err);
  if (code == ErrorCode::NO_AVAILABLE_HANDLE) message += " (disk full)";
  return Status(code, std::move(message));
}

bool PunchesHoles(const std::string& dir) {
  struct statvfs fs{};
  if (::statvfs(dir.c_str(), &fs) != 0 || fs.f_frsize == 0 || fs.f_frsize > kBlockSize) return false;
  const std::string probe = dir + "/hole-probe.tmp";
  int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  FileHandle file(fd);
  const std::string block(2 * kBlockSize, 'x');
  const bool punches = ::pwrite(fd, block.data(), block.size(), 0) == static_cast<ssize_t>(block.size()) &&
                       ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                                   static_cast<off_t>(kBlockSize)) == 0;
  ::unlink(probe.c_str());
  return punches;
}

}  // namespace granary::disk
