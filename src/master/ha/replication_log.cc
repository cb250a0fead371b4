#include "master/ha/replication_log.h"

#include <cstring>

namespace granary::master::ha {

void ReplicationLog::Append(uint64_t seq, std::string encoded) {
  {
    std::lock_guard lock(mu_);
    if (seq != first_ + ops_.size()) {  // not contiguous: a new run
      ops_.clear();
      bytes_ = 0;
      first_ = seq;
    }
    bytes_ += encoded.size();
    ops_.push_back(std::move(encoded));
    // Keeps the newest operation even when it alone is over the bound.
    while (bytes_ > max_bytes_ && ops_.size() > 1) {
      bytes_ -= ops_.front().size();
      ops_.pop_front();
      first_++;
    }
  }
  appended_.notify_all();
}

void ReplicationLog::Reset(uint64_t last_seq) {
  {
    std::lock_guard lock(mu_);
    ops_.clear();
    bytes_ = 0;
    first_ = last_seq + 1;
  }
  appended_.notify_all();
}

void ReplicationLog::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  appended_.notify_all();
}

ReplicationLog::ReadResult ReplicationLog::Read(uint64_t from, size_t max_bytes,
                                                std::chrono::milliseconds wait, std::string* out,
                                                uint64_t* last) {
  std::unique_lock lock(mu_);
  auto ready = [&] { return closed_ || from < first_ + ops_.size(); };
  // No wait asked: no timed wait either (it would cost a futex call per flush).
  if (wait.count() <= 0 ? !ready() : !appended_.wait_for(lock, wait, ready)) {
    return ReadResult::kTimeout;
  }
  if (closed_) return ReadResult::kClosed;
  if (from < first_) return ReadResult::kTooOld;
  size_t taken = 0;
  for (uint64_t seq = from; seq < first_ + ops_.size(); ++seq) {
    const std::string& op = ops_[seq - first_];
    if (taken > 0 && taken + op.size() + 4 > max_bytes) break;
    const uint32_t len = static_cast<uint32_t>(op.size());
    char header[4];
    std::memcpy(header, &len, 4);
    out->append(header, 4);
    out->append(op);
    taken += op.size() + 4;
    *last = seq;
  }
  return ReadResult::kOk;
}

uint64_t ReplicationLog::last_seq() const {
  std::lock_guard lock(mu_);
  return first_ + ops_.size() - 1;
}

uint64_t ReplicationLog::first_seq() const {
  std::lock_guard lock(mu_);
  return first_;
}

size_t ReplicationLog::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

}  // namespace granary::master::ha
