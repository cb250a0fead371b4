// master/ha/replication_log.h - the recent ordered history, encoded, that standbys stream.
//
// Promise: holds the encodings (state_codec's EncodeOperation) of a contiguous run of the last
// operations applied, [first_seq(), last_seq()], in sequence order, within max_bytes: older ones
// are dropped from the front as new ones come. Read(from) hands out whole operations from `from`
// on, or says kTooOld when `from` was dropped (the standby then starts over from a snapshot).
// A standby whose next wanted seq is last_seq() + 1 waits in Read for the next append.
// Append is fed by MasterState's observer (Apply and Replay alike, so a promoted standby already
// holds the history a follower of it needs); Reset starts a new run after a snapshot replaced
// the state.
// Ownership: owns the encodings.
// Thread safety: every method from any thread. Append runs under the state's apply lock: it only
// takes this log's leaf mutex, never a lock of the state.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

namespace granary::master::ha {

class ReplicationLog {
 public:
  explicit ReplicationLog(size_t max_bytes) : max_bytes_(max_bytes) {}

  // seq must be last_seq() + 1 (or the first after Reset); anything else starts a new run at seq.
  void Append(uint64_t seq, std::string encoded);
  // The log now continues after `last_seq` and holds nothing older.
  void Reset(uint64_t last_seq);
  // Wakes every waiting Read, which then answers kClosed; later Reads too.
  void Close();

  enum class ReadResult { kOk, kTooOld, kTimeout, kClosed };
  // Appends to *out, as [u32 length | encoding] records, the operations from `from` on, at least
  // one (even if larger than max_bytes) and then as many as fit in max_bytes; *last is the last
  // seq appended. Waits up to `wait` while `from` is past the end.
  ReadResult Read(uint64_t from, size_t max_bytes, std::chrono::milliseconds wait,
                  std::string* out, uint64_t* last);

  uint64_t last_seq() const;
  uint64_t first_seq() const;  // last_seq() + 1 when empty
  size_t bytes() const;

 private:
  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::condition_variable appended_;
  std::deque<std::string> ops_;  // ops_[i] has seq first_ + i
  uint64_t first_ = 1;
  size_t bytes_ = 0;
  bool closed_ = false;
};

}  // namespace granary::master::ha
