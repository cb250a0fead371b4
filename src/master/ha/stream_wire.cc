#include "master/ha/stream_wire.h"

#include <algorithm>
#include <cstring>

#include "proto/fast_frame.h"
#include "proto/rpc_util.h"

namespace granary::master::ha {

std::string Frame(std::string_view body, bool request) {
  std::string out(fast::kHeaderSize, '\0');
  fast::EncodeHeader({static_cast<uint8_t>(fast::Method::kReplicate),
                      static_cast<uint16_t>(request ? 0 : fast::kReply), 0,
                      static_cast<uint32_t>(body.size())},
                     reinterpret_cast<unsigned char*>(out.data()));
  out.append(body);
  return out;
}

std::string ErrorFrame(std::string_view coded_message) {
  std::string out(fast::kHeaderSize, '\0');
  fast::EncodeHeader({static_cast<uint8_t>(fast::Method::kReplicate),
                      static_cast<uint16_t>(fast::kReply | fast::kError), 0,
                      static_cast<uint32_t>(coded_message.size())},
                     reinterpret_cast<unsigned char*>(out.data()));
  out.append(coded_message);
  return out;
}

Status SendFrame(net::ByteStream& conn, std::string_view body, net::SteadyTime deadline,
                 bool request) {
  return conn.SendAll(Frame(body, request), deadline);
}

Result<std::string> ReadFrame(net::ByteStream& conn, uint32_t max_body, net::SteadyTime idle_deadline) {
  unsigned char header[fast::kHeaderSize];
  // The first byte may be long in coming (an idle stream); the rest of a frame may not.
  if (Status s = conn.RecvExact(reinterpret_cast<char*>(header), 1, idle_deadline); !s.ok()) {
    return s;
  }
  const auto rest = std::max(idle_deadline, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  if (Status s = conn.RecvExact(reinterpret_cast<char*>(header) + 1, fast::kHeaderSize - 1, rest);
      !s.ok()) {
    return s;
  }
  fast::Header h;
  if (fast::DecodeHeader(header, &h, max_body) != fast::HeaderError::kNone ||
      h.method != static_cast<uint8_t>(fast::Method::kReplicate)) {
    return Status(ErrorCode::RPC_FAIL, "history stream: malformed frame header");
  }
  std::string body(h.body_size, '\0');
  if (Status s = conn.RecvExact(body.data(), body.size(), rest); !s.ok()) return s;
  if (h.flags & fast::kError) {
    if (auto coded = rpc::ParseCodedMessage(body)) return *coded;
    return Status(ErrorCode::RPC_FAIL, "history stream refused: " + body);
  }
  return body;
}

Result<std::vector<std::string_view>> SplitOps(std::string_view body) {
  std::vector<std::string_view> ops;
  size_t pos = 0;
  while (pos < body.size()) {  // bounded: each pass consumes at least 4 bytes
    if (body.size() - pos < 4) return Status(ErrorCode::RPC_FAIL, "history stream: torn record");
    uint32_t len = 0;
    std::memcpy(&len, body.data() + pos, 4);
    pos += 4;
    if (len > body.size() - pos) return Status(ErrorCode::RPC_FAIL, "history stream: torn record");
    ops.push_back(body.substr(pos, len));
    pos += len;
  }
  return ops;
}

uint64_t TermOf(const Lineage& lineage, uint64_t seq) {
  uint64_t term = 0;
  for (const TermStart& t : lineage) {
    if (t.first_seq <= seq) term = t.term;
  }
  return term;
}

bool IsPrefix(const Lineage& theirs, uint64_t last_seq, const Lineage& ours) {
  if (last_seq == 0) return true;  // an empty history is a prefix of any
  const uint64_t term = TermOf(theirs, last_seq);
  if (term == 0) return false;
  for (size_t i = 0; i < ours.size(); ++i) {
    if (ours[i].term != term) continue;
    // Our operations of that term run to the next entry's start (or on, for our last entry).
    const bool ends_after = i + 1 == ours.size() || last_seq < ours[i + 1].first_seq;
    // Their entry for the term must start where ours does: the same leader numbered both.
    const bool same_start = std::any_of(theirs.begin(), theirs.end(), [&](const TermStart& t) {
      return t.term == term && t.first_seq == ours[i].first_seq;
    });
    return ends_after && same_start && ours[i].first_seq <= last_seq;
  }
  return false;
}

}  // namespace granary::master::ha
