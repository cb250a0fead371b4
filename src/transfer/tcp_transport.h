// transfer/tcp_transport.h - the client side of the TCP data plane (transfer/protocol.h).
//
// Promise: Read() fills dst with exactly the range's bytes and Write() stores exactly src, or they
// return an error: never a hang (every connect and every I/O has a timeout), never partial data
// reported as success. A node's refusal surfaces as the node's code (SEGMENT_NOT_FOUND: stale
// segment token; INVALID_PARAMS: range outside the segment); every other failure (refused or
// timed-out connect, reset, timeout, protocol violation) is TRANSFER_FAIL.
//
// Connections: a pool of persistent connections per endpoint; each request checks one out
// exclusively, returns it on success and closes it on any error. Pooled connections idle for
// pool_idle_ms are closed (keep it below the node's idle timeout), and one idle for 100 ms or
// more is probed for a close by the node before reuse (a busier one cannot have met the node's
// idle timer: no system call per request for it); one that still turns out dead (node
// restarted) is replaced and its request resent once: READ and WRITE of a range are idempotent. Ranges longer than
// stripe_threshold are cut into stripe_chunk requests kept in flight on up to
// connections_per_endpoint connections at once, all driven by the calling thread with
// non-blocking calls and poll(); a request on one connection waits for its answer and moves its
// payload in blocking calls, of 256 KiB at most (MSG_WAITALL; SO_RCVTIMEO/SO_SNDTIMEO =
// io_timeout_ms bound each call).
// On the 2-core dev box (loopback, one caller, 4 x 512 KiB) this beat helper threads driving one
// connection each (16 MiB writes 3.0 vs 2.1 GB/s, reads equal at 1.9) and needs no thread
// hand-offs. There, striping speeds up writes (16 MiB: 3.0 vs 2.3 GB/s) but slows reads a little
// (2.2 vs 2.4): one stream already keeps both cores busy; striping is meant for nodes with more
// cores and NIC queues. Re-measure stripe_* on the target hardware. Reads were measured again
// against threads (2026-11-24, commit 99353ab: each chunk received by a blocking lane on the
// caller or one of 3 persistent pool threads straight into dst, the caller hashing the in-order
// prefix): 16 MiB gets 1.31 GB/s against 1.93 for this loop, 0.61x against 0.77x memcached in
// the same runs (medians of 3 interleaved rounds on a loaded box,
// bench/results/tcp-ab-2026-11-25.txt): four receiving threads on two cores only add switches.
// After an error no further chunk is sent; requests already in flight are finished so their
// connections stay reusable, and the first error is returned.
//
// Ownership: the transport owns its sockets (it starts no threads). Callers own dst/src; the
// transport touches them only until Read/Write returns.
// Thread safety: Read, Write, ReadDisk, ReadDiskStaged, StageInfo, Ping and DropEndpoint may be called from any number of threads at
// once. The destructor must not run concurrently with them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "granary/status.h"
#include "transfer/protocol.h"

namespace granary {
class ChecksumStream;
}

namespace granary::transfer {

struct TcpTransportOptions {
  size_t connections_per_endpoint = 4;     // idle connections kept, and lanes of a striped request
  uint64_t stripe_threshold = 4ull << 20;  // ranges longer than this are striped
  uint64_t stripe_chunk = 512ull << 10;    // bytes per striped request
  int connect_timeout_ms = 3000;
  int io_timeout_ms = 30000;  // no byte moving on any of a request's connections this long: fail
                              // (at least 1 ms: a smaller value counts as 1)
  int pool_idle_ms = 30000;   // close pooled connections idle longer (node's default is 60 s)
  // A lone request waits this long awake for its answer's first bytes before it sleeps in its
  // blocking receive (common/spin_wait.h); 0: it sleeps at once. At most io_timeout_ms, which
  // the receive after a spin that ran out waits in full: a silent node fails after up to twice it.
  uint32_t spin_wait_us = 0;
};

struct RemoteRange {
  std::string endpoint;  // "host:port", "[v6addr]:port"
  uint64_t segment_token = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  // A tenant's right to the range instead of the token (CAP_READ / CAP_WRITE): every request
  // of the range carries it; the range must lie inside its grant.
  std::optional<Capability> capability;
};

// One object to read from a node's disk tier (DISK_READ): the copy the master named, and where
// its bytes go (the parts' sizes add up to `size`).
struct DiskReadItem {
  std::string key;
  uint64_t location = 0;
  uint64_t checksum = 0;
  uint64_t size = 0;
  std::vector<std::span<std::byte>> dst;
};

// A node's shared-memory staging region, as STAGE_INFO names it.
struct StageRegionInfo {
  std::string name;  // shm name on the node's host
  uint64_t token = 0;
  uint64_t data_bytes = 0;
  uint32_t slot_count = 0;
};

// Copies one staged object out of the region (the caller holds the mapping): OK when the
// item's dst holds its bytes; anything else and the bytes must not be used.
using StagedCopy = std::function<Status(size_t item, const StagedSlot& slot)>;

class TcpTransport {
 public:
  using Options = TcpTransportOptions;

