// The data server's mount fence and capabilities: EnterMount (an I/O thread's side), SetMount
// (a remount's side) and AdmitCapability (CAP_READ / CAP_WRITE); see data_server.h, "Fencing".
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "common/clock.h"
#include "node/data_server.h"
#include "security/capability.h"
#include "transfer/protocol.h"

namespace granary::node {

using transfer::Opcode;
using transfer::RequestHeader;

// Seq_cst on both sides, Dekker's way: this stores the slot then loads the token, SetMount
// stores the token then loads the slots, so at least one of them sees the other's store: either
// SetMount waits for this slot, or this thread sees the token has changed and backs off.
bool DataServer::EnterMount(FenceSlot& slot, uint64_t token) {
  if (token == 0) return false;  // "no mount": never accepted
  slot.token.store(token, std::memory_order_seq_cst);
  if (token_.load(std::memory_order_seq_cst) == token) return true;
  LeaveMount(slot);
  return false;
}

// CAP_READ / CAP_WRITE: the capability must pass the current mount's key, be unexpired by this
// host's wall clock, carry the opcode's access and cover the range. On OK the request becomes
// that mount's READ or WRITE (its token filled in), so the fence guards it from here on as any.
ErrorCode DataServer::AdmitCapability(DataConn& c, FenceSlot& slot) {
  const transfer::Capability& cap = c.capability;
  RequestHeader& h = c.request;
  const security::CapabilityGrant grant{cap.grant_offset, cap.grant_length, cap.expiry_unix_ms,
                                        static_cast<security::CapabilityAccess>(cap.access)};
  const uint64_t token = token_.load(std::memory_order_seq_cst);
  if (!EnterMount(slot, token)) return ErrorCode::SEGMENT_NOT_FOUND;
  // Inside the fence: SetMount cannot change the key until this thread leaves it.
  const bool genuine = signer_ != nullptr && signer_->Verify(grant, cap.mac);
  LeaveMount(slot);
  if (!genuine || cap.reserved != 0) return ErrorCode::SEGMENT_NOT_FOUND;
  // Deadlines are the master's wall clock, checked against this host's.
  if (WallClock::Instance()->NowMs() > cap.expiry_unix_ms) return ErrorCode::SEGMENT_NOT_FOUND;
  const bool write = h.opcode == Opcode::kCapWrite;
  const auto needed = write ? security::CapabilityAccess::kWrite : security::CapabilityAccess::kRead;
  if (grant.access != needed || !security::CapabilityCovers(grant, h.offset, h.length)) {
    return ErrorCode::PERMISSION_DENIED;
  }
  h.opcode = write ? Opcode::kWrite : Opcode::kRead;
  h.segment_token = token;
  return ErrorCode::OK;
}

Status DataServer::SetMount(uint8_t* base, uint64_t token, std::string_view capability_key) {
  if (base == nullptr && size_ > 0) {
    return Status(ErrorCode::INVALID_PARAMS, "data server given a null segment");
  }
  std::lock_guard lock(mount_mu_);
  token_.store(0, std::memory_order_seq_cst);  // from now on every EnterMount fails
  // Each slot seen empty once is enough: a thread that enters it later sees token 0 and backs
  // off. A slot is held only across one non-blocking system call, so this takes microseconds.
  const int64_t deadline = MonotonicNs() + int64_t{kFenceWaitMs} * 1'000'000;
  const size_t slots = std::max<size_t>(options_.io_threads, 1);
  for (size_t i = 0; i < slots; ++i) {
    for (int spins = 0; fence_slots_[i].token.load(std::memory_order_seq_cst) != 0; ++spins) {
      if (MonotonicNs() >= deadline) {
        return Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                      "data server: an I/O thread stayed inside the previous mount's memory for " +
                          std::to_string(kFenceWaitMs) + " ms; every request is refused for now");
      }
      if (spins < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }
  base_.store(base, std::memory_order_release);
  signer_ = capability_key.empty()
                ? nullptr
                : std::make_unique<security::CapabilitySigner>(capability_key);
  token_.store(token, std::memory_order_seq_cst);
  return Status::Ok();
}

}  // namespace granary::node
