#include "common/host.h"

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
  return Hostname() + "/" + boot_id;
}

uint64_t RandomU64() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

std::string UniqueProcessId(const std::string& prefix) {
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "%08x", static_cast<uint32_t>(RandomU64()));
  return prefix + "-" + Hostname() + "-" + std::to_string(getpid()) + "-" + suffix;
}

}  // namespace granary
