// client/reservation_pool.h - space this client holds ahead of its puts, so that a put is one
// copy and one commit call (the master's ReserveOp / PutCommitOp; docs/master.md, "Reserved
// space").
//
// Promise: Take(size) hands out a reservation of `size` bytes or a little more (never more
// than 1/8 above: sizes share a class, see ClassOf) with at least half of its lease left
// (counted from before the Reserve call was sent), or nothing; each reservation is handed out
// once. A class reserves the largest size taken in it since it was last idle (kIdle), so one
// steady size gets exactly
// its own and many sizes near each other share reservations, each trimmed to its object at
// commit (the master frees the rest: MasterState::ApplyPutCommit). Against a master that
// refuses a smaller object (older than the trim), Take hands out exact sizes only, once told
// (ExactSizesOnly). A caller gives it back with Return only if the master still holds it for
// this client unused (a commit refused for a reason of the key's own); a reservation whose
// write failed or whose commit had an unknown outcome is never returned, and is left to expire:
// the master quarantines it then, so bytes still on their way cannot land in anyone else's space.
// Refill: sizes that were missed, or whose stock a take left at half, are reserved in the
// background, in batches, up to max_bytes in all; reservations past half their lease, and sizes unused for kIdle, are released (this
// client promises not to write them). Close() releases what is held and stops the thread.
// Ownership: the pool owns its thread; the MasterLink must outlive it.
// Thread safety: Take, Return, Close and Stats from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "client/master_link.h"
#include "granary/proto/master.pb.h"

namespace granary::client {

class ReservationPool {
 public:
  using Clock = std::chrono::steady_clock;
  struct Held {
    uint64_t name = 0;  // the master's name for it
    proto::Replica replica;
    Clock::time_point good_until;  // half the lease: not handed out after this
  };
  struct Stats {
    uint64_t taken = 0;
    uint64_t missed = 0;
    uint64_t held = 0;
    uint64_t held_bytes = 0;
  };
  static constexpr std::chrono::seconds kIdle{10};
  static constexpr uint32_t kMaxPerSize = 64;
  // A size whose stock fell to half its target twice within this doubles the target (up to
  // kMaxPerSize and the byte cap): steady puts of one size refill kMaxPerSize / 2 per call.
  static constexpr std::chrono::seconds kGrowWithin{1};
  // A size whose Reserve got nothing is asked again after kMinBackoff, doubling to kMaxBackoff.
  static constexpr std::chrono::milliseconds kMinBackoff{50};
  static constexpr std::chrono::milliseconds kMaxBackoff{1000};

  // max_bytes 0: the pool never reserves (every Take misses).
  ReservationPool(MasterLink* link, std::string client_id, uint64_t max_bytes);
  ~ReservationPool();
  ReservationPool(const ReservationPool&) = delete;
  ReservationPool& operator=(const ReservationPool&) = delete;

  std::optional<Held> Take(uint64_t size);
  // One reservation for each of `sizes` (as Take hands them out), or none at all: then those it
  // took go back, first in their classes, and only the miss is counted (a miss asks for more).
  // Under one lock, so that concurrent batches cannot each take part of the stock and all miss.
  std::optional<std::vector<Held>> TakeAll(std::span<const uint64_t> sizes);
  // The class of a size: it and every size down to 1/8 below it share reservations.
  static uint64_t ClassOf(uint64_t size);
  // The master refused an object smaller than its reservation: exact sizes from now on.
  void ExactSizesOnly();
  void Return(Held held);
  void Close();
  Stats stats() const;

 private:
  struct SizeClass {
    // What a refill reserves: the largest size taken since the class was created (it goes
    // when idle for kIdle).
    uint64_t reserve_size = 0;
    std::deque<Held> ready;  // each at most the class; after ExactSizesOnly, exactly the key
    uint32_t target = 0;
    Clock::time_point last_use{};
    Clock::time_point last_low{};  // when a take last left it at half its target or less
    // After a Reserve that got nothing (store full, cap reached), none before this.
    Clock::time_point retry_after{};
    Clock::duration backoff{};
  };
  std::optional<Held> TakeLocked(uint64_t size, Clock::time_point now);  // mu_ held
  void ReturnLocked(Held held);                                          // mu_ held
  void Run();
  // One pass: release what is stale, then reserve what is wanted. Takes mu_ briefly, calls the
  // master without it.
  void RefillOnce();
  // Each by name and place (the master frees it only if held there).
  void Release(std::vector<Held> held);

  MasterLink* link_;
  const std::string client_id_;
  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool kicked_ = false;
  bool closing_ = false;
  std::map<uint64_t, SizeClass> sizes_;  // by ClassOf, or by exact size after ExactSizesOnly
  bool exact_only_ = false;
  uint64_t held_bytes_ = 0;
  uint64_t held_count_ = 0;
  uint64_t taken_ = 0, missed_ = 0;
  std::thread thread_;
};

}  // namespace granary::client
