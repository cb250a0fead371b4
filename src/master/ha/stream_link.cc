#include "master/ha/stream_link.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common/socket_io.h"
#include "master/ha/stream_wire.h"
#include "proto/fast_frame.h"

namespace granary::master::ha {

namespace {
using SteadyClock = std::chrono::steady_clock;
constexpr uint32_t kMaxAckBody = 64;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             SteadyClock::now().time_since_epoch())
      .count();
}
}  // namespace

StreamLink::StreamLink(net::ByteStream* conn, ReplicationLog* log, uint64_t next_seq,
                       std::chrono::milliseconds io_timeout, size_t max_batch_bytes, OnAck on_ack)
    : conn_(conn),
      log_(log),
      io_timeout_(io_timeout),
      max_batch_bytes_(max_batch_bytes),
      on_ack_(std::move(on_ack)),
      next_seq_(next_seq),
      last_ack_ns_(NowNs()) {}

Status StreamLink::Flush() {
  std::lock_guard lock(send_mu_);
  for (;;) {  // bounded: each pass sends a batch further along the log, or ends
    if (broken_.load()) return Status(ErrorCode::RPC_FAIL, "the stream is closed");
    batch_.assign(1, static_cast<char>(FrameKind::kOps));
    uint64_t last = 0;
    const auto r = log_->Read(next_seq_, max_batch_bytes_, std::chrono::milliseconds(0), &batch_,
                              &last);
    if (r == ReplicationLog::ReadResult::kTimeout) return Status::Ok();  // all sent
    if (r == ReplicationLog::ReadResult::kTooOld) {
      return Status(ErrorCode::OBJECT_NOT_FOUND, "the log no longer holds operation " +
                                                     std::to_string(next_seq_));
    }
    if (r != ReplicationLog::ReadResult::kOk) {
      return Status(ErrorCode::RPC_FAIL, "the log is closed");
    }
    if (Status s = SendFrame(*conn_, batch_, SteadyClock::now() + io_timeout_); !s.ok()) {
      broken_ = true;
      return s;
    }
    next_seq_ = last + 1;
  }
}

Status StreamLink::SendBeat(uint64_t term, uint64_t last_seq) {
  std::lock_guard lock(send_mu_);
  if (broken_.load()) return Status(ErrorCode::RPC_FAIL, "the stream is closed");
  Status s = SendFrame(*conn_, Encode(FrameKind::kBeat, Beat{term, last_seq}),
                       SteadyClock::now() + io_timeout_);
  if (!s.ok()) broken_ = true;
  return s;
}

Status StreamLink::SendRefusal(const std::string& why) {
  std::lock_guard lock(send_mu_);
  if (broken_.load()) return Status(ErrorCode::RPC_FAIL, "the stream is closed");
  return SendFrame(*conn_, Encode(FrameKind::kRefuse, std::string(why)),
                   SteadyClock::now() + io_timeout_);
}

uint64_t StreamLink::sent() const {
  std::lock_guard lock(send_mu_);
  return next_seq_ - 1;
}

StreamLink::SteadyTime StreamLink::last_ack() const {
  return SteadyTime(std::chrono::nanoseconds(last_ack_ns_.load()));
}

Status StreamLink::ReadAcks(SteadyTime until, bool wait) {
  char buf[4096];
  bool got = false;
  for (;;) {  // bounded: each pass reads, or waits once toward `until`, or returns
    if (broken_.load()) return Status(ErrorCode::RPC_FAIL, "the stream is closed");
    Result<size_t> n = conn_->RecvSome(buf, sizeof(buf));
    if (!n.ok()) return Status(ErrorCode::RPC_FAIL, "the standby's stream: " + n.status().message());
    if (*n > 0) {
      inbox_.append(buf, *n);
      got = true;
      continue;
    }
    // Nothing more for now: hand out the whole frames, then wait if asked and none came.
    size_t pos = 0;
    while (inbox_.size() - pos >= fast::kHeaderSize) {  // bounded by the bytes held
      fast::Header h;
      const auto* head = reinterpret_cast<const unsigned char*>(inbox_.data() + pos);
      if (fast::DecodeHeader(head, &h, kMaxAckBody) != fast::HeaderError::kNone ||
          h.method != static_cast<uint8_t>(fast::Method::kReplicate)) {
        return Status(ErrorCode::RPC_FAIL, "malformed ack frame");
      }
      if (inbox_.size() - pos < fast::kHeaderSize + h.body_size) break;
      Ack ack;
      if (!Decode(std::string_view(inbox_).substr(pos + fast::kHeaderSize, h.body_size),
                  FrameKind::kAck, &ack)) {
        return Status(ErrorCode::RPC_FAIL, "malformed ack");
      }
      pos += fast::kHeaderSize + h.body_size;
      if (ack.last_seq > acked_.load()) acked_.store(ack.last_seq);
      last_ack_ns_.store(NowNs());
      acked_once_ = true;
      on_ack_(ack.last_seq);
    }
    inbox_.erase(0, pos);
    if (got || !wait) return Status::Ok();
    if (!conn_->WaitReadable(until)) return Status::Ok();  // nothing by `until`
    wait = false;  // one wait per call: the caller decides whether to go on
  }
}

bool StreamLink::driven_lately(std::chrono::milliseconds window) const {
  return drivers_.load() > 0 ||
         NowNs() - last_drive_ns_.load() < std::chrono::nanoseconds(window).count();
}

bool StreamLink::Drive(uint64_t seq, SteadyTime until) {
  drivers_.fetch_add(1);
  last_drive_ns_.store(NowNs());
  struct Leave {
    std::atomic<int>& n;
    ~Leave() { n.fetch_sub(1); }
  } leave{drivers_};
  if (!read_mu_.try_lock()) return false;
  std::lock_guard lock(read_mu_, std::adopt_lock);
  while (acked_.load() < seq && !broken_.load() && SteadyClock::now() < until) {  // bounded
    if (!ReadAcks(until, true).ok()) {
      broken_ = true;
      conn_->Shutdown();
    }
  }
  return true;
}

void StreamLink::Poll() {
  if (!read_mu_.try_lock()) return;
  std::lock_guard lock(read_mu_, std::adopt_lock);
  if (!ReadAcks(SteadyClock::now(), false).ok()) {
    broken_ = true;
    conn_->Shutdown();
  }
}

void StreamLink::Close() {
  broken_ = true;
  conn_->Shutdown();  // wakes a reader or sender blocked on the socket
  // Whoever is sending or reading now finishes; nobody touches the socket after this returns.
  std::lock_guard send(send_mu_);
  std::lock_guard read(read_mu_);
}

}  // namespace granary::master::ha
