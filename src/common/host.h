// common/host.h - facts about this host and process that segments and clients are named by.
#pragma once

#include <cstdint>
#include <string>

namespace granary {

std::string Hostname();
// Same for every process on this host and boot, different elsewhere: hostname + kernel boot id.
// Two containers on one machine differ by hostname, so they do not try each other's shm.
std::string HostId();
// 64 random bits from the OS.
uint64_t RandomU64();
// "<prefix>-<hostname>-<pid>-<8 hex>": unique per process start.
std::string UniqueProcessId(const std::string& prefix);

}  // namespace granary
