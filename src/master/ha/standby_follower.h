// master/ha/standby_follower.h - a standby's side of the history stream: keeps this master's state
// equal to the leader's up to a known sequence number.
//
// Promise: while following, the state changes only by Replay of the leader's operations in
// order, or by loading the leader's snapshot (when this master's history is not a prefix of the
// leader's, or fell behind its log); so its digest at seq N equals the leader's at N. An
// operation is acknowledged once it is here (received, in order, queued to apply): Stop()
// returns only after every operation acknowledged was applied, and after it the follower changes
// nothing any more (the coordinator may then promote this state or replace it).
// A history that cannot be replayed (an operation refused) marks the state as not a prefix of
// anything, so the next connection asks for a snapshot.
// Ownership: borrows the state and the log; owns its thread and socket.
// Thread safety: Follow, Stop and the accessors from any thread; the follower's own thread is
// the only one that applies operations while it runs.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "master/ha/replication_log.h"
#include "master/ha/stream_wire.h"
#include "master/state/master_state.h"
#include "security/tls.h"

namespace granary::master::ha {

class StandbyFollower {
 public:
  struct Options {
    std::string id;         // this master's member id
    std::string advertise;  // this master's gRPC address
    std::chrono::milliseconds timeout{1000};  // a leader silent this long is left
    std::string secret;  // presented in the fast port's hello first (empty: none)
    // The leader's fast port is TLS from this client context (null: plain TCP).
    std::shared_ptr<const security::TlsContext> tls;
  };
  struct Progress {
    bool connected = false;
    uint64_t term = 0;         // the followed leader's
    uint64_t applied = 0;      // this state's last seq
    uint64_t leader_last = 0;  // the leader's last seq, as its last beat said
    uint64_t snapshots = 0;    // snapshots loaded since start
  };

  StandbyFollower(MasterState* state, ReplicationLog* log, Options options);
  ~StandbyFollower();
  StandbyFollower(const StandbyFollower&) = delete;
  StandbyFollower& operator=(const StandbyFollower&) = delete;

  // Follows the leader whose fast port is host:port and whose term is `term` (a leader of a
  // lower term is not followed). Starts the follower's thread if it is not running.
  void Follow(const std::string& host, uint16_t port, uint64_t term);
  // Stops following; returns once the thread has ended.
  void Stop();

  // The history this state holds (valid while stopped, or as a copy).
  Lineage lineage() const;
  void set_lineage(Lineage lineage);
  // Whether the state is a prefix of some leader's history (false after a failed replay).
  bool state_valid() const;
  void set_state_valid(bool valid);
  Progress progress() const;

 private:
  void Run();
  // One connection: hello, welcome, maybe a snapshot, then operations until it ends.
  void Session(net::ByteStream& conn, uint64_t term);
  uint64_t refusals_ = 0;  // hellos refused in a row (a wrong secret); the Run thread's own
  Status SendAck(net::ByteStream& conn, uint64_t seq);
  // Applies one session's received frames in order on its own thread; its destructor returns
  // once every frame pushed was applied (or one was refused).
  class Applier {
   public:
    explicit Applier(StandbyFollower* follower);
    ~Applier();
    void Push(std::string frame);
    bool failed() const;

   private:
    void Run();
    static constexpr size_t kMaxQueuedBytes = 256 << 20;
    StandbyFollower* follower_;
    mutable std::mutex mu_;
    std::condition_variable changed_;
    std::deque<std::string> queue_;
    size_t queued_bytes_ = 0;
    bool closing_ = false;
    bool failed_ = false;
    std::thread thread_;  // last: started once the rest is built
  };

  MasterState* state_;
  ReplicationLog* log_;
  const Options options_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::string host_;
  uint16_t port_ = 0;
  uint64_t term_ = 0;
  uint64_t target_ = 0;  // counts Follow() calls that changed the target
  bool stop_ = true;
  int fd_ = -1;          // the open connection, shut down to interrupt it
  Lineage lineage_;
  bool valid_ = true;
  Progress progress_;
  std::thread thread_;
};

}  // namespace granary::master::ha
