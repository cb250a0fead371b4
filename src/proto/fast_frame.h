// proto/fast_frame.h - the frame of the master's fast port: a 16-byte header and then a body
// that is one of master.proto's request or response messages (docs/control-path.md).
//
// Promise: EncodeHeader/DecodeHeader are exact inverses; DecodeHeader accepts only this magic
// and version and a body no longer than the bound its reader gives (kMaxFastBody for requests,
// kMaxFastReply for replies). Methods are numbered here once, for server and client alike.
// Thread safety: pure functions and constants.
#pragma once

#include <cstdint>
#include <cstddef>

namespace granary::fast {

inline constexpr uint32_t kMagic = 0x50465247;  // "GRFP" in the little-endian header
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 16;
// Larger requests (thousands of 4 KiB keys) go over gRPC, whose limit is 256 MiB: a fast-port
// reader never holds more than this per connection.
inline constexpr uint32_t kMaxFastBody = 16u << 20;
// A reply is read only after the master applied the call, so refusing it would report a failure
// for a mutation that happened: the client accepts what gRPC's clients accept (256 MiB), and a
// small request can have a large reply (replica lists). The master never sends more than this.
inline constexpr uint32_t kMaxFastReply = 256u << 20;

// The hot calls. Numbers are wire values: never reuse one. 0xF0-0xFF are kept for connection
// control (the hello that presents the secret before the first call).
enum class Method : uint8_t {
  kPing = 1,
  kPutStart = 2,
  kPutEnd = 3,
  kPutRevoke = 4,
  kGetReplicaList = 5,
  kFinishRead = 6,
  kExist = 7,
  kReserve = 8,
  kPutCommit = 9,
  kReleaseReservations = 10,
  // Not a call: a standby master's request to stream the leader's ordered history; the
  // connection then carries that stream (master/ha/stream_wire.h) until either side closes it.
  kReplicate = 11,
  kHello = 0xF0,  // presents the cluster's secret before any call (security/fast_hello.h)
};
inline constexpr uint8_t kMethodCount = 12;  // one past the highest call number

inline const char* MethodName(Method m) {
  switch (m) {
    case Method::kPing: return "Ping";
    case Method::kPutStart: return "BatchPutStart";
    case Method::kPutEnd: return "BatchPutEnd";
    case Method::kPutRevoke: return "BatchPutRevoke";
    case Method::kGetReplicaList: return "BatchGetReplicaList";
    case Method::kFinishRead: return "BatchFinishRead";
    case Method::kExist: return "BatchExist";
    case Method::kReserve: return "Reserve";
    case Method::kPutCommit: return "BatchPutCommit";
    case Method::kReleaseReservations: return "ReleaseReservations";
    case Method::kReplicate: return "Replicate";
    case Method::kHello: return "Hello";
  }
  return nullptr;
}

// flags: a reply has kReply; kError means the body is a UTF-8 message, not a response message.
// A reply with method 0 and kError is the server refusing a connection before reading from it.
// An error body "granary:<code>:<message>" (proto/rpc_util.h) is the master answering the call
// with that code as a whole (e.g. a standby's UNAVAILABLE_IN_CURRENT_MODE); the connection stays
// usable.
inline constexpr uint16_t kReply = 1;
inline constexpr uint16_t kError = 2;

struct Header {
  uint8_t method = 0;
  uint16_t flags = 0;
  uint32_t request_id = 0;  // echoed in the reply; lets a later client pipeline calls
  uint32_t body_size = 0;
};

inline void Put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline uint32_t Get32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

// Layout (little-endian): magic u32 | version u8 | method u8 | flags u16 | request id u32 |
// body size u32.
inline void EncodeHeader(const Header& h, unsigned char* out) {
  Put32(out, kMagic);
  out[4] = kVersion;
  out[5] = h.method;
  out[6] = static_cast<unsigned char>(h.flags);
  out[7] = static_cast<unsigned char>(h.flags >> 8);
  Put32(out + 8, h.request_id);
  Put32(out + 12, h.body_size);
}

enum class HeaderError { kNone, kMagic, kVersion, kTooLarge };

inline HeaderError DecodeHeader(const unsigned char* in, Header* h,
                                uint32_t max_body = kMaxFastBody) {
  if (Get32(in) != kMagic) return HeaderError::kMagic;
  if (in[4] != kVersion) return HeaderError::kVersion;
  h->method = in[5];
  h->flags = static_cast<uint16_t>(in[6] | (in[7] << 8));
  h->request_id = Get32(in + 8);
  h->body_size = Get32(in + 12);
  if (h->body_size > max_body) return HeaderError::kTooLarge;
  return HeaderError::kNone;
}

}  // namespace granary::fast
