// client/segment_directory.h - what a client knows about segments beyond a replica's address:
// whether a segment lives on this host, and under which shared-memory name.
//
// Promise: Local(segment_id) answers from a cache refreshed with ListSegments when an unknown id
// shows up (at most every 100 ms), and also when the cache is older than kMaxAge, so a new node is
// learnt on first use without a call per read and a vanished one is forgotten within kMaxAge of a
// use. Segment ids are never reused by the master, so a cached entry can go stale but never
// wrong; the mount token that makes a replica usable is checked against the segment's
// shared-memory header by ReplicaIo, not here. After every successful refresh the listener set
// with OnRefresh is called (outside the lock) with this host's live segments: ReplicaIo unmaps
// the others and maps (and warms) these.
// Thread safety: any thread. The listener must be set before the directory is shared.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/master_locator.h"
#include "granary/proto/master.grpc.pb.h"
#include "granary/status.h"

namespace granary::client {

struct LocalSegment {
  std::string shm_name;
  uint64_t size = 0;
  uint64_t token = 0;
};

class SegmentDirectory {
 public:
  // master: null for tests without one.
  SegmentDirectory(MasterLocator* master, std::string host_id, int rpc_timeout_ms)
      : master_(master), host_id_(std::move(host_id)), rpc_timeout_ms_(rpc_timeout_ms) {}

  // The shm name and size of segment_id if it is on this host; nullopt if it is remote or
  // unknown even after a refresh.
  std::optional<LocalSegment> Local(uint64_t segment_id);
  // Whether the node `node_id` (a segment's owner, as a disk replica names it) is on this host,
  // by the same host-id test and cache rules as Local; false when it is unknown.
  bool NodeIsLocal(const std::string& node_id);
  Status Refresh();
  using RefreshListener = std::function<void(const std::vector<LocalSegment>& live_local)>;
  void OnRefresh(RefreshListener listener) { listener_ = std::move(listener); }
  // For tests without a master: records segment_id as a segment of this host.
  void Learn(uint64_t segment_id, LocalSegment segment);

  static constexpr std::chrono::milliseconds kMaxAge{5000};

 private:
  struct Entry {
    bool local = false;
    LocalSegment segment;
    std::string node_id;
  };
  MasterLocator* master_;
  std::string host_id_;
  int rpc_timeout_ms_;
  std::mutex mu_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::chrono::steady_clock::time_point last_refresh_{};
  std::chrono::steady_clock::time_point last_success_{};
  std::chrono::steady_clock::time_point age_claim_{};  // a caller is refreshing an old cache
  RefreshListener listener_;
};

}  // namespace granary::client
