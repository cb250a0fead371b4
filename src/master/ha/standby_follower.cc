#include "master/ha/standby_follower.h"

#include <sys/socket.h>
#include <unistd.h>

#include "common/logging.h"
#include "master/state/state_codec.h"
#include "proto/fast_frame.h"
#include "security/fast_hello.h"

namespace granary::master::ha {

namespace {
using SteadyClock = std::chrono::steady_clock;
constexpr auto kRetry = std::chrono::milliseconds(50);
constexpr auto kRefusedRetry = std::chrono::seconds(1);  // after the leader refused our secret
constexpr auto kSnapshotWait = std::chrono::seconds(300);  // for each chunk of a snapshot
}  // namespace

StandbyFollower::StandbyFollower(MasterState* state, ReplicationLog* log, Options options)
    : state_(state), log_(log), options_(std::move(options)) {}

StandbyFollower::~StandbyFollower() { Stop(); }

void StandbyFollower::Follow(const std::string& host, uint16_t port, uint64_t term) {
  std::lock_guard lock(mu_);
  if (host != host_ || port != port_) {
    host_ = host;
    port_ = port;
    target_++;
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);  // leave the old leader now
  }
  // The same master publishing its term (a taking-over record has none yet) is the same leader.
  term_ = std::max(term_, term);
  if (stop_) {
    if (thread_.joinable()) thread_.join();  // a thread that Stop() ended
    stop_ = false;
    thread_ = std::thread([this] { Run(); });
  }
  changed_.notify_all();
}

void StandbyFollower::Stop() {
  std::thread thread;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    thread.swap(thread_);
  }
  changed_.notify_all();
  if (thread.joinable()) thread.join();
  std::lock_guard lock(mu_);
  progress_.connected = false;
}

Lineage StandbyFollower::lineage() const {
  std::lock_guard lock(mu_);
  return lineage_;
}

void StandbyFollower::set_lineage(Lineage lineage) {
  std::lock_guard lock(mu_);
  lineage_ = std::move(lineage);
}

bool StandbyFollower::state_valid() const {
  std::lock_guard lock(mu_);
  return valid_;
}

void StandbyFollower::set_state_valid(bool valid) {
  std::lock_guard lock(mu_);
  valid_ = valid;
}

StandbyFollower::Progress StandbyFollower::progress() const {
  std::lock_guard lock(mu_);
  Progress p = progress_;
  p.applied = state_->last_seq();
  return p;
}

void StandbyFollower::Run() {
  for (;;) {  // ends at Stop(); every pass connects once or waits kRetry
    std::string host;
    uint16_t port = 0;
    uint64_t term = 0, target = 0;
    {
      std::unique_lock lock(mu_);
      if (stop_) return;
      if (port_ == 0) {
        changed_.wait_for(lock, kRetry);
        continue;
      }
      host = host_;
      port = port_;
      term = term_;
      target = target_;
    }
    Result<int> fd = net::ConnectTcp(host, port, SteadyClock::now() + options_.timeout);
    if (fd.ok()) {
      {
        std::lock_guard lock(mu_);
        if (stop_ || target != target_) {
          ::close(*fd);
          continue;
        }
        fd_ = *fd;
      }
      std::unique_ptr<net::ByteStream> conn;
      if (options_.tls != nullptr) {
        auto secured = options_.tls->Connect(*fd, host, SteadyClock::now() + options_.timeout);
        if (secured.ok()) {
          conn = std::move(*secured);
        } else if (refusals_++ % 30 == 0) {  // an operator's fault, as a wrong secret
          GLOG_ERROR("history stream: {}", secured.status().ToString());
        }
      } else {
        conn = std::make_unique<net::ByteStream>(*fd, /*owns_fd=*/true);
      }
      if (conn != nullptr) Session(*conn, term);
      {
        std::lock_guard lock(mu_);
        fd_ = -1;
        progress_.connected = false;
      }
      conn.reset();  // closes the socket (a failed handshake closed it already)
    }
    std::unique_lock lock(mu_);
    if (stop_) return;
    changed_.wait_for(lock, refusals_ > 0 ? kRefusedRetry : kRetry,
                      [&] { return stop_ || target != target_; });
  }
}

