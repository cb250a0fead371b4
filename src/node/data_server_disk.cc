// The data server's disk-tier and staging requests (DISK_READ, DISK_STAGE, STAGE_RELEASE,
// STAGE_INFO): see data_server.h. DISK_READ and DISK_STAGE run on a disk thread, which blocks on
// the disk and on the peer (a bounded poll); the STAGE_* answers are built on the I/O thread.
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/logging.h"
#include "node/data_server.h"
#include "transfer/iovec.h"
#include "transfer/protocol.h"

namespace granary::node {

using transfer::Opcode;
using transfer::RequestHeader;
using transfer::ResponseHeader;
using Phase = DataConn::Phase;

bool DataServer::SendUntil(DataConn& c, iovec* iov, int iovcnt, int64_t deadline) {
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    ssize_t r = sendmsg(c.fd, &msg, MSG_NOSIGNAL);
    if (r > 0) {
      transfer::ConsumeIov(&iov, &iovcnt, static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return false;
    // Full socket buffer: wait for room, at most idle_timeout_ms and never past the deadline.
    const int64_t left_ms = (deadline - MonotonicNs()) / 1'000'000;
    if (left_ms <= 0) {
      timeouts_++;
      return false;
    }
    pollfd pfd{c.fd, POLLOUT, 0};
    int n = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left_ms, options_.idle_timeout_ms)));
    if (n == 0) {
      timeouts_++;
      return false;
    }
    if (n < 0 && errno != EINTR) return false;
  }
  return true;
}

bool DataServer::SendAnswerUntil(DataConn& c, int64_t deadline, uint64_t id, ErrorCode status,
                                 const uint8_t* payload, uint64_t length) {
  ResponseHeader rh;
  rh.status = static_cast<int32_t>(status);
  rh.request_id = id;
  rh.length = length;
  iovec iov[2] = {{&rh, sizeof(rh)}, {const_cast<uint8_t*>(payload), length}};
  return SendUntil(c, iov, length > 0 ? 2 : 1, deadline);
}

void DataServer::ExpireQueuedDisk(DataConn& c) {
  timeouts_++;
  CountError(ErrorReason::kTimeout);
  GLOG_DEBUG("data server: a {} waited past its deadline for a disk thread",
             c.request.opcode == transfer::Opcode::kDiskRead ? "DISK_READ" : "DISK_STAGE");
  // One non-blocking try (the header fits any socket buffer a live peer leaves): the client gets
  // a clear refusal instead of a bare close; closing anyway frees the body and the descriptor.
  ResponseHeader rh;
  rh.status = static_cast<int32_t>(ErrorCode::RPC_TIMEOUT);
  rh.request_id = c.request.request_id;
  rh.length = 0;
  ssize_t ignored = send(c.fd, &rh, sizeof(rh), MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)ignored;
  Close(c);
}

Result<std::vector<DiskReadService::Entry>> DataServer::ParseDiskBatch(
    const RequestHeader& h, std::span<const uint8_t> body, const char* op, bool has_tier,
    const Status& missing) {
  if (h.offset != 0 || h.segment_token != 0) {
    return Status(ErrorCode::INVALID_PARAMS,
                  std::string(op) + " with an offset or a segment token");
  }
  if (!has_tier) return Status(ErrorCode::OBJECT_NOT_FOUND, "this node has no disk tier");
  if (!missing.ok()) return missing;
  return DiskReadService::Parse(body);
}

bool DataServer::StartDiskBatch(DataConn& c, int64_t deadline, const char* op,
                                const Result<std::vector<DiskReadService::Entry>>& entries,
                                bool* serve) {
  *serve = false;
  if (!entries.ok()) {
    CountError(ErrorReason::kDiskRefused);
    GLOG_DEBUG("data server refused a {}: {}", op, entries.status().ToString());
    return SendAnswerUntil(c, deadline, c.request.request_id, entries.status().code(), nullptr,
                           0);
  }
  ResponseHeader head;
  head.status = 0;
  head.request_id = c.request.request_id;
  head.length = entries->size();
  iovec iov{&head, sizeof(head)};
  if (!SendUntil(c, &iov, 1, deadline)) return false;
  *serve = true;
  return true;
}

