// master/ha/standby_set.h - the leader's view of its standbys: who streams its history, how far
// each has acknowledged, which one is synchronous, and the replies waiting on that one.
//
// Promise: WaitAcked(seq) returns OK only once the synchronous standby named by SetSync has
// acknowledged seq or later (or at once when no synchronous standby is required); a reply that
// waited here is therefore on a standby that etcd names as the only one that may take over.
// Changing the synchronous standby releases nobody by itself: the newcomer's own acknowledgements
// do, so a reply released before the change is on the old one and one released after is on the
// new one (the coordinator names a newcomer only once it has every operation released so far).
// Close() wakes every waiter with an error (this master stopped leading).
// Ownership: holds each connected standby's StreamLink (shared with its stream); the streams
// (stream_server.h) report into it.
// Thread safety: every method from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <mutex>
#include <string>
#include <vector>

#include "granary/status.h"
#include "master/ha/stream_link.h"

namespace granary::master::ha {

class StandbySet {
 public:
  using SteadyTime = std::chrono::steady_clock::time_point;
  struct Standby {
    std::string id;
    std::string advertise;
    uint64_t acked = 0;  // this connection acknowledged every operation up to this one (it has them)
    bool connected = false;
    SteadyTime last_ack{};         // when the last ack came
    uint64_t stream = 0;           // which connection (a reconnect gets a new number)
    std::shared_ptr<StreamLink> link;  // while connected: replies drive it (WaitAcked)
  };

  // A new stream from standby `id`; returns its stream number (Acked and Gone quote it, so a
  // stale connection's last words never touch a newer one's entry). Its acked position starts at
  // 0: only this connection's acks count.
  // stream: from NewStream() when the link's ack reports must name it before it is shared;
  // 0: a new number.
  uint64_t Connected(const std::string& id, const std::string& advertise,
                     std::shared_ptr<StreamLink> link = nullptr, uint64_t stream = 0);
  uint64_t NewStream();
  void Acked(const std::string& id, uint64_t stream, uint64_t seq);
  void Gone(const std::string& id, uint64_t stream);

  // Replies wait on standby `id` from now on (empty: on nobody). required: false lets every
  // reply through at once (--sync-standbys 0, or a leader allowed to serve alone).
  void SetSync(const std::string& id, bool required);
  // Waits until the synchronous standby has acknowledged `seq`, or the deadline (RPC_TIMEOUT:
  // outcome unknown to the caller), or Close() (UNAVAILABLE_IN_CURRENT_MODE). The calling
  // thread sends the operations to the standby and reads its acks itself when no other thread
  // is (StreamLink::Drive); without a synchronous standby required, it sends them to every
  // standby and returns at once.
  Status WaitAcked(uint64_t seq, SteadyTime deadline);
  // Whether WaitAcked could succeed now without waiting for a new standby: a synchronous
  // standby is named and connected, or none is required.
  bool Ready() const;
  void Close();
  // A new term: waits work again, with no standby known and none named; `released` is where the
  // previous leader may have released replies up to (a synchronous standby must have it).
  void Reopen(uint64_t released);

  std::vector<Standby> List() const;
  std::string sync_id() const;
  bool sync_required() const;
  // The highest seq WaitAcked let a reply through at (a new synchronous standby must have it).
  uint64_t released() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable acked_;
  std::map<std::string, Standby> standbys_;
  uint64_t next_stream_ = 1;
  std::string sync_;
  bool required_ = true;
  bool closed_ = false;
  uint64_t released_ = 0;
};

}  // namespace granary::master::ha
