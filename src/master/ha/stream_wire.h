// master/ha/stream_wire.h - the frames of the history stream between a leader and a standby.
//
// The stream rides a fast-port connection (proto/fast_frame.h): the standby's first frame is a
// kReplicate request whose body is a kHello; from then on both sides send fast frames of method
// kReplicate whose body is one byte of FrameKind and its payload (binary_codec.h):
//   leader -> standby: kWelcome, then kSnapshotChunk... if a snapshot is due, then kOps and
//                      kBeat (every beat interval while idle), or kRefuse before closing;
//   standby -> leader: kAck on receiving each kOps and each kBeat (and after its history is
//                      settled: continued, or a snapshot loaded).
// An ack of seq N says: this standby holds every operation up to N of the leader's history
// (received in order; it applies them all before it could ever take over). kOps carries [u32 length | EncodeOperation] records in sequence order.
// Promise: ReadFrame never allocates more than max_body and returns by its deadline; every
// malformed frame or payload is an error value, never a crash.
// Thread safety: pure functions; one reader and one writer per socket at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/byte_stream.h"
#include "granary/status.h"
#include "master/codec/binary_codec.h"

namespace granary::master::ha {

enum class FrameKind : uint8_t {
  kHello = 1,
  kWelcome = 2,
  kSnapshotChunk = 3,
  kOps = 4,
  kBeat = 5,
  kAck = 6,
  kRefuse = 7,
};

// Where one leader's history begins: operations from first_seq on (until the next entry's) were
// numbered by the leader of `term`. A master's lineage lists every term its state went through.
// Two masters whose lineages name the same term agree on that term's operations up to the
// shorter's end: that is how a leader knows a standby's history is a prefix of its own.
struct TermStart {
  uint64_t term = 0;
  uint64_t first_seq = 0;
};
using Lineage = std::vector<TermStart>;

struct Hello {
  std::string standby_id;
  std::string advertise;  // the standby's gRPC address, for /status
  uint64_t last_seq = 0;  // the standby's last applied operation (0: no state worth keeping)
  Lineage lineage;        // the standby's, as its leader last told it
};

struct Welcome {
  uint64_t term = 0;
  Lineage lineage;              // the leader's
  bool snapshot = false;        // chunks of a snapshot follow; then operations after it
  uint64_t next_seq = 0;        // without a snapshot: the first operation the stream sends
};

struct SnapshotChunk {
  uint64_t total = 0;
  uint64_t offset = 0;
  std::string bytes;
};

struct Beat {
  uint64_t term = 0;
  uint64_t last_seq = 0;  // the leader's last applied operation
};

struct Ack {
  uint64_t last_seq = 0;  // the standby's last applied operation
};

template <typename IO> void Fields(IO& io, TermStart& t) { io(t.term); io(t.first_seq); }
template <typename IO> void Fields(IO& io, Hello& h) {
  io(h.standby_id); io(h.advertise); io(h.last_seq); io(h.lineage);
}
template <typename IO> void Fields(IO& io, Welcome& w) {
  io(w.term); io(w.lineage); io(w.snapshot); io(w.next_seq);
}
template <typename IO> void Fields(IO& io, SnapshotChunk& c) {
  io(c.total); io(c.offset); io(c.bytes);
}
template <typename IO> void Fields(IO& io, Beat& b) { io(b.term); io(b.last_seq); }
template <typename IO> void Fields(IO& io, Ack& a) { io(a.last_seq); }

// One record's bytes: the kind byte and the encoded payload.
template <typename T>
std::string Encode(FrameKind kind, T record) {
  Encoder out;
  uint8_t k = static_cast<uint8_t>(kind);
  out(k);
  out(record);
  return out.Take();
}
// Decodes a frame body (kind byte first) into `record`; false if malformed or of another kind.
template <typename T>
bool Decode(std::string_view body, FrameKind kind, T* record) {
  Decoder in(body);
  uint8_t k = 0;
  in(k);
  if (!in.ok() || k != static_cast<uint8_t>(kind)) return false;
  in(*record);
  return in.ok() && in.done();
}
inline FrameKind KindOf(std::string_view body) {
  return body.empty() ? FrameKind{0} : static_cast<FrameKind>(static_cast<uint8_t>(body[0]));
}

// The whole frame (fast header + body) of a stream message. request: the standby's first frame.
std::string Frame(std::string_view body, bool request = false);
// The leader refusing the stream: an error frame with "granary:<code>:<message>".
std::string ErrorFrame(std::string_view coded_message);
Status SendFrame(net::ByteStream& conn, std::string_view body, net::SteadyTime deadline, bool request = false);
// The next frame's body. Waits for its first byte until `idle_deadline`, for the rest until
// `idle_deadline` or 5 s after the first byte, whichever is later. A kError frame (the other side
// refusing the stream) comes back as its coded Status.
Result<std::string> ReadFrame(net::ByteStream& conn, uint32_t max_body, net::SteadyTime idle_deadline);

// The operation records of a kOps body (after its kind byte).
Result<std::vector<std::string_view>> SplitOps(std::string_view body);

// The term of lineage's entry that holds seq (0: none).
uint64_t TermOf(const Lineage& lineage, uint64_t seq);
// Whether a standby with `theirs` and its last operation `last_seq` holds a prefix of a history
// whose lineage is `ours` (so the stream may go on from last_seq + 1).
bool IsPrefix(const Lineage& theirs, uint64_t last_seq, const Lineage& ours);

}  // namespace granary::master::ha
