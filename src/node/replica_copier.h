// node/replica_copier.h - the node's part of re-replication (docs/operations.md): it asks the
// master for copies to make into its own segment (ReplicaCopyStart), copies each from another
// node's memory over TCP (under the read capability the master signed) or from a disk copy
// (DISK_READ, any node's, this one's included), and reports every outcome (ReplicaCopyEnd).
//
// Promise: a copy is reported copied only when (1) the bytes read hash to the object's checksum
// and (2) they were written into the memory whose header carries the token the target was
// allocated under, looked up just before the write: a copy a remount overtakes lands in the
// retired memory, which no mount names again (as promotions, node/disk_tier.h). Rounds are serial
// and numbered from 1 per process; the master ends what an earlier round did not report, so
// after a lost ReplicaCopyEnd nothing is left allocated past the next round.
// Reads go into a private buffer first, then one memcpy into the segment: a source that fails
// its checksum never touches the segment at all.
// Ownership: owns its thread and its TCP transport; the segment source and the master locator
// are the node's and outlive it.
// Thread safety: Start and Stop from the owner; counters from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "client/master_locator.h"
#include "granary/proto/master.pb.h"
#include "node/shm_segment.h"
#include "transfer/tcp_transport.h"

namespace granary::node {

struct ReplicaCopierOptions {
  std::string node_id;
  int64_t interval_ms = 1000;  // between rounds while the master has nothing to copy
  int rpc_timeout_ms = 5000;
  uint32_t max_keys = 64;      // copies asked for per round
};

class ReplicaCopier {
 public:
  using SegmentSource = std::function<std::shared_ptr<ShmSegment>()>;
  ReplicaCopier(ReplicaCopierOptions options, SegmentSource segment,
                client::MasterLocator* master);
  ~ReplicaCopier();
  ReplicaCopier(const ReplicaCopier&) = delete;
  ReplicaCopier& operator=(const ReplicaCopier&) = delete;

  void Start();
  void Stop();

  uint64_t copied_objects() const { return copied_.load(); }  // attached by the master
  uint64_t copied_bytes() const { return copied_bytes_.load(); }
  uint64_t failed_copies() const { return failed_.load(); }  // no source gave the right bytes

 private:
  void Loop();
  // One round; returns whether the master has more waiting.
  bool Round(uint64_t round);
  // Reads item's bytes from any of its sources into buf (checked); OK or why none worked.
  Status Fetch(const proto::ReplicaCopyItem& item, std::vector<std::byte>& buf);

  ReplicaCopierOptions options_;
  SegmentSource segment_;
  client::MasterLocator* master_;
  transfer::TcpTransport tcp_;
  std::atomic<uint64_t> copied_{0}, copied_bytes_{0}, failed_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace granary::node