  explicit TcpTransport(Options options = {});
  ~TcpTransport();
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  // dst.size() must equal range.length (else INVALID_PARAMS, before any I/O). With `checksum`,
  // each piece of dst is hashed, in order, right after it arrives (while it is in cache); on OK
  // the stream has hashed exactly dst, on an error its state means nothing.
  Status Read(const RemoteRange& range, std::span<std::byte> dst,
              ChecksumStream* checksum = nullptr);
  // src.size() must equal range.length (else INVALID_PARAMS, before any I/O). `checksum` as
  // Read's: src hashed in order, each piece right after it was sent.
  Status Write(const RemoteRange& range, std::span<const std::byte> src,
               ChecksumStream* checksum = nullptr);
  // Reads whole objects from the node's disk tier, as few DISK_READ requests as the protocol's
  // limits allow, one connection. A status per item: OK when its bytes are in dst (the caller
  // still checks the checksum); the node's refusal (OBJECT_NOT_FOUND: not there any more) or
  // TRANSFER_FAIL. Items after a broken connection fail too.
  std::vector<Status> ReadDisk(const std::string& endpoint, std::span<DiskReadItem> items);
  // The node's staging region: UNAVAILABLE_IN_CURRENT_STATUS when it has none (or no disk),
  // TRANSFER_FAIL when the node cannot be asked.
  Result<StageRegionInfo> StageInfo(const std::string& endpoint);
  // ReadDisk for a same-host client (DISK_STAGE): the node leaves each object in its staging
  // region, `copy` moves it to the item's dst, and once a request's entries are all answered
  // their slots are released on the same connection (STAGE_RELEASE; a connection that breaks
  // instead is closed, which releases them too). Requests are cut so that each stages at most
  // max_request_bytes (at least one object). Statuses as ReadDisk's, plus copy's.
  std::vector<Status> ReadDiskStaged(const std::string& endpoint, std::span<DiskReadItem> items,
                                     uint64_t max_request_bytes, const StagedCopy& copy);
  // One round trip; OK when the node's data server answers.
  Status Ping(const std::string& endpoint);
  // Closes the idle connections to `endpoint` and forgets its address (e.g. the node is gone);
  // connections in use are closed when their request ends.
  void DropEndpoint(const std::string& endpoint);

  // Connections currently idle in the pool of `endpoint` (for tests and metrics).
  size_t IdleConnections(const std::string& endpoint);

 private:
  struct Conn;
  struct Endpoint;
  struct Lane;

  Status Transfer(Opcode op, const RemoteRange& range, uint8_t* buf, ChecksumStream* sum);
  // One DISK_READ request for `items` (within the protocol's limits) on `conn`; false when the
  // connection is unusable afterwards. `answered`: the node sent response bytes, or the failure
  // was not a closed connection (a timeout): not worth resending.
  // With `copy`, a DISK_STAGE round whose slots are released before it returns.
  bool DiskReadRound(Endpoint& ep, Conn& conn, std::span<DiskReadItem> items,
                     std::vector<Status>& out, bool* answered, const StagedCopy* copy);
  std::vector<Status> ReadDiskRounds(const std::string& endpoint, std::span<DiskReadItem> items,
                                     uint64_t max_request_bytes, const StagedCopy* copy);
  Result<std::shared_ptr<Endpoint>> GetEndpoint(const std::string& endpoint);
  // An idle pooled connection (probed if idle >= 100 ms, or always with probe_all: a retry
  // after a pooled one proved dead, when the others may be too), or a new one.
  Result<Conn> Checkout(Endpoint& ep, bool probe_all = false);
  Result<Conn> Connect(Endpoint& ep);
  void Return(Endpoint& ep, const Conn& conn);
  // Moves [offset, offset + length) in `chunk`-sized requests over up to `max_lanes`
  // connections; PING when op is kPing (length 0). `sum` (may be null) hashes the range in order.
  // With `capability`, READ and WRITE go as CAP_READ and CAP_WRITE carrying it (token unused).
  Status Run(Endpoint& ep, Opcode op, uint64_t token, uint64_t offset, uint64_t length,
             uint8_t* buf, uint64_t chunk, size_t max_lanes, ChecksumStream* sum = nullptr,
             const Capability* capability = nullptr);

  const Options options_;
  std::atomic<uint64_t> next_request_id_{1};
  std::mutex mu_;  // guards endpoints_
  std::unordered_map<std::string, std::shared_ptr<Endpoint>> endpoints_;
};

}  // namespace granary::transfer
