// Process limits for the data plane's load tests: how many threads the process runs (to show a
// server takes no thread per connection) and raising RLIMIT_NOFILE for a thousand sockets.
#pragma once

#include <sys/resource.h>

#include <fstream>
#include <string>

namespace granary::testing {

// The "Threads:" line of /proc/self/status; -1 when unreadable.
inline int ThreadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// Raises the soft descriptor limit towards `wanted` (up to the hard limit); true if it allows it.
inline bool EnsureDescriptors(rlim_t wanted) {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) return false;
  if (files.rlim_cur >= wanted) return true;
  files.rlim_cur = files.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, files.rlim_max);
  return setrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur >= wanted;
}

}  // namespace granary::testing
