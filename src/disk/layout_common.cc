// disk/layout_common.cc - helpers the three layouts share.
#include <fcntl.h>
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

}  // namespace granary::disk
