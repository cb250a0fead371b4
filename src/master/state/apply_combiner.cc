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
    WaitWhileQueued(w);
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
    for (size_t k = 0; k < batch_.size();) {
      const size_t n = RunNext(k, own);
      for (size_t j = k; j < k + n; ++j) {
        Waiter* w = batch_[j];
        ++ran;
        if (w != &own) {
          combined_.fetch_add(1, std::memory_order_relaxed);
          Wake(w->state, kDone);  // w may be gone once this returns: not touched again
        }
      }
      k += n;
    }
    batch_.clear();
  }
}

size_t ApplyCombiner::RunNext(size_t from, const Waiter& own) {
  if (runner_ != nullptr && batch_[from]->tag != nullptr && batch_.size() - from >= 2) {
    tags_.clear();
    lendable_.clear();
    for (size_t j = from; j < batch_.size(); ++j) {
      tags_.push_back(batch_[j]->tag);
      if (batch_[j] != &own) lendable_.push_back(batch_[j]);
    }
    Helpers helpers(this, lendable_);
    const size_t n = std::min(runner_->RunGroup(tags_, helpers), batch_.size() - from);
    if (n > 0) {
      grouped_.fetch_add(n, std::memory_order_relaxed);
      return n;
    }
  }
  Waiter* w = batch_[from];
  try {
    w->fn(w->task);
  } catch (...) {
    w->error = std::current_exception();
  }
  return 1;
}

size_t ApplyCombiner::RunParts(HelpJob& job) {
  size_t ran = 0;
  for (size_t part = job.next.fetch_add(1, std::memory_order_relaxed); part < job.parts;
       part = job.next.fetch_add(1, std::memory_order_relaxed)) {
    job.fn(job.ctx, part);
    ++ran;
  }
  return ran;
}

void ApplyCombiner::Helpers::ParallelFor(size_t parts, void (*fn)(void*, size_t) noexcept,
                                         void* ctx) {
  if (parts == 0) return;
  HelpJob job;
  job.fn = fn;
  job.ctx = ctx;
  job.parts = parts;
  const size_t lent = std::min(waiters_.size(), parts - 1);
  for (size_t i = 0; i < lent; ++i) {
    waiters_[i]->job = &job;
    Wake(waiters_[i]->state, kHelp);
  }
  RunParts(job);
  // Every part is claimed. A caller that never started is taken back; one that did finishes
  // the part it claimed and returns to kQueued (job, on this stack, must outlive its use).
  for (size_t i = 0; i < lent; ++i) {
    std::atomic<uint32_t>& state = waiters_[i]->state;
    uint32_t expected = kHelp;
    if (state.compare_exchange_strong(expected, kQueued, std::memory_order_acq_rel)) continue;
    for (uint32_t s = state.load(std::memory_order_acquire); s == kHelping;
         s = state.load(std::memory_order_acquire)) {
      state.wait(kHelping, std::memory_order_acquire);
    }
  }
}

// The release store pairs with the waiter's acquire load: what the task wrote is visible to its
// caller. Waking an address whose waiter has already seen the store and returned is harmless:
// the notify reads no memory there, it only wakes whoever sleeps on the address.
void ApplyCombiner::Wake(std::atomic<uint32_t>& state, uint32_t value) {
  state.store(value, std::memory_order_release);
  state.notify_one();
}

void ApplyCombiner::WaitWhileQueued(Waiter& w) {
  for (;;) {
    uint32_t s = w.state.load(std::memory_order_acquire);
    if (s == kQueued) {
      w.state.wait(kQueued, std::memory_order_acquire);
    } else if (s == kHelp) {
      if (w.state.compare_exchange_strong(s, kHelping, std::memory_order_acq_rel)) {
        const size_t ran = RunParts(*w.job);
        helped_.fetch_add(ran, std::memory_order_relaxed);
        w.state.store(kQueued, std::memory_order_release);
        w.state.notify_all();  // the turn holder may wait for this
      }
    } else {
      return;  // kDone or kYourTurn
    }
  }
}

}  // namespace granary::master
