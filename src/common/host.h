// common/host.h - facts about this host and process that segments and clients are named by.
#pragma once

#include <cstdint>
#include <string>

namespace granary {

std::string Hostname();
// Same for every process that sees the same /dev/shm on this host and boot, different elsewhere:
// hostname + kernel boot id + the device and inode of /dev/shm. Two containers on one machine
// differ by hostname or, when they share a hostname, by their /dev/shm (unless they share it
// for real), so they neither try each other's shm nor match the master's takeover rule
// (host id + shm name + another token) for each other's segments.
std::string HostId();
// 6 random hex digits drawn once per process: default segment names carry it, so two processes
// with the same pid (containers, pid namespaces) never pick the same default name.
std::string ProcessStartTag();
// 64 random bits from the OS.
uint64_t RandomU64();
// "<prefix>-<hostname>-<pid>-<8 hex>": unique per process start.
std::string UniqueProcessId(const std::string& prefix);

}  // namespace granary
