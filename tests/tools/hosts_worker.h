// tests/tools/hosts_worker.h - the client side of the several-hosts test (tests/hosts/hosts_test.sh),
// run inside one "host" (network, mount and UTS namespaces of its own) by granary-test-worker.
//
//   objects put|get: puts or gets objects "<prefix>/<j>" for j < objects, each of a size between
//     min_size and max_size that follows from its key, filled with test_pattern.h's bytes for its
//     key, so a reader in another process (another host) knows what it must read. A put asks for
//     `replicas` memory replicas and then checks with Stat that each object has that many, on
//     distinct segments. A get compares every byte. Both print, one per line:
//       "placement <segment> <replicas>"  (put only) replicas per segment
//       "digest <16 hex>"                 FNV-1a of every object's bytes, in key order: the bytes
//                                         put and the bytes got, so the test compares the two
//       "stats shm_written=.. shm_read=.. tcp_written=.. tcp_read=.. shm_mappings=.. maps_shm=0|1
//        bytes=.. seconds=.."             this client's transports (ClientStats), whether a
//                                         /dev/shm/granary-* file is mapped into the process, the
//                                         object bytes moved and the wall time of the puts or gets
//     Exit: 0, 3 a call failed, 4 wrong bytes (or sizes, or replica placement).
//   objects stat: only the put's placement check and its "placement" lines, for objects put
//     before (e.g. waiting until re-replication restored `replicas`).
//   rtt: `count` TCP connects to endpoint HOST:PORT, each timed from connect(2) to the handshake's
//     end (one round trip); prints "rtt_ms min=.. median=.. max=..". Exit 3 if a connect fails.
#pragma once

#include <cstdint>
#include <string>

namespace granary::hosts {

struct ObjectsOptions {
  std::string master;
  std::string prefix = "hosts";
  enum class Mode { kPut, kGet, kStat } mode = Mode::kGet;
  size_t objects = 32;
  uint64_t min_size = 64 << 10;
  uint64_t max_size = 1 << 20;
  uint32_t replicas = 1;
  size_t batch = 8;  // keys per BatchPut / BatchGetInto
  bool use_shm = true;
};

int RunObjects(const ObjectsOptions& options);
int RunConnectRtt(const std::string& endpoint, int count);
// Whether this process maps a granary segment from /dev/shm (a same-host client's reads do).
bool MapsSharedSegment();

}  // namespace granary::hosts
