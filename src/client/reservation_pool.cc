#include "client/reservation_pool.h"

#include <algorithm>
#include <bit>

namespace granary::client {

ReservationPool::ReservationPool(MasterLink* link, std::string client_id, uint64_t max_bytes)
    : link_(link), client_id_(std::move(client_id)), max_bytes_(max_bytes) {
  if (max_bytes_ > 0) thread_ = std::thread([this] { Run(); });
}

ReservationPool::~ReservationPool() { Close(); }

uint64_t ReservationPool::ClassOf(uint64_t size) {
  // Sizes with the same top four bits, rounded up: 8 classes per power of two, like the
  // allocator's own (master/space/offset_allocator.h). Below 16 every size is its own class.
  const int shift = std::max(0, static_cast<int>(std::bit_width(size)) - 4);
  const uint64_t step = uint64_t{1} << shift;
  const uint64_t rounded = (size + step - 1) / step * step;
  return rounded < size ? size : rounded;  // a size near 2^64: its own class
}

void ReservationPool::ExactSizesOnly() {
  std::lock_guard lock(mu_);
  if (exact_only_) return;
  exact_only_ = true;
  // What each class holds is filed under its own size, where exact takes look.
  std::map<uint64_t, SizeClass> by_class;
  by_class.swap(sizes_);
  for (auto& [key, cls] : by_class) {
    for (Held& h : cls.ready) {
      SizeClass& exact = sizes_[h.replica.length()];
      exact.reserve_size = h.replica.length();
      exact.last_use = cls.last_use;
      exact.ready.push_back(std::move(h));
    }
  }
}

std::optional<ReservationPool::Held> ReservationPool::Take(uint64_t size) {
  if (max_bytes_ == 0 || size == 0) return std::nullopt;
  std::lock_guard lock(mu_);
  if (closing_) return std::nullopt;
  return TakeLocked(size, Clock::now());
}

std::optional<std::vector<ReservationPool::Held>> ReservationPool::TakeAll(
    std::span<const uint64_t> sizes) {
  if (max_bytes_ == 0 || sizes.empty()) return std::nullopt;
  std::lock_guard lock(mu_);
  if (closing_) return std::nullopt;
  const Clock::time_point now = Clock::now();
  std::vector<Held> taken;
  taken.reserve(sizes.size());
  for (uint64_t size : sizes) {
    std::optional<Held> held = size == 0 ? std::nullopt : TakeLocked(size, now);
    if (!held) {
      // Back in reverse, each first in its class: the stock is as it was.
      for (auto h = taken.rbegin(); h != taken.rend(); ++h) ReturnLocked(std::move(*h));
      taken_ -= taken.size();
      return std::nullopt;
    }
    taken.push_back(std::move(*held));
  }
  return taken;
}

std::optional<ReservationPool::Held> ReservationPool::TakeLocked(uint64_t size,
                                                                 Clock::time_point now) {
  SizeClass& cls = sizes_[exact_only_ ? size : ClassOf(size)];
  cls.last_use = now;
  cls.reserve_size = std::max(cls.reserve_size, size);
  // The oldest that fits. One past half its lease is left for the refill pass to release, never
  // handed out; so is, after ExactSizesOnly, one of another size.
  auto fits = std::find_if(cls.ready.begin(), cls.ready.end(), [&](const Held& h) {
    return h.good_until > now && h.replica.length() >= size &&
           (!exact_only_ || h.replica.length() == size);
  });
  if (fits != cls.ready.end()) {
    Held held = std::move(*fits);
    cls.ready.erase(fits);
    held_count_--;
    held_bytes_ -= held.replica.length();
    taken_++;
    if (cls.ready.size() <= cls.target / 2) {
      // A size taken steadily reaches its low mark again soon: it gets a deeper stock, so that
      // refills come in batches (a target of 2 cost one Reserve call per put).
      if (now - cls.last_low < kGrowWithin) {
        cls.target = static_cast<uint32_t>(std::min<uint64_t>(
            {uint64_t{cls.target} * 2, kMaxPerSize,
             std::max<uint64_t>(2, max_bytes_ / cls.reserve_size)}));
      }
      cls.last_low = now;
      kicked_ = true;
      wake_.notify_one();
    }
    return held;
  }
  missed_++;
  const uint64_t fit = max_bytes_ / cls.reserve_size;
  cls.target = static_cast<uint32_t>(
      std::min<uint64_t>({std::max<uint64_t>(2, uint64_t{cls.target} * 2), kMaxPerSize, fit}));
  kicked_ = true;
  wake_.notify_one();
  return std::nullopt;
}

void ReservationPool::Return(Held held) {
  std::unique_lock lock(mu_);
  if (closing_) {
    lock.unlock();
    std::vector<Held> one;
    one.push_back(std::move(held));
    Release(std::move(one));
    return;
  }
  ReturnLocked(std::move(held));
}

void ReservationPool::ReturnLocked(Held held) {
  const uint64_t size = held.replica.length();
  SizeClass& cls = sizes_[exact_only_ ? size : ClassOf(size)];
  cls.reserve_size = std::max(cls.reserve_size, size);
  cls.ready.push_front(std::move(held));  // the oldest lease goes first
  held_count_++;
  held_bytes_ += size;
}

void ReservationPool::Close() {
  {
    std::lock_guard lock(mu_);
    if (closing_) return;
    closing_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<Held> held;
  {
    std::lock_guard lock(mu_);
    for (auto& [size, cls] : sizes_) {
      for (Held& h : cls.ready) held.push_back(std::move(h));
    }
    sizes_.clear();
    held_count_ = 0;
    held_bytes_ = 0;
  }
  Release(std::move(held));
}

ReservationPool::Stats ReservationPool::stats() const {
  std::lock_guard lock(mu_);
  return {taken_, missed_, held_count_, held_bytes_};
}

void ReservationPool::Run() {
  std::unique_lock lock(mu_);
  while (!closing_) {
    wake_.wait_for(lock, std::chrono::seconds(1), [this] { return kicked_ || closing_; });
    if (closing_) break;
    kicked_ = false;
    lock.unlock();
    RefillOnce();
    lock.lock();
  }
}

void ReservationPool::RefillOnce() {
  std::vector<Held> stale;
  struct Wanted {
    uint64_t key;   // the class in sizes_
    uint64_t size;  // what each reservation holds
    uint32_t count;
  };
  std::vector<Wanted> wanted;
  {
    std::lock_guard lock(mu_);
    const Clock::time_point now = Clock::now();
    for (auto it = sizes_.begin(); it != sizes_.end();) {
      SizeClass& cls = it->second;
      const bool idle = now - cls.last_use > kIdle;
      // Takes may skip a reservation (too small for them, or not exact after ExactSizesOnly):
      // the whole stock is looked at, not only its front.
      auto keep = std::stable_partition(cls.ready.begin(), cls.ready.end(), [&](const Held& h) {
        return !idle && h.good_until > now;
      });
      for (auto h = keep; h != cls.ready.end(); ++h) {
        held_count_--;
        held_bytes_ -= h->replica.length();
        stale.push_back(std::move(*h));
      }
      cls.ready.erase(keep, cls.ready.end());
      if (idle) {
        it = sizes_.erase(it);
        continue;
      }
      ++it;
    }
    uint64_t room = max_bytes_ - std::min(max_bytes_, held_bytes_);
    for (const auto& [key, cls] : sizes_) {
      // Reservations smaller than the class's size now serve only smaller objects: they do
      // not count toward its stock (they still count in the bytes held).
      const uint64_t fit = static_cast<uint64_t>(
          std::count_if(cls.ready.begin(), cls.ready.end(),
                        [&](const Held& h) { return h.replica.length() >= cls.reserve_size; }));
      if (fit >= cls.target || now < cls.retry_after || cls.reserve_size == 0) continue;
      const uint64_t count = std::min<uint64_t>(cls.target - fit, room / cls.reserve_size);
      if (count == 0) continue;
      wanted.push_back({key, cls.reserve_size, static_cast<uint32_t>(count)});
      room -= count * cls.reserve_size;
    }
  }
  Release(std::move(stale));
  for (const auto& [key, size, count] : wanted) {
    proto::ReserveRequest req;
    req.set_client_id(client_id_);
    req.set_size(size);
    req.set_count(count);
    proto::ReserveResponse resp;
    const Clock::time_point sent = Clock::now();  // the lease runs from the master's grant, later
    const bool granted = link_->Reserve(req, &resp).ok() && resp.granted_size() > 0;
    {
      std::lock_guard lock(mu_);
      if (auto cls = sizes_.find(key); cls != sizes_.end()) {
        cls->second.backoff =
            granted ? Clock::duration{}
                    : std::clamp<Clock::duration>(2 * cls->second.backoff, kMinBackoff, kMaxBackoff);
        cls->second.retry_after = Clock::now() + cls->second.backoff;
      }
    }
    if (!granted) continue;
    const Clock::time_point good_until =
        sent + std::chrono::milliseconds(static_cast<int64_t>(resp.ttl_ms() / 2));
    std::vector<Held> refused;
    {
      std::lock_guard lock(mu_);
      for (auto& g : *resp.mutable_granted()) {
        // Without its replica (segment gone since) it cannot be named by place: left to expire.
        if (!g.has_replica()) continue;
        // After Close, or of another size: useless.
        if (closing_ || g.replica().length() != size) {
          refused.push_back({g.reservation(), std::move(*g.mutable_replica()), good_until});
          continue;
        }
        sizes_[key].ready.push_back({g.reservation(), std::move(*g.mutable_replica()), good_until});
        held_count_++;
        held_bytes_ += size;
      }
    }
    Release(std::move(refused));
  }
}

void ReservationPool::Release(std::vector<Held> held) {
  if (held.empty()) return;
  proto::ReleaseReservationsRequest req;
  req.set_client_id(client_id_);
  for (const Held& h : held) {
    req.add_reservations(h.name);
    req.add_segment_ids(h.replica.segment_id());
    req.add_offsets(h.replica.offset());
  }
  proto::BatchStatusResponse ignored;  // on failure the leases end and the master takes them back
  (void)link_->ReleaseReservations(req, &ignored);
}

}  // namespace granary::client
