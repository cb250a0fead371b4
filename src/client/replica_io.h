// client/replica_io.h - moves one object's bytes to or from one replica, by the cheapest path:
// a memcpy through the segment's shared memory when it is on this host, else TCP.
//
// Promise: Write stores the parts back to back at the replica's range; Read fills the
// destination parts in order and returns the XXH3 checksum of what it read, which the caller
// compares with the object's. Never touches bytes outside the replica's range (checked against
// the mapped segment's size too). A failed shared-memory attach falls back to TCP.
// Thread safety: any thread; the mapping cache and the transport are shared and thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/segment_directory.h"
#include "common/checksum.h"
#include "granary/client.h"
#include "granary/proto/master.pb.h"
#include "transfer/shm_mapping.h"
#include "transfer/tcp_transport.h"

namespace granary::client {

class ReplicaIo {
 public:
  ReplicaIo(SegmentDirectory* directory, transfer::ShmMappingCache* mappings,
            transfer::TcpTransport* tcp, bool use_shared_memory)
      : directory_(directory), mappings_(mappings), tcp_(tcp), use_shm_(use_shared_memory) {}

  bool IsLocal(const proto::Replica& replica);
  // The replica's bytes in this process: the mapping stays alive while the view is held.
  struct LocalView {
    std::shared_ptr<transfer::ShmMapping> mapping;
    std::byte* bytes = nullptr;
  };
  // With `checksum`, also hashes the bytes: while copying them on the shared-memory path (they
  // are in cache right then), after sending them over TCP.
  Status Write(const proto::Replica& replica, const std::vector<ByteSpan>& parts,
               ChecksumStream* checksum = nullptr);
  Result<uint64_t> Read(const proto::Replica& replica, const std::vector<MutableByteSpan>& dst);
  ClientStats Stats() const;

 private:
  // The replica's bytes in this process's address space, or an empty view to use TCP.
  LocalView MapLocal(const proto::Replica& replica);

  SegmentDirectory* directory_;
  transfer::ShmMappingCache* mappings_;
  transfer::TcpTransport* tcp_;
  bool use_shm_;
  // The token each mapped name had: a node restarted under the same name has a new token and a
  // new shm object, and the stale mapping must not be written to.
  std::mutex tokens_mu_;
  std::unordered_map<std::string, uint64_t> mapped_tokens_;
  std::atomic<uint64_t> shm_written_{0}, shm_read_{0}, tcp_written_{0}, tcp_read_{0};
};

}  // namespace granary::client