Status StandbyFollower::SendAck(net::ByteStream& conn, uint64_t seq) {
  return SendFrame(conn, Encode(FrameKind::kAck, ha::Ack{seq}),
                   SteadyClock::now() + options_.timeout, false);
}

void StandbyFollower::Session(net::ByteStream& conn, uint64_t term) {
  const auto deadline = [&] { return SteadyClock::now() + options_.timeout; };
  if (!options_.secret.empty()) {
    if (Status s = security::PresentSecret(conn, options_.secret, deadline()); !s.ok()) {
      // A wrong secret is an operator's fault that retrying does not mend: said once, then
      // every 30th try (a second apart).
      if (s.code() == ErrorCode::UNAUTHENTICATED) {
        if (refusals_++ % 30 == 0) {
          GLOG_ERROR("history stream: the leader refused this standby's secret ({} times): {}",
                     refusals_, s.ToString());
        }
      } else {
        GLOG_WARN("history stream: no hello answered: {}", s.ToString());
      }
      return;
    }
    refusals_ = 0;
  }
  Hello hello;
  hello.standby_id = options_.id;
  hello.advertise = options_.advertise;
  hello.last_seq = state_->last_seq();
  {
    std::lock_guard lock(mu_);
    if (valid_) hello.lineage = lineage_;  // none: our history matches nobody's (a snapshot)
  }
  if (!SendFrame(conn, Encode(FrameKind::kHello, hello), deadline(), true).ok()) return;
  Result<std::string> frame = ReadFrame(conn, fast::kMaxFastBody, deadline());
  Welcome welcome;
  if (!frame.ok() || !Decode(*frame, FrameKind::kWelcome, &welcome)) {
    if (!frame.ok()) GLOG_DEBUG("history stream: no welcome: {}", frame.status().ToString());
    return;
  }
  if (welcome.term < term) {
    GLOG_WARN("history stream: the master at the leader's address leads term {}, not {}",
              welcome.term, term);
    return;
  }
  if (welcome.snapshot) {
    std::string snapshot;
    for (;;) {  // bounded: each chunk advances the offset, or the session ends
      // The leader encodes a large state before its first chunk (seconds for millions of
      // objects): waiting only the stream's timeout for it would start over, forever.
      frame = ReadFrame(conn, fast::kMaxFastReply, SteadyClock::now() + kSnapshotWait);
      SnapshotChunk chunk;
      if (!frame.ok() || !Decode(*frame, FrameKind::kSnapshotChunk, &chunk) ||
          chunk.offset != snapshot.size() || chunk.total < chunk.offset + chunk.bytes.size()) {
        GLOG_WARN("history stream: snapshot transfer broken");
        return;
      }
      if (snapshot.empty()) snapshot.reserve(chunk.total);
      snapshot.append(chunk.bytes);
      if (snapshot.size() == chunk.total) break;
    }
    if (Status s = state_->LoadSnapshot(snapshot, /*adopt_policy=*/true); !s.ok()) {
      GLOG_ERROR("history stream: the leader's snapshot does not load: {}", s.ToString());
      return;
    }
    log_->Reset(state_->last_seq());
    std::lock_guard lock(mu_);
    valid_ = true;
    lineage_ = welcome.lineage;
    progress_.term = welcome.term;  // with the count: progress() never shows one without the other
    progress_.snapshots++;
    GLOG_INFO("standby: loaded the leader's snapshot at seq {} ({} bytes)", state_->last_seq(),
              snapshot.size());
  } else {
    std::lock_guard lock(mu_);
    lineage_ = welcome.lineage;  // the leader checked that ours is a prefix of it
  }
  {
    std::lock_guard lock(mu_);
    progress_.connected = true;
    progress_.term = welcome.term;
  }
  if (!SendAck(conn, state_->last_seq()).ok()) return;
  // Operations are acknowledged as they arrive and applied by a second thread, in order: a reply
  // on the leader waits for one network round trip, not for this state's apply as well. A
  // received operation is as good as an applied one for a failover: promotion (Stop) first
  // applies everything received.
  Applier applier(this);
  uint64_t received = state_->last_seq();
  for (;;) {  // ends when the stream does; every read is bounded by the timeout
    if (applier.failed()) return;
    frame = ReadFrame(conn, fast::kMaxFastReply, deadline());
    if (!frame.ok()) {
      GLOG_INFO("history stream from the leader of term {} ended: {}", welcome.term,
                frame.status().ToString());
      return;
    }
    switch (KindOf(*frame)) {
      case FrameKind::kOps: {
        auto records = SplitOps(std::string_view(*frame).substr(1));
        if (!records.ok() || records->empty()) return;
        Decoder last(records->back());
        uint64_t seq = 0;
        last(seq);
        if (!last.ok()) return;
        if (seq <= received) {
          // Operations we hold already: our history is not the one this leader streams.
          GLOG_ERROR("history stream: the leader sent operations up to {}, this state is at {}: "
                     "it starts over from a snapshot",
                     seq, received);
          set_state_valid(false);
          return;
        }
        received = seq;
        applier.Push(std::move(*frame));
        break;
      }
      case FrameKind::kBeat: {
        Beat beat;
        if (!Decode(*frame, FrameKind::kBeat, &beat)) return;
        std::lock_guard lock(mu_);
        progress_.leader_last = beat.last_seq;
        break;
      }
      default:
        GLOG_INFO("history stream: the leader ended it");
        return;
    }
    {
      std::lock_guard lock(mu_);
      progress_.leader_last = std::max(progress_.leader_last, received);
    }
    if (!SendAck(conn, received).ok()) return;
  }
}

