// client/read_releaser.h - releases read locks (BatchFinishRead) in the background, batched.
//
// A Get needs its lock only until its bytes are copied and verified; telling the master can wait
// a millisecond and share one RPC with other Gets, which takes a round trip off every Get.
// Promise: every key handed to Add is released within ~1 ms (or at the next Flush), in
// BatchFinishRead calls of at most 4096 keys, however many piled up meanwhile; Flush returns once everything added before it is released. A lost
// release costs nothing but the lock living on to its TTL. An idle releaser (~100 ms without a
// key) sleeps until the next Add instead of polling.
// Thread safety: Add and Flush from any thread; the destructor flushes and joins.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/master_link.h"

namespace granary::client {

class ReadReleaser {
 public:
  ReadReleaser(MasterLink* master, std::string client_id);
  ~ReadReleaser();

  void Add(std::vector<std::string> keys);
  void Flush();

 private:
  void Loop();
  void Send(std::vector<std::string> keys);

  MasterLink* master_;
  std::string client_id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable flushed_cv_;
  std::vector<std::string> pending_;
  uint64_t added_batches_ = 0;  // generations: Flush waits until sent_ reaches what it saw
  uint64_t sent_batches_ = 0;
  bool stopping_ = false;
  bool asleep_ = false;  // the loop waits for a key with no timeout; Add must wake it
  std::thread thread_;
};

}  // namespace granary::client
