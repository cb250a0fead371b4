// client/segment_directory.h - what a client knows about segments beyond a replica's address:
// whether a segment lives on this host, and under which shared-memory name.
//
// Promise: Local(segment_id) answers from a cache refreshed with ListSegments when an unknown id
// shows up (at most every 100 ms), so a new node is learnt on first use without a call per read.
// Segment ids are never reused by the master, so a cached entry can go stale but never wrong.
// Thread safety: any thread.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

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
  SegmentDirectory(proto::Master::Stub* master, std::string host_id, int rpc_timeout_ms)
      : master_(master), host_id_(std::move(host_id)), rpc_timeout_ms_(rpc_timeout_ms) {}

  // The shm name and size of segment_id if it is on this host; nullopt if it is remote or
  // unknown even after a refresh.
  std::optional<LocalSegment> Local(uint64_t segment_id);
  Status Refresh();

 private:
  struct Entry {
    bool local = false;
    LocalSegment segment;
  };
  proto::Master::Stub* master_;
  std::string host_id_;
  int rpc_timeout_ms_;
  std::mutex mu_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::chrono::steady_clock::time_point last_refresh_{};
};

}  // namespace granary::client
