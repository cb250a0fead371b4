// Helpers shared by the disk tier's tests: temporary directories under /tmp, deterministic values,
// finding where a value's bytes landed in the directory (to corrupt or truncate them), and making
// a store's own descriptor of a file refuse writes (to fail its I/O on purpose).
#pragma once

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "disk/disk_store.h"

namespace granary::disk::testing {

// A fresh directory under /tmp, removed (after unmounting anything mounted on it) at scope end.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/granary-disk-test-XXXXXX";
    char* made = ::mkdtemp(tmpl);
    path_ = made ? made : "";
  }
  ~TempDir() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Mounts a filesystem of `type` (tmpfs, ramfs) here; false (errno kept) when not allowed.
  bool Mount(const char* type, const std::string& data, unsigned long flags = 0) {
    if (::mount(type, path_.c_str(), type, flags, data.empty() ? nullptr : data.c_str()) != 0) return false;
    mounted_ = true;
    return true;
  }

 private:
  std::string path_;
  bool mounted_ = false;
};

// Bytes of the object (key, gen): a function of both, so any mix-up shows.
inline std::vector<std::byte> ValueFor(const std::string& key, uint64_t gen, size_t size) {
  std::vector<std::byte> out(size);
  uint64_t x = std::hash<std::string>{}(key) ^ (gen * 0x9E3779B97F4A7C15ull) ^ size;
  for (size_t i = 0; i < size; i += 8) {  // xorshift64, a word at a time
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, std::min<size_t>(8, size - i));
  }
  return out;
}

struct FoundBytes {
  std::string path;
  uint64_t offset;
};

// The file and offset where `value` starts (its first 256 bytes, at a 4 KiB-aligned offset).
inline std::optional<FoundBytes> FindValue(const std::string& dir, const std::vector<std::byte>& value) {
  const size_t probe = std::min<size_t>(256, value.size());
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::vector<char> block(4096);
    for (uint64_t off = 0; in.read(block.data(), 4096) || in.gcount() > 0; off += 4096) {
      if (static_cast<size_t>(in.gcount()) >= probe && std::memcmp(block.data(), value.data(), probe) == 0) {
        return FoundBytes{e.path().string(), off};
      }
      if (in.gcount() < 4096) break;
    }
  }
  return std::nullopt;
}

inline void FlipByte(const FoundBytes& at, uint64_t delta) {
  std::fstream f(at.path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at.offset + delta));
  char c = 0;
  f.read(&c, 1);
  c ^= 0x5A;
  f.seekp(static_cast<std::streamoff>(at.offset + delta));
  f.write(&c, 1);
}

// While it lives, every descriptor of this process open on `path` is a read-only one of the same
// file: writes through it fail (EBADF), reads still work. Restored at scope end.
class ReadOnlyFds {
 public:
  explicit ReadOnlyFds(const std::string& path) {
    std::error_code ec;
    const auto target = std::filesystem::canonical(path, ec);
    if (ec) return;
    std::vector<int> fds;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      std::error_code link_ec;
      if (std::filesystem::read_symlink(it->path(), link_ec) == target && !link_ec) {
        fds.push_back(std::stoi(it->path().filename().string()));
      }
    }
    for (int fd : fds) {
      int saved = ::dup(fd);
      int read_only = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (saved < 0 || read_only < 0 || ::dup2(read_only, fd) < 0) continue;
      ::close(read_only);
      swapped_.emplace_back(fd, saved);
    }
  }
  ~ReadOnlyFds() {
    for (auto [fd, saved] : swapped_) {
      ::dup2(saved, fd);
      ::close(saved);
    }
  }
  ReadOnlyFds(const ReadOnlyFds&) = delete;
  ReadOnlyFds& operator=(const ReadOnlyFds&) = delete;
  size_t count() const { return swapped_.size(); }

 private:
  std::vector<std::pair<int, int>> swapped_;  // (the store's fd, a dup of its original)
};

}  // namespace granary::disk::testing
