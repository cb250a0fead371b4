#include "master/ha/stream_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <thread>

#include "common/logging.h"
#include "common/socket_io.h"
#include "master/ha/stream_link.h"

namespace granary::master::ha {

namespace {
using SteadyClock = std::chrono::steady_clock;

std::string Refusal(const std::string& why) { return "granary:-1011:" + why; }
}  // namespace

void StreamServer::Lead(uint64_t term, Lineage lineage) {
  std::lock_guard lock(mu_);
  term_ = term;
  lineage_ = std::move(lineage);
}

void StreamServer::StopLeading() {
  std::lock_guard lock(mu_);
  term_ = 0;
}

bool StreamServer::Leading(uint64_t term) const {
  std::lock_guard lock(mu_);
  return term_ != 0 && term_ == term;
}

Result<uint64_t> StreamServer::SendSnapshot(net::ByteStream& conn) {
  uint64_t seq = 0;
  const std::string snapshot = state_->EncodeSnapshot(&seq);
  for (uint64_t offset = 0; offset < snapshot.size() || offset == 0;) {  // bounded by its size
    SnapshotChunk chunk;
    chunk.total = snapshot.size();
    chunk.offset = offset;
    chunk.bytes = snapshot.substr(offset, options_.snapshot_chunk_bytes);
    offset += chunk.bytes.size();
    // A chunk may take a while on a slow link; the standby reads it as it comes.
    const auto deadline = SteadyClock::now() + options_.standby_timeout * 10;
    if (Status s = SendFrame(conn, Encode(FrameKind::kSnapshotChunk, std::move(chunk)), deadline);
        !s.ok()) {
      return s;
    }
    if (offset >= snapshot.size()) break;
  }
  return seq;
}

void StreamServer::Serve(net::ByteStream& conn, std::string_view request) {
  Hello hello;
  uint64_t term = 0;
  Lineage lineage;
  {
    std::lock_guard lock(mu_);
    term = term_;
    lineage = lineage_;
  }
  const auto deadline = [&] { return SteadyClock::now() + options_.standby_timeout; };
  if (!Decode(request, FrameKind::kHello, &hello) || hello.standby_id.empty()) {
    (void)conn.SendAll(ErrorFrame("granary:-600:malformed hello"), deadline());
    return;
  }
  if (term == 0) {
    (void)conn.SendAll(ErrorFrame(Refusal("not the leader")), deadline());
    return;
  }
  // Go on from the standby's position when its history is a prefix of ours and the log still
  // holds the next operation; else start it over from a snapshot.
  // A standby with no operation applied still needs a snapshot: the initial state (its segment
  // id base) is part of the history.
  const uint64_t next = hello.last_seq + 1;
  const bool prefix = hello.last_seq > 0 && IsPrefix(hello.lineage, hello.last_seq, lineage);
  const bool in_log = next >= log_->first_seq() && next <= log_->last_seq() + 1;
  Welcome welcome{term, lineage, !(prefix && in_log), next};
  if (Status s = SendFrame(conn, Encode(FrameKind::kWelcome, welcome), deadline()); !s.ok()) return;

  uint64_t from = next;
  if (welcome.snapshot) {
    Result<uint64_t> seq = SendSnapshot(conn);
    if (!seq.ok()) return;
    from = *seq + 1;
  }
  const uint64_t stream = standbys_->NewStream();  // named before anyone can read an ack
  auto link = std::make_shared<StreamLink>(
      &conn, log_, from, options_.standby_timeout, options_.max_batch_bytes,
      [this, id = hello.standby_id, stream](uint64_t seq) { standbys_->Acked(id, stream, seq); });
  standbys_->Connected(hello.standby_id, hello.advertise, link, stream);
  GLOG_INFO("standby {} ({}) streaming from seq {}{}", hello.standby_id, hello.advertise, from,
            welcome.snapshot ? " after a snapshot" : "");
  // This thread sends what no waiting reply flushed (soft operations, an asynchronous standby's
  // feed), reads acks while no reply does, sends beats and notices a silent standby.
  constexpr auto kTick = std::chrono::milliseconds(5);
  constexpr auto kDriven = std::chrono::milliseconds(50);
  auto last_beat = SteadyClock::now();
  std::string why = "the stream ended";
  while (Leading(term) && !link->broken()) {  // bounded: each pass waits at most one tick
    const Status flushed = link->Flush();
    if (flushed.code() == ErrorCode::OBJECT_NOT_FOUND) {
      GLOG_WARN("standby {} fell behind the history kept (log starts at {}): it starts over "
                "from a snapshot",
                hello.standby_id, log_->first_seq());
      (void)link->SendRefusal("fell behind the log");
      break;
    }
    if (!flushed.ok()) break;
    const auto now = SteadyClock::now();
    if (now - last_beat >= options_.beat) {
      if (!link->SendBeat(term, log_->last_seq()).ok()) break;
      last_beat = now;
    }
    // Until its first ack the standby may still be loading a snapshot (seconds for a large
    // state); after that, silence means it is gone.
    const auto silence = link->acked_once() ? options_.standby_timeout : options_.first_ack_timeout;
    if (now - link->last_ack() > silence) {
      why = "silent for " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silence).count()) +
            " ms";
      break;
    }
    if (link->driven_lately(kDriven)) {
      // Replies read the acks (theirs and those of what this thread sent): stay off the socket.
      std::this_thread::sleep_for(kTick);
    } else if (conn.WaitReadable(now + kTick)) {
      link->Poll();
    }
  }
  if (link->broken()) why = "the connection broke";
  standbys_->Gone(hello.standby_id, stream);
  link->Close();  // after this nobody touches the socket; the fast server closes it
  GLOG_INFO("standby {}: stream closed ({})", hello.standby_id, why);
}

}  // namespace granary::master::ha