bool DataServer::ServeDiskRead(DataConn& c) {
  DiskReadService* reads = disk_reads_.load(std::memory_order_acquire);
  Result<std::vector<DiskReadService::Entry>> entries =
      ParseDiskBatch(c.request, c.body, "DISK_READ", reads != nullptr, Status::Ok());
  bool serve = false;
  if (!StartDiskBatch(c, c.request_start_ns + BudgetNs(0), "DISK_READ", entries, &serve)) {
    return false;
  }
  if (!serve) return true;
  // The deadline runs from the request's first byte and grows only by the bytes really sent:
  // sizes the asker claims (made-up entries get no bytes) must not keep a stalled peer for hours.
  uint64_t answered = 0;
  return reads->Serve(*entries, [&](uint32_t index, ErrorCode code,
                                    std::span<const std::byte> bytes) {
    if (code != ErrorCode::OK) CountError(ErrorReason::kDiskEntry);
    disk_bytes_read_ += bytes.size();  // counted first: the client may look once it has them
    Op(transfer::Opcode::kDiskRead).bytes->Inc(bytes.size());
    answered += bytes.size();
    const int64_t deadline = c.request_start_ns + BudgetNs(answered);
    if (!SendAnswerUntil(c, deadline, index, code, reinterpret_cast<const uint8_t*>(bytes.data()),
                         bytes.size())) {
      CountError(ErrorReason::kPeerClosed);
      return false;
    }
    return true;
  });
}

// DISK_STAGE: DISK_READ's body and framing, but an OK entry's payload is where its bytes are.
bool DataServer::ServeDiskStage(DataConn& c) {
  DiskReadService* reads = disk_reads_.load(std::memory_order_acquire);
  ShmStaging* staging = staging_.load(std::memory_order_acquire);
  Result<std::vector<DiskReadService::Entry>> entries = ParseDiskBatch(
      c.request, c.body, "DISK_STAGE", reads != nullptr,
      staging != nullptr ? Status::Ok()
                         : Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                                  "this node has no staging region"));
  bool serve = false;
  if (!StartDiskBatch(c, c.request_start_ns + BudgetNs(0), "DISK_STAGE", entries, &serve)) {
    return false;
  }
  if (!serve) return true;
  // Only slot descriptions go out, but the disk reads take their time: the deadline, from the
  // request's first byte, grows by the bytes really staged (not by the sizes the asker claims).
  uint64_t staged = 0;
  const uint64_t token = staging->token();
  return reads->ServeStaged(
      *entries, staging, c.id,
      [&](uint32_t index, ErrorCode code, const ShmStaging::Grant* grant) {
        transfer::StagedSlot slot;
        if (code == ErrorCode::OK) {
          slot.region_token = token;
          slot.offset = grant->offset;
          slot.length = (*entries)[index].size;
          slot.slot = grant->slot;
          slot.generation = grant->generation;
          disk_bytes_staged_ += slot.length;
          Op(transfer::Opcode::kDiskStage).bytes->Inc(slot.length);
          staged += slot.length;
        } else {
          CountError(ErrorReason::kDiskEntry);
        }
        const bool ok = code == ErrorCode::OK;
        const int64_t deadline = c.request_start_ns + BudgetNs(staged);
        if (!SendAnswerUntil(c, deadline, index, code, reinterpret_cast<const uint8_t*>(&slot),
                             ok ? sizeof(slot) : 0)) {
          CountError(ErrorReason::kPeerClosed);
          return false;
        }
        return true;
      });
}

