// transfer/protocol.h - the data-plane wire format between clients and a node's data server.
//
// A connection carries a sequence of requests, each answered in order. Every request reads or
// writes one byte range of the node's segment:
//   request  = RequestHeader [payload of `length` bytes if WRITE]
//   response = ResponseHeader [payload of `length` bytes if READ and status == 0]
// All integers are little-endian (the only byte order Granary runs on; static_assert below).
// The node checks magic, version, opcode, the segment token and offset + length against the
// segment (overflow-safe) before touching memory; any malformed header closes the connection,
// a well-formed request it refuses (bad range, wrong token) gets an error status at once; a
// refused READ's connection stays usable, a refused WRITE's is closed after the answer (its
// payload is never read: a client whose send the close cut off reads the answer first).
//
// Refusals (ResponseHeader::status, length 0), checked in this order:
//   SEGMENT_NOT_FOUND (-101)  segment_token is not the node's current mount's: the client's
//                             metadata is stale (the node restarted or remounted); refresh it
//                             from the master. Also the answer to a WRITE whose mount was
//                             replaced while its payload arrived (the rest is drained, never
//                             stored), and to a READ replaced before its answer started; one
//                             replaced mid-answer has its connection closed (node/data_server.h).
//   INVALID_PARAMS    (-600)  offset > segment size or length > size - offset (overflow-safe;
//                             a range ending exactly at the segment's end is valid).
// Closing without an answer (malformed header, not a refusal): magic != kRequestMagic,
// version != kProtocolVersion, an unknown opcode, reserved != 0, or a length over the opcode's
// limit (kMaxRequestBytes; DISK_READ/DISK_STAGE kMaxDiskReadBody; STAGE_RELEASE
// kMaxStageReleaseBody; STAGE_INFO 0). PING ignores segment_token, offset and length (it carries no payload).
// CAP_READ and CAP_WRITE are READ and WRITE for a caller who holds no segment token (a tenant,
// docs/security.md): the header's segment_token must be 0 and a Capability follows it (a
// WRITE's payload after that). The node checks the capability against its current mount's key,
// then serves the request as a READ or WRITE of that mount. Refusals, before the ones above:
//   SEGMENT_NOT_FOUND (-101)  the MAC fails under the current mount's key (a capability of an
//                             earlier mount, or forged) or its expiry has passed by the node's
//                             wall clock: get a fresh one from the master.
//   PERMISSION_DENIED (-1101) the access is not the opcode's, or the range is not inside the
//                             grant's.
// A node that requires capabilities (a node with the cluster's secret) refuses READ and WRITE
// with PERMISSION_DENIED (a WRITE's connection closed after the answer), whatever their token.
// A capability whose reserved field is not 0 is refused as a forged one. A CAP_* header whose
// segment_token is not 0 is malformed (closed before its capability is read).
// A peer silent for the node's idle timeout between requests is disconnected, and so is one whose
// request (header, body, payload) does not arrive within the node's request deadline
// (node/data_server.h: a fixed part plus the request's bytes at a minimum rate).
//
// DISK_READ (the SSD tier's loads) reads whole objects from the node's disk, many per request so
// the node can keep its disk queue full. The request's payload (`length` bytes, at most
// kMaxDiskReadBody; offset and segment_token must be 0) is a DiskReadBody header then `count`
// entries, each a DiskReadEntry followed by its key. Each entry names one copy exactly: key,
// location (the node's handle, from the master) and the checksum and size the master holds.
// The response is a ResponseHeader whose `length` is the entry count, then one ResponseHeader
// per entry, in order (request_id = the entry's index), each followed by `length` value bytes
// when its status is 0. An entry the node cannot serve byte-exact gets no bytes, never other
// bytes: INVALID_READ or CHECKSUM_MISMATCH for a torn or corrupted copy, NO_AVAILABLE_HANDLE when
// the node's staging memory stayed busy, OBJECT_NOT_FOUND for anything else (another copy or
// version under the key, evicted).
// A malformed body (counts, lengths) is refused with INVALID_PARAMS (length 0) and the
// connection stays in sync; a node without a disk tier refuses with OBJECT_NOT_FOUND.
//
// Same-host loads (DISK_STAGE, STAGE_RELEASE, STAGE_INFO; docs/disk.md "Loads") leave the bytes
// in the node's shared-memory staging region (transfer/shm_staging.h) instead of the socket:
//   STAGE_INFO    (length 0) -> ResponseHeader{length = sizeof(StageInfo) + name_len}, StageInfo,
//                 the region's shm name. A node without a region refuses with
//                 UNAVAILABLE_IN_CURRENT_STATUS (length 0): the client loads over DISK_READ.
//   DISK_STAGE    body exactly as DISK_READ's; the response is framed as DISK_READ's, but an OK
//                 entry carries a StagedSlot (length = sizeof(StagedSlot)) saying where its
//                 bytes are, not the bytes. Each such slot belongs to this connection until
//                 released: by STAGE_RELEASE, by closing the connection, or by the node after
//                 its TTL (the node bumps the slot's generation in the region before reusing
//                 the space, so a copy that overlapped the reuse fails its generation check).
//                 Refusals as DISK_READ's, plus UNAVAILABLE_IN_CURRENT_STATUS for the request
//                 when the node has no region.
//   STAGE_RELEASE body: StageReleaseBody then `count` (1..kMaxStageRelease) SlotRefs ->
//                 ResponseHeader{length = 4 * count} then an int32 code per ref: OK (freed),
//                 INVALID_PARAMS (no such slot id), OBJECT_NOT_FOUND (not staged under that
//                 generation: released, reclaimed or never granted), ILLEGAL_CLIENT (another
//                 connection's slot; left alone). A malformed body: INVALID_PARAMS, length 0.
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
  kDiskRead = 4,  // whole objects from the node's disk tier (see above)
  kDiskStage = 5,     // whole objects into the node's shared-memory staging (same host)
  kStageRelease = 6,  // gives staged slots back
  kStageInfo = 7,     // the staging region's name and identity
  kCapRead = 8,       // READ under a Capability that follows the header (see above)
  kCapWrite = 9,      // WRITE under a Capability that follows the header
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

