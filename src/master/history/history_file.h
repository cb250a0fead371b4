// master/history/history_file.h - the master's ordered history, appended to a file.
//
// Promise: the file starts with a snapshot of the state the history starts from (policy, segment
// id base and all), then holds every operation Apply numbered, in sequence order, each as one
// record [u32 length | u64 XXH3 of the payload | payload]. Loading the first record and replaying
// the rest gives the master's state at the last record (ReplayHistory). A record torn by a crash
// (short or failing its hash) ends the history there; nothing after it is trusted.
// It is a debugging and testing aid (`--history-file`), not the master's durability: HA
// replicates the same records to standbys instead.
// Ownership: HistoryFile owns its descriptor.
// Thread safety: Append is called by MasterState's observer (under its apply lock, so in order);
// Flush may be called from any thread.
#pragma once

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "granary/status.h"
#include "master/state/master_state.h"

namespace granary::master {

class HistoryFile {
 public:
  // Creates (truncates) `path` and writes the state's current snapshot as its first record.
  static Result<std::unique_ptr<HistoryFile>> Create(const std::string& path,
                                                     const MasterState& state);
  ~HistoryFile();
  HistoryFile(const HistoryFile&) = delete;
  HistoryFile& operator=(const HistoryFile&) = delete;

  void Append(const Operation& op);
  // Writes buffered records to the file (they are buffered up to 1 MiB otherwise).
  Status Flush();

 private:
  explicit HistoryFile(std::FILE* file) : file_(file) {}
  void Write(const std::string& payload);  // caller holds mu_

  std::mutex mu_;
  std::FILE* file_;
  Status error_;  // the first write error, reported by Flush
};

// The records of a history file: the snapshot first, then the operations' encodings. Stops at a
// torn record. INVALID_PARAMS if the file is missing or has no intact first record.
Result<std::vector<std::string>> ReadHistoryRecords(const std::string& path);

// Loads records[0] into `state` and replays every operation up to and including `up_to_seq`
// (0: all of them). The state must be fresh and have the policy the history was made under.
Status ReplayHistory(const std::vector<std::string>& records, MasterState& state,
                     uint64_t up_to_seq = 0);

}  // namespace granary::master
