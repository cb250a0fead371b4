#include "master/ha/standby_set.h"

#include <algorithm>

namespace granary::master::ha {

uint64_t StandbySet::NewStream() {
  std::lock_guard lock(mu_);
  return next_stream_++;
}

uint64_t StandbySet::Connected(const std::string& id, const std::string& advertise,
                              std::shared_ptr<StreamLink> link, uint64_t stream) {
  std::lock_guard lock(mu_);
  Standby& s = standbys_[id];
  s.id = id;
  s.advertise = advertise;
  s.connected = true;
  // What an earlier connection (or term) acknowledged says nothing about this one: the standby
  // acks its position as soon as its history is settled (continued or loaded).
  s.acked = 0;
  s.link = std::move(link);
  s.stream = stream != 0 ? stream : next_stream_++;
  s.last_ack = std::chrono::steady_clock::now();
  return s.stream;
}

void StandbySet::Acked(const std::string& id, uint64_t stream, uint64_t seq) {
  {
    std::lock_guard lock(mu_);
    auto it = standbys_.find(id);
    if (it == standbys_.end() || it->second.stream != stream) return;
    it->second.acked = std::max(it->second.acked, seq);
    it->second.last_ack = std::chrono::steady_clock::now();
    if (id != sync_) return;
  }
  acked_.notify_all();
}

void StandbySet::Gone(const std::string& id, uint64_t stream) {
  std::lock_guard lock(mu_);
  auto it = standbys_.find(id);
  if (it == standbys_.end() || it->second.stream != stream) return;
  it->second.connected = false;
  it->second.link.reset();
}

void StandbySet::SetSync(const std::string& id, bool required) {
  {
    std::lock_guard lock(mu_);
    sync_ = id;
    required_ = required;
  }
  acked_.notify_all();
}

Status StandbySet::WaitAcked(uint64_t seq, SteadyTime deadline) {
  constexpr auto kSlice = std::chrono::milliseconds(10);  // how often a waiter looks around
  for (;;) {  // bounded by the deadline: every pass drives the standby or waits one slice
    std::shared_ptr<StreamLink> link;
    std::vector<std::shared_ptr<StreamLink>> everyone;
    bool async = false;
    {
      std::unique_lock lock(mu_);
      if (closed_) {
        return Status(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                      "this master stopped leading before the operation was replicated; its "
                      "outcome is unknown");
      }
      auto it = standbys_.find(sync_);
      if (!required_) {
        async = true;
        for (const auto& [id, s] : standbys_) {
          if (s.connected && s.link) everyone.push_back(s.link);
        }
        released_ = std::max(released_, seq);
      } else if (it != standbys_.end() && it->second.acked >= seq) {
        released_ = std::max(released_, seq);
        return Status::Ok();
      } else if (it != standbys_.end() && it->second.connected) {
        link = it->second.link;
      }
    }
    if (async) {
      // Asynchronous: the operation goes to every standby now; nobody waits for an ack.
      for (const auto& l : everyone) (void)l->Flush();
      return Status::Ok();
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return Status(ErrorCode::RPC_TIMEOUT,
                    "no synchronous standby acknowledged the operation in time; its outcome is "
                    "unknown");
    }
    const SteadyTime until = std::min(deadline, now + kSlice);
    if (link && link->Flush().ok() && link->Drive(seq, until)) continue;
    // Another thread reads the acks (or there is no standby to send to): wait for its news.
    std::unique_lock lock(mu_);
    acked_.wait_until(lock, until);
  }
}

bool StandbySet::Ready() const {
  std::lock_guard lock(mu_);
  if (closed_) return false;
  if (!required_) return true;
  auto it = standbys_.find(sync_);
  return it != standbys_.end() && it->second.connected;
}

void StandbySet::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  acked_.notify_all();
}

void StandbySet::Reopen(uint64_t released) {
  std::lock_guard lock(mu_);
  standbys_.clear();  // streams of an earlier term are over; their acks count for nothing now
  closed_ = false;
  sync_.clear();
  required_ = true;
  released_ = released;
}

std::vector<StandbySet::Standby> StandbySet::List() const {
  std::lock_guard lock(mu_);
  std::vector<Standby> out;
  for (const auto& [id, s] : standbys_) out.push_back(s);
  return out;
}

std::string StandbySet::sync_id() const {
  std::lock_guard lock(mu_);
  return sync_;
}

bool StandbySet::sync_required() const {
  std::lock_guard lock(mu_);
  return required_;
}

uint64_t StandbySet::released() const {
  std::lock_guard lock(mu_);
  return released_;
}


}  // namespace granary::master::ha