// What follows the header of CAP_READ and CAP_WRITE (security/capability.h): the grant the
// master signed and its MAC. The request's range must lie inside the grant's.
struct Capability {
  uint64_t grant_offset = 0;
  uint64_t grant_length = 0;
  int64_t expiry_unix_ms = 0;
  uint32_t access = 0;     // security::CapabilityAccess: 1 read, 2 write
  uint32_t reserved = 0;   // must be 0
  uint8_t mac[16] = {};
};
static_assert(sizeof(Capability) == 48);

// DISK_READ's limits: a body of at most 1 MiB with at most 1024 entries, keys of at most 4 KiB,
// objects of at most 1 GiB (the disk tier's largest).
inline constexpr uint64_t kMaxDiskReadBody = uint64_t{1} << 20;
inline constexpr uint32_t kMaxDiskReadEntries = 1024;
inline constexpr uint32_t kMaxDiskReadKey = 4096;
inline constexpr uint64_t kMaxDiskReadObject = uint64_t{1} << 30;

struct DiskReadBody {
  uint32_t count = 0;     // entries that follow
  uint32_t reserved = 0;  // must be 0
};
static_assert(sizeof(DiskReadBody) == 8);

struct DiskReadEntry {
  uint64_t location = 0;  // the node's handle of the copy (never 0)
  uint64_t checksum = 0;  // the object's checksum, as the master holds it
  uint64_t size = 0;      // value bytes
  uint32_t key_len = 0;   // key bytes that follow this entry
  uint32_t reserved = 0;  // must be 0
};
static_assert(sizeof(DiskReadEntry) == 32);

// DISK_STAGE's answer for an entry the node staged: the bytes are [offset, offset + length) of
// the region's data area, valid while the slot's generation in the region equals `generation`.
struct StagedSlot {
  uint64_t region_token = 0;  // the region's identity (StageInfo::region_token)
  uint64_t offset = 0;        // in the data area; 4 KiB-aligned
  uint64_t length = 0;        // the object's bytes (the entry's size)
  uint32_t slot = 0;
  uint32_t reserved = 0;
  uint64_t generation = 0;
};
static_assert(sizeof(StagedSlot) == 40);

struct StageInfo {
  uint64_t region_token = 0;
  uint64_t data_bytes = 0;  // the data area's size: objects staged whole must fit in it
  uint32_t slot_count = 0;
  uint32_t name_len = 0;    // shm name bytes that follow
};
static_assert(sizeof(StageInfo) == 24);

inline constexpr uint32_t kMaxStageRelease = 1024;
struct StageReleaseBody {
  uint32_t count = 0;
  uint32_t reserved = 0;  // must be 0
};
static_assert(sizeof(StageReleaseBody) == 8);
struct SlotRef {
  uint32_t slot = 0;
  uint32_t reserved = 0;  // must be 0
  uint64_t generation = 0;
};
static_assert(sizeof(SlotRef) == 16);
inline constexpr uint64_t kMaxStageReleaseBody =
    sizeof(StageReleaseBody) + uint64_t{kMaxStageRelease} * sizeof(SlotRef);

}  // namespace granary::transfer