StandbyFollower::Applier::Applier(StandbyFollower* follower)
    : follower_(follower), thread_([this] { Run(); }) {}

StandbyFollower::Applier::~Applier() {
  {
    std::lock_guard lock(mu_);
    closing_ = true;
  }
  changed_.notify_all();
  thread_.join();  // after every frame received was applied (or one failed)
}

void StandbyFollower::Applier::Push(std::string frame) {
  std::unique_lock lock(mu_);
  // Bounded: a receiver far ahead of the applier waits (and TCP holds the leader back).
  changed_.wait(lock, [&] { return failed_ || queued_bytes_ < kMaxQueuedBytes; });
  if (failed_) return;
  queued_bytes_ += frame.size();
  queue_.push_back(std::move(frame));
  changed_.notify_all();
}

bool StandbyFollower::Applier::failed() const {
  std::lock_guard lock(mu_);
  return failed_;
}

void StandbyFollower::Applier::Run() {
  for (;;) {  // ends once closing and drained, or at the first refused operation
    std::string frame;
    {
      std::unique_lock lock(mu_);
      changed_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;
      frame = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= frame.size();
      changed_.notify_all();
    }
    auto records = SplitOps(std::string_view(frame).substr(1));
    for (std::string_view record : *records) {  // split once already by the receiver
      Result<Operation> op = DecodeOperation(record);
      Result<OpResult> applied =
          op.ok() ? follower_->state_->Replay(*op) : Result<OpResult>(op.status());
      if (!applied.ok()) {
        GLOG_ERROR("history stream: operation refused ({}): the state starts over from a "
                   "snapshot",
                   applied.status().ToString());
        follower_->set_state_valid(false);
        std::lock_guard lock(mu_);
        failed_ = true;
        queue_.clear();
        changed_.notify_all();
        return;
      }
    }
  }
}

}  // namespace granary::master::ha
