// Test helper: how much of one of this process's mappings is resident, from /proc/self/smaps.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace granary::testdata {

// The resident bytes ("Rss") of this process's mapping that contains `addr`; 0 if none does.
inline uint64_t MappedResidentBytes(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  const auto target = reinterpret_cast<uintptr_t>(addr);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long start = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> start >> dash >> end && dash == '-' && line.find(':') > line.find(' ')) {
      inside = start <= target && target < end;  // a mapping's header line
      continue;
    }
    if (inside && line.rfind("Rss:", 0) == 0) {
      std::istringstream fields(line.substr(4));
      uint64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

}  // namespace granary::testdata
