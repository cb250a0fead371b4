// master/operations.h - every change of the master's state, as a value.
//
// The master is a state machine: MasterState::Apply(Operation) is the only code that mutates it.
// An operation carries everything its effect depends on, including the time it was issued at, so
// the same stream applied in the same order to a fresh state gives the same state: that stream is
// what a standby master replays. Pure queries (exist, size, stat, list) are not operations.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "granary/status.h"
#include "master/segment_table.h"

namespace granary::master {

struct PlacementConfig {
  uint32_t replica_num = 1;
  bool with_soft_pin = false;
  bool with_hard_pin = false;
  std::vector<std::string> preferred_segments;
  int64_t soft_pin_ttl_ms = 0;  // 0 takes the master's default
};

struct MountSegmentOp {
  std::string client_id;
  SegmentSpec segment;
};
struct UnmountSegmentOp {
  std::string client_id;  // empty: the master itself, e.g. expiring a dead node
  std::string name;
};
struct PingOp {
  std::string client_id;
};
struct ExpireClientOp {
  std::string client_id;
};
struct PutStartOp {
  std::string client_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> sizes;
  PlacementConfig config;
  bool upsert = false;
};
struct PutEndOp {
  std::string client_id;
  std::vector<std::string> keys;
  std::vector<uint64_t> checksums;
};
struct PutRevokeOp {
  std::string client_id;
  std::vector<std::string> keys;
};
struct GetReplicaListOp {
  std::string client_id;
  std::vector<std::string> keys;
};
struct FinishReadOp {
  std::string client_id;
  std::vector<std::string> keys;
};
struct RemoveOp {
  std::vector<std::string> keys;
  bool force = false;
};
struct RemoveByRegexOp {
  std::string pattern;
  bool force = false;
};
struct RemoveAllOp {
  bool force = false;
};
// Chosen by the evictor; Apply re-checks each key, since its state may have moved since.
struct EvictOp {
  std::vector<std::string> keys;
  bool allow_soft_pinned = false;
  // s3fifo: objects the evictor passed over, applied before the victims, in order. One in the
  // probation queue that was read moves to the main queue; one in the main queue with reads left
  // goes to its tail with one read fewer. A key may appear more than once.
  std::vector<std::string> requeue;
};
// Applies the timeouts: zombie puts, deferred frees, expired read locks.
struct SweepOp {};

struct Operation {
  int64_t now_ms = 0;
  std::variant<MountSegmentOp, UnmountSegmentOp, PingOp, ExpireClientOp, PutStartOp, PutEndOp,
               PutRevokeOp, GetReplicaListOp, FinishReadOp, RemoveOp, RemoveByRegexOp, RemoveAllOp,
               EvictOp, SweepOp>
      body;
};

// ---- results ----
struct MountResult {
  Status status;
  uint64_t segment_id = 0;
};
struct UnmountResult {
  Status status;
  uint64_t dropped_replicas = 0;
};
struct PingResult {
  bool need_remount = false;
};
struct ExpireClientResult {
  std::vector<std::string> unmounted;
};
struct PutStartKeyResult {
  Status status;
  std::vector<Extent> replicas;
};
struct ReadKeyResult {
  Status status;
  uint64_t size = 0;
  uint64_t checksum = 0;
  std::vector<Extent> replicas;
};
struct RemoveCountResult {
  Status status;
  uint64_t removed = 0;
  uint64_t skipped = 0;
};
struct EvictResult {
  uint64_t objects = 0;
  uint64_t bytes = 0;
};
struct SweepResult {
  uint64_t discarded_puts = 0;    // pending writes dropped at the release timeout
  uint64_t freed_extents = 0;     // deferred frees that came due
};

using OpResult = std::variant<MountResult, UnmountResult, PingResult, ExpireClientResult,
                              std::vector<PutStartKeyResult>, std::vector<Status>,
                              std::vector<ReadKeyResult>, RemoveCountResult, EvictResult,
                              SweepResult>;

}  // namespace granary::master
