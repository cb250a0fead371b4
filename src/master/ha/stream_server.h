// master/ha/stream_server.h - the leader's side of the history stream: one standby per fast-port
// connection gets a snapshot (when its history is not a prefix of ours, or too old for the log),
// then every operation in order, and acknowledges what it applied (stream_wire.h).
//
// Promise: a standby is streamed only while this master leads the term it was welcomed in;
// StopLeading() ends every stream within one beat. Every operation reaches a standby in
// sequence order with no gap: a standby the log has left behind is refused (kRefuse) and comes
// back for a snapshot. A standby silent for standby_timeout (no ack, not even of a beat) is
// dropped, so a paused synchronous standby is noticed and replaced (coordinator.h); before its
// first ack a standby may be loading a snapshot, and is given much longer.
// Ownership: borrows the state, the log and the standby set (they outlive it).
// Thread safety: Serve runs on each connection's fast-server thread; replies waiting for their
// replication drive the same connection through its StreamLink (stream_link.h); Lead and
// StopLeading from the coordinator's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string_view>

#include "master/ha/replication_log.h"
#include "master/ha/standby_set.h"
#include "master/ha/stream_wire.h"
#include "master/state/master_state.h"

namespace granary::master::ha {

struct StreamOptions {
  std::chrono::milliseconds beat{100};              // a leader idle this long sends a beat
  std::chrono::milliseconds standby_timeout{1000};  // a standby silent this long is dropped
  // ...but before its first ack it may be loading a snapshot (seconds for millions of objects).
  std::chrono::milliseconds first_ack_timeout{300'000};
  size_t max_batch_bytes = 4 << 20;                 // operations per kOps frame, at most
  size_t snapshot_chunk_bytes = 8 << 20;
};

class StreamServer {
 public:
  StreamServer(MasterState* state, ReplicationLog* log, StandbySet* standbys,
               StreamOptions options)
      : state_(state), log_(log), standbys_(standbys), options_(options) {}

  // This master leads `term` with history `lineage` (its last entry is this term's).
  void Lead(uint64_t term, Lineage lineage);
  void StopLeading();
  // The fast server's kReplicate handler.
  void Serve(net::ByteStream& conn, std::string_view request);

 private:
  bool Leading(uint64_t term) const;
  // Sends the snapshot in chunks; returns the seq it ends at.
  Result<uint64_t> SendSnapshot(net::ByteStream& conn);

  MasterState* state_;
  ReplicationLog* log_;
  StandbySet* standbys_;
  const StreamOptions options_;
  mutable std::mutex mu_;
  uint64_t term_ = 0;  // 0: not leading
  Lineage lineage_;
};

}  // namespace granary::master::ha
