// master/ha/stream_link.h - one standby's connection as the leader drives it: operations go out
// in order, sent by whichever thread flushes first, and acks come back to one reader at a time.
//
// Why not a sender thread and an ack-reader thread: a reply that waits for its replication would
// then cost four thread wake-ups on the leader (sender, ack reader, the waiting call), which on a
// loaded host cost more than the network round trip. Here the call that needs its operation on
// the standby sends it itself (Flush) and reads the ack itself (Drive), so the round trip is all
// it waits for; the stream's own thread only sends what nobody flushed (heartbeats, read-lock
// releases, an asynchronous standby's feed), reads acks while no call does, and sends beats.
// Promise: operations are sent exactly once each, in sequence order, with no gap, from next_seq
// on; a Flush() that returns OK has sent every operation applied before it was called. Only
// one thread reads at a time; every ack read is reported, in order, through on_ack. Close() (or a
// broken connection) makes every later call fail promptly.
// Ownership: borrows the connection (the fast server closes it) and the log.
// Thread safety: every method from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "common/byte_stream.h"
#include "granary/status.h"
#include "master/ha/replication_log.h"

namespace granary::master::ha {

class StreamLink {
 public:
  using SteadyTime = std::chrono::steady_clock::time_point;
  using OnAck = std::function<void(uint64_t seq)>;

  StreamLink(net::ByteStream* conn, ReplicationLog* log, uint64_t next_seq, std::chrono::milliseconds io_timeout,
             size_t max_batch_bytes, OnAck on_ack);

  // Sends the operations not sent yet, up to the log's end (so every one applied before the
  // call). RPC_FAIL: the connection broke; OBJECT_NOT_FOUND: the log no longer holds the next
  // operation (the standby must start over from a snapshot).
  Status Flush();
  // A heartbeat with the leader's term and last operation, in order with the operations.
  Status SendBeat(uint64_t term, uint64_t last_seq);
  Status SendRefusal(const std::string& why);
  // Reads acks until one covers `seq` or `until` passes, if no other thread is reading; returns
  // false at once when another is (it reports what it reads). Errors close the link.
  bool Drive(uint64_t seq, SteadyTime until);
  // Reads whatever acks have arrived, without waiting, if no other thread is reading.
  void Poll();

  // Calls waiting on this link now, and whether one did lately: the stream's thread reads acks
  // only when replies have not for a while (it would otherwise race them for each ack and make
  // them wait for its wake-up instead of their own).
  int drivers() const { return drivers_.load(); }
  bool driven_lately(std::chrono::milliseconds window) const;
  uint64_t acked() const { return acked_.load(); }
  bool acked_once() const { return acked_once_.load(); }
  uint64_t sent() const;
  SteadyTime last_ack() const;
  bool broken() const { return broken_.load(); }
  void Close();

 private:
  // Reads and reports every complete ack frame available; waits up to `until` for the first
  // when `wait`. Caller holds read_mu_.
  Status ReadAcks(SteadyTime until, bool wait);

  net::ByteStream* const conn_;
  ReplicationLog* log_;
  const std::chrono::milliseconds io_timeout_;
  const size_t max_batch_bytes_;
  const OnAck on_ack_;
  mutable std::mutex send_mu_;
  uint64_t next_seq_;    // the next operation to send (under send_mu_)
  std::string batch_;    // send buffer, reused (under send_mu_)
  std::mutex read_mu_;   // the reader's
  std::string inbox_;    // bytes read and not yet a whole frame (under read_mu_)
  std::atomic<uint64_t> acked_{0};
  std::atomic<int64_t> last_ack_ns_;
  std::atomic<bool> acked_once_{false};
  std::atomic<int> drivers_{0};
  std::atomic<int64_t> last_drive_ns_{0};
  std::atomic<bool> broken_{false};
};

}  // namespace granary::master::ha
