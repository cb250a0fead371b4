#include "client/read_releaser.h"

#include <algorithm>

namespace granary::client {

namespace {
constexpr auto kDelay = std::chrono::milliseconds(1);
constexpr size_t kMaxBatch = 4096;
constexpr int kIdleTicksBeforeSleep = 100;  // ~100 ms without a key
}  // namespace

ReadReleaser::ReadReleaser(MasterLink* master, std::string client_id)
    : master_(master), client_id_(std::move(client_id)) {
  thread_ = std::thread([this] { Loop(); });
}

ReadReleaser::~ReadReleaser() {
  Flush();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ReadReleaser::Add(std::vector<std::string> keys) {
  if (keys.empty()) return;
  std::lock_guard lock(mu_);
  for (auto& k : keys) pending_.push_back(std::move(k));
  added_batches_++;
  if (pending_.size() >= kMaxBatch || asleep_) cv_.notify_all();
}

void ReadReleaser::Flush() {
  std::unique_lock lock(mu_);
  const uint64_t target = added_batches_;
  cv_.notify_all();
  flushed_cv_.wait(lock, [&] { return sent_batches_ >= target || stopping_; });
}

void ReadReleaser::Loop() {
  std::unique_lock lock(mu_);
  int idle_ticks = 0;
  while (!stopping_) {
    if (idle_ticks >= kIdleTicksBeforeSleep) {
      // Idle for a while: sleep until a key comes instead of waking 1000 times a second. Only
      // the first Add after the sleep pays for waking this thread.
      asleep_ = true;
      cv_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      asleep_ = false;
      idle_ticks = 0;
    }
    cv_.wait_for(lock, kDelay, [this] { return stopping_ || pending_.size() >= kMaxBatch; });
    if (pending_.empty()) {
      sent_batches_ = added_batches_;
      flushed_cv_.notify_all();
      ++idle_ticks;
      continue;
    }
    idle_ticks = 0;
    std::vector<std::string> keys;
    keys.swap(pending_);
    const uint64_t covered = added_batches_;
    lock.unlock();
    Send(std::move(keys));
    lock.lock();
    sent_batches_ = covered;
    flushed_cv_.notify_all();
  }
}

void ReadReleaser::Send(std::vector<std::string> keys) {
  // Keys pile up past kMaxBatch while a call is under way; the master refuses a whole batch
  // above its limit (65,536 keys), so each call carries at most kMaxBatch.
  for (size_t first = 0; first < keys.size(); first += kMaxBatch) {
    proto::BatchFinishReadRequest req;
    req.set_client_id(client_id_);
    const size_t last = std::min(keys.size(), first + kMaxBatch);
    for (size_t i = first; i < last; ++i) req.add_keys(std::move(keys[i]));
    proto::BatchStatusResponse resp;
    (void)master_->FinishRead(req, &resp);  // a failure leaves the lock to its TTL
  }
}

}  // namespace granary::client
