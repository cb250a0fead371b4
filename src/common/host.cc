#include "common/host.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>

namespace granary {

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::string HostId() {
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  // Which /dev/shm: each container gets its own tmpfs (another device) unless it shares the
  // host's IPC (--ipc=host), and then the two can map each other's segments for real.
  std::string shm = "noshm";
  struct stat st {};
  if (stat("/dev/shm", &st) == 0) {
    shm = "shm" + std::to_string(static_cast<uint64_t>(st.st_dev)) + "." +
          std::to_string(static_cast<uint64_t>(st.st_ino));
  }
  return Hostname() + "/" + boot_id + "/" + shm;
}

uint64_t RandomU64() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

std::string ProcessStartTag() {
  static const std::string tag = [] {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%06x", static_cast<uint32_t>(RandomU64() & 0xffffff));
    return std::string(hex);
  }();
  return tag;
}

std::string UniqueProcessId(const std::string& prefix) {
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "%08x", static_cast<uint32_t>(RandomU64()));
  return prefix + "-" + Hostname() + "-" + std::to_string(getpid()) + "-" + suffix;
}

}  // namespace granary
