#include "master/state/apply_combiner.h"

#include <algorithm>

namespace granary::master {

void ApplyCombiner::RunWaiter(Waiter& w) {
  bool wait = false;
  {
    std::lock_guard q(queue_mu_);
    queue_.push_back(&w);
    wait = turn_taken_;
    turn_taken_ = true;
  }
  if (wait) {
    WaitWhileQueued(w.state);
    if (w.state.load(std::memory_order_acquire) == kDone) {
      if (w.error) std::rethrow_exception(w.error);
      return;
    }
    // kYourTurn: the last combiner passed the turn on; w is still queued and runs first.
  }
  Combine(w);
  if (w.error) std::rethrow_exception(w.error);
}

size_t ApplyCombiner::queued() const {
  std::lock_guard q(queue_mu_);
  return queue_.size();
}

void ApplyCombiner::Combine(const Waiter& own) {
  turns_.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock lock(*serial_);
  size_t ran = 0;
  const size_t max_turn = max_turn_.load(std::memory_order_relaxed);
  const size_t min_waiting = min_waiting_.load(std::memory_order_relaxed);
  for (;;) {
    Waiter* next_turn = nullptr;
    {
      std::lock_guard q(queue_mu_);
      if (queue_.empty()) {
        turn_taken_ = false;
        return;
      }
      // A turn begins with its own task at the front: queued into an empty queue, or handed
      // the turn as the oldest waiter.
      const size_t others_waiting = queue_.size() - (ran == 0 ? 1 : 0);
      const bool combine = others_waiting >= min_waiting;
      if (ran >= max_turn || (ran > 0 && !combine)) {
        next_turn = queue_.front();  // stays queued: its own turn runs it first
      } else {
        const size_t take = combine ? std::min(queue_.size(), max_turn - ran) : 1;
        batch_.assign(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(take));
        queue_.erase(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(take));
      }
    }
    if (next_turn != nullptr) {
      lock.unlock();
      Wake(next_turn->state, kYourTurn);
      return;
    }
    for (Waiter* w : batch_) {
      try {
        w->fn(w->task);
      } catch (...) {
        w->error = std::current_exception();
      }
      ++ran;
      if (w != &own) {
        combined_.fetch_add(1, std::memory_order_relaxed);
        Wake(w->state, kDone);  // w may be gone once this returns: not touched again
      }
    }
    batch_.clear();
  }
}

// The release store pairs with the waiter's acquire load: what the task wrote is visible to its
// caller. Waking an address whose waiter has already seen the store and returned is harmless:
// the notify reads no memory there, it only wakes whoever sleeps on the address.
void ApplyCombiner::Wake(std::atomic<uint32_t>& state, uint32_t value) {
  state.store(value, std::memory_order_release);
  state.notify_one();
}

void ApplyCombiner::WaitWhileQueued(std::atomic<uint32_t>& state) {
  for (uint32_t s = state.load(std::memory_order_acquire); s == kQueued;
       s = state.load(std::memory_order_acquire)) {
    state.wait(kQueued, std::memory_order_acquire);
  }
}

}  // namespace granary::master
