// tests/tools/chaos_worker.h - the load of the chaos test (tests/integration/chaos_test.cc): one
// client process doing puts, upserts, gets, batch gets and removes until told to stop, verifying
// every byte it reads (tests/tools/chaos_value.h).
//
// Keys: "chaos/<id>/k<j>" for j < keys. A worker writes only its own keys, each from one thread
// (j % threads), so it knows every version it attempted and, per key, the oldest version a read
// may still return (after an upsert of v answered OK: v; after a remove answered OK: the next
// version). It reads its own keys and those of the workers named in read_ids.
//
// Files in `dir`, written with one write(2) per line so a SIGKILL loses nothing already done:
//   <id>.attempts  "P <ms> <key> <version> <length> <replicas> <op>" before a put starts, and
//                  "E <ms> <key> <version> <code>" once it returned (code 0: OK). A P without
//                  its E means the put was in flight when the process died. And
//                  "R <ms> <key> <code>" once a remove of the key returned.
//   <id>.reads     "G <key> <version> <length>": each (key, version) this worker read and
//                  verified, once. The test checks every one against all workers' P lines.
//   <id>.wrong     one report per read that returned OK with wrong bytes, a version never
//                  attempted, or a stale version (at most 20).
//   <id>.diag      what was found at the replicas' offsets after a CHECKSUM_MISMATCH (read
//                  straight from the node's /dev/shm file, after the fact; at most 10).
// Stops when <dir>/stop exists or `seconds` have passed; prints one "CHAOS-SUMMARY ..." line.
// Exit: 0, or 4 when any read was wrong, 3 when the master could not be reached at the start.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace granary::chaos {

struct WorkerOptions {
  std::string master;
  std::string id;
  std::string dir;
  std::vector<std::string> read_ids;  // other workers whose keys are read too
  int seconds = 60;
  int threads = 2;
  int keys = 32;
  uint64_t seed = 1;
  bool use_shm = true;
  uint32_t min_size = 4 << 10;
  uint32_t max_size = 8 << 20;
};

int RunWorker(const WorkerOptions& options);

}  // namespace granary::chaos