// STAGE_RELEASE: each ref is judged alone; only this connection's handed slots are freed.
void DataServer::ServeStageRelease(DataConn& c) {
  const RequestHeader& h = c.request;
  const std::vector<uint8_t>& body = c.body;
  ShmStaging* staging = staging_.load(std::memory_order_acquire);
  transfer::StageReleaseBody rb;
  ErrorCode refusal = ErrorCode::OK;
  if (staging == nullptr) {
    refusal = ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  } else if (h.offset != 0 || h.segment_token != 0 || body.size() < sizeof(rb)) {
    refusal = ErrorCode::INVALID_PARAMS;
  } else {
    std::memcpy(&rb, body.data(), sizeof(rb));
    if (rb.reserved != 0 || rb.count == 0 || rb.count > transfer::kMaxStageRelease ||
        body.size() != sizeof(rb) + uint64_t{rb.count} * sizeof(transfer::SlotRef)) {
      refusal = ErrorCode::INVALID_PARAMS;
    }
  }
  if (refusal != ErrorCode::OK) {
    CountError(ErrorReason::kStaging);
    Respond(c, refusal, nullptr, 0);
    return;
  }
  c.out.resize(uint64_t{rb.count} * sizeof(int32_t));
  for (uint32_t i = 0; i < rb.count; ++i) {
    transfer::SlotRef ref;
    std::memcpy(&ref, body.data() + sizeof(rb) + i * sizeof(ref), sizeof(ref));
    const ErrorCode code = ref.reserved != 0 ? ErrorCode::INVALID_PARAMS
                                             : staging->Release(ref.slot, ref.generation, c.id);
    if (code != ErrorCode::OK) CountError(ErrorReason::kStaging);
    const int32_t wire = static_cast<int32_t>(code);
    std::memcpy(c.out.data() + i * sizeof(wire), &wire, sizeof(wire));
  }
  Respond(c, ErrorCode::OK, c.out.data(), c.out.size());
}

void DataServer::ServeStageInfo(DataConn& c) {
  ShmStaging* staging = staging_.load(std::memory_order_acquire);
  if (staging == nullptr || disk_reads_.load(std::memory_order_acquire) == nullptr) {
    CountError(ErrorReason::kStaging);
    Respond(c, ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, nullptr, 0);
    return;
  }
  transfer::StageInfo info;
  info.region_token = staging->token();
  info.data_bytes = staging->data_bytes();
  info.slot_count = staging->slot_count();
  info.name_len = static_cast<uint32_t>(staging->name().size());
  c.out.resize(sizeof(info) + info.name_len);
  std::memcpy(c.out.data(), &info, sizeof(info));
  std::memcpy(c.out.data() + sizeof(info), staging->name().data(), info.name_len);
  Respond(c, ErrorCode::OK, c.out.data(), c.out.size());
}

// A DISK_* or STAGE_RELEASE body is in: answer STAGE_RELEASE here, hand disk work to a disk
// thread (it blocks on the disk; this thread must not).
DataServer::Next DataServer::FinishBody(DataConn& c) {
  if (c.request.opcode == Opcode::kStageRelease) {
    ServeStageRelease(c);
    FreeBody(c);
    return Next::kRead;
  }
  c.phase = Phase::kDisk;
  // Queued, it keeps the request's deadline: past it, the timer or the disk thread that takes
  // it answers RPC_TIMEOUT and closes (ExpireQueuedDisk), so a long queue holds nothing longer.
  c.deadline_ns.store(c.request_start_ns + BudgetNs(0), std::memory_order_relaxed);
  ConnPtr self = Find(c.id);
  std::lock_guard lock(disk_mu_);
  disk_queue_.push_back(std::move(self));
  disk_cv_.notify_one();
  return Next::kHandedOff;
}

void DataServer::DiskLoop() {
  while (true) {
    ConnPtr conn;
    {
      std::unique_lock lock(disk_mu_);
      disk_cv_.wait(lock, [&] { return disk_stopping_ || !disk_queue_.empty(); });
      if (disk_stopping_) return;  // Stop() closes whatever is still queued
      conn = std::move(disk_queue_.front());
      disk_queue_.pop_front();
    }
    if (conn == nullptr) continue;
    std::lock_guard lock(conn->mu);
    if (conn->closed) continue;
    if (MonotonicNs() >= conn->deadline_ns.load(std::memory_order_relaxed)) {
      ExpireQueuedDisk(*conn);  // waited past its deadline before the timer saw it
      continue;
    }
    const bool ok = conn->request.opcode == Opcode::kDiskRead ? ServeDiskRead(*conn)
                                                              : ServeDiskStage(*conn);
    if (!ok) {
      Close(*conn);
      continue;
    }
    ObserveAnswered(*conn);
    conn->phase = Phase::kHeader;
    FreeBody(*conn);
    conn->last_progress_ns = MonotonicNs();
    Rearm(*conn, Next::kRead);
  }
}

}  // namespace granary::node
