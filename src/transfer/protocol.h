// transfer/protocol.h - the data-plane wire format between clients and a node's data server.
//
// A connection carries a sequence of requests, each answered in order. Every request reads or
// writes one byte range of the node's segment:
//   request  = RequestHeader [payload of `length` bytes if WRITE]
//   response = ResponseHeader [payload of `length` bytes if READ and status == 0]
// All integers are little-endian (the only byte order Granary runs on; static_assert below).
// The node checks magic, version, opcode, the segment token and offset + length against the
// segment (overflow-safe) before touching memory; any malformed header closes the connection,
// a well-formed request it refuses (bad range, wrong token) gets an error status and the
// connection stays usable (a refused WRITE's payload is drained, never stored).
//
// Refusals (ResponseHeader::status, length 0), checked in this order:
//   SEGMENT_NOT_FOUND (-101)  segment_token is not the node's current mount's: the client's
//                             metadata is stale (the node restarted or remounted); refresh it
//                             from the master.
//   INVALID_PARAMS    (-600)  offset > segment size or length > size - offset (overflow-safe;
//                             a range ending exactly at the segment's end is valid).
// Closing without an answer (malformed header, not a refusal): magic != kRequestMagic,
// version != kProtocolVersion, opcode not READ/WRITE/PING, reserved != 0, or
// length > kMaxRequestBytes. PING ignores segment_token, offset and length (it carries no payload).
// A peer silent for the node's idle timeout (mid-frame or between requests) is disconnected.
#pragma once

#include <bit>
#include <cstdint>

namespace granary::transfer {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

inline constexpr uint32_t kRequestMagic = 0x59524E47;   // "GNRY"
inline constexpr uint32_t kResponseMagic = 0x52524E47;  // "GNRR"
inline constexpr uint8_t kProtocolVersion = 1;
// The largest single request; larger objects are split by the client into several requests.
inline constexpr uint64_t kMaxRequestBytes = uint64_t{256} << 20;

enum class Opcode : uint8_t {
  kRead = 1,
  kWrite = 2,
  kPing = 3,  // no range; answered with status 0 and length 0
};

struct RequestHeader {
  uint32_t magic = kRequestMagic;
  uint8_t version = kProtocolVersion;
  Opcode opcode = Opcode::kPing;
  uint16_t reserved = 0;      // must be 0
  uint64_t request_id = 0;    // echoed in the response
  uint64_t segment_token = 0; // the node's segment identity; a mismatch means stale metadata
  uint64_t offset = 0;        // within the segment
  uint64_t length = 0;        // bytes to read or write
};
static_assert(sizeof(RequestHeader) == 40);

struct ResponseHeader {
  uint32_t magic = kResponseMagic;
  int32_t status = 0;         // a granary::ErrorCode number
  uint64_t request_id = 0;
  uint64_t length = 0;        // payload bytes that follow
};
static_assert(sizeof(ResponseHeader) == 24);

}  // namespace granary::transfer
