// client/replica_io.h - moves one object's bytes to or from one replica, by the cheapest path:
// a memcpy through the segment's shared memory when it is on this host, else TCP.
//
// Promise: Write stores the parts back to back at the replica's range; Read fills the
// destination parts in order and returns the XXH3 checksum of what it read, which the caller
// compares with the object's. Never touches bytes outside the replica's range (checked against
// the mapped segment's size too). A failed shared-memory attach falls back to TCP.
//
// Fencing on the shared-memory path: a replica names the token of the mount it was granted
// under; the header of the mapped file holds the token of the mount its memory belongs to. Before
// any copy the two must be equal, else the mapping is re-attached once if its file was retired by
// a remount or is gone (node restarted under the same name), and otherwise the shared-memory path
// is not used (TCP, where the node refuses the stale token). After a read's copy the header is
// checked again: a read that overlapped a remount is discarded (SEGMENT_NOT_FOUND), never
// returned. After a write's copy too: the put fails and is revoked rather than committed. A copy
// already past its check when a remount comes, paused for however long, still only touches the
// memory it checked: every mount has its own file (node/shm_segment.h, Renew), and a retired one
// is never handed out again. So a thread holding an old replica never writes into a restarted
// node's new segment, nor into space a remount handed out again, without any quarantine.
// The checksum of a write is that of the caller's bytes (hashed while copying), never that of
// the shared memory after the copy, which another process may have written meanwhile.
// Mappings of segments that vanished from the directory, or whose file is gone, are dropped at
// every directory refresh (at least every SegmentDirectory::kMaxAge while the client reads).
// Disk loads from a node on this host (ReadDisk with same_host) go through the node's
// shared-memory staging region (DISK_STAGE): the node names where each object sits, this class
// copies it out of a read-only mapping of the region (verified against the region's token the
// node gave over the connection), checks the slot's generation after the copy and then the
// checksum. Whatever that path cannot deliver for a reason other than the node's word that the
// copy is gone or damaged (region busy or too small, slot reclaimed during the copy, no region,
// connection trouble) is read again over TCP in the same call.
// Thread safety: any thread; the mapping cache and the transport are shared and thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/segment_directory.h"
#include "common/checksum.h"
#include "common/thread_pool.h"
#include "granary/client.h"
#include "granary/proto/master.pb.h"
#include "transfer/mapping_warmer.h"
#include "transfer/shm_mapping.h"
#include "transfer/shm_staging.h"
#include "transfer/tcp_transport.h"

namespace granary::client {

class ReplicaIo {
 public:
  // Registers itself as the directory's refresh listener (to unmap dead segments and map this
  // host's live ones) and, with warm_mappings, as the cache's attach listener: every new mapping
  // is populated in the background (transfer/mapping_warmer.h).
  // With `copy_pool`, a large same-host copy is shared with one of its workers
  // (client/split_copy.h); the pool must outlive this object.
  ReplicaIo(SegmentDirectory* directory, transfer::ShmMappingCache* mappings,
            transfer::TcpTransport* tcp, bool use_shared_memory, bool warm_mappings = true,
            ThreadPool* copy_pool = nullptr);
  ~ReplicaIo();
  ReplicaIo(const ReplicaIo&) = delete;
  ReplicaIo& operator=(const ReplicaIo&) = delete;

  bool IsLocal(const proto::Replica& replica);
  // The replica's bytes in this process: the mapping stays alive while the view is held.
  struct LocalView {
    std::shared_ptr<transfer::ShmMapping> mapping;
    std::byte* bytes = nullptr;
  };
  // With `checksum`, also hashes the caller's bytes: while copying them on the shared-memory
  // path (they are in cache right then), piece by piece right after sending them over TCP.
  // With `device`, parts it Holds are device memory: into a local segment the device copies
  // them straight into the mapping (registered with it once per mapping) and the checksum is
  // taken from the segment after that copy (granary/client.h, DeviceMemory, says why that is
  // sound); over TCP they go through a host buffer.
  Status Write(const proto::Replica& replica, const std::vector<ByteSpan>& parts,
               ChecksumStream* checksum = nullptr, DeviceMemory* device = nullptr);
  // With `device`, destination parts it Holds are device memory: from a local segment the device
  // copies them straight out of the mapping (registered with it once per mapping) while the CPU
  // hashes the same bytes, and the token is checked again only after the device's copy is done;
  // over TCP they arrive in a host buffer first.
  Result<uint64_t> Read(const proto::Replica& replica, const std::vector<MutableByteSpan>& dst,
                        DeviceMemory* device = nullptr);
  // Read's same-host device path in two halves, so that many objects' copies share one
  // DeviceMemory::Wait. StartDeviceRead starts the device's copies out of the mapped segment
  // and hashes the same bytes meanwhile; nullopt when it does not apply (the replica is not
  // mapped here, a destination part is not device memory, the sizes differ, or the object is
  // empty): use Read. FinishDeviceRead, once
  // the calling thread's Wait returned `waited`, checks the segment's token again and returns
  // the digest: only then may the bytes count as read.
  struct DeviceRead {
    LocalView view;
    Status started;  // the first copy that could not be started
    uint64_t digest = 0;
  };
  std::optional<DeviceRead> StartDeviceRead(const proto::Replica& replica,
                                            const std::vector<MutableByteSpan>& dst,
                                            DeviceMemory& device);
  Result<uint64_t> FinishDeviceRead(const DeviceRead& read, const proto::Replica& replica,
                                    const Status& waited);
  // Loads whole objects from one node's disk tier (DISK_READ over TCP, however near the node):
  // a status per item, OK only when the bytes in its dst hash to its checksum (else
  // CHECKSUM_MISMATCH, and the bytes must not be used).
  std::vector<Status> ReadDisk(const std::string& endpoint,
                               std::span<transfer::DiskReadItem> items, bool same_host = false);
  ClientStats Stats() const;

 private:
  // The replica's bytes in this process's address space, or an empty view to use TCP. A view is
  // returned only when the segment's header token equals the replica's.
  LocalView MapLocal(const proto::Replica& replica);
  // Registers the whole mapping with the device, once per mapping, until it is unmapped.
  static void RegisterMapping(transfer::ShmMapping& mapping, DeviceMemory& device);
  // The node's staging region mapped here, or null (none, not this host's, asked too recently).
  std::shared_ptr<transfer::StagingView> StagingFor(const std::string& endpoint);
  void DropStaging(const std::string& endpoint, const transfer::StagingView* view);
  // The shared-memory part of ReadDisk: marks in `done` the items it settled.
  void ReadDiskStaged(const std::string& endpoint, std::span<transfer::DiskReadItem> items,
                      std::vector<Status>& out, std::vector<char>& done);

  SegmentDirectory* directory_;
  transfer::ShmMappingCache* mappings_;
  transfer::TcpTransport* tcp_;
  bool use_shm_;
  ThreadPool* copy_pool_;  // null: every copy on the calling thread
  std::atomic<uint64_t> shm_written_{0}, shm_read_{0}, tcp_written_{0}, tcp_read_{0};
  std::atomic<uint64_t> disk_read_{0}, disk_read_shm_{0}, device_read_{0}, device_written_{0};
  std::unique_ptr<transfer::MappingWarmer> warmer_;  // null: mappings are not warmed
  struct Staging {
    std::shared_ptr<transfer::StagingView> view;
    std::chrono::steady_clock::time_point retry_after{};  // after a failed look, no earlier
  };
  std::mutex staging_mu_;
  std::unordered_map<std::string, Staging> staging_;  // by endpoint
};

}  // namespace granary::client
