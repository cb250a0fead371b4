// node/data_server.h - serves byte ranges of one segment over TCP (transfer/protocol.h).
//
// Promise: after Start(), remote clients READ and WRITE ranges of [base, base + size) and PING.
// Every header is checked before any memory is touched: a malformed one (magic, version, opcode,
// reserved, length > kMaxRequestBytes) closes that connection only; a well-formed one that is
// refused (a segment token other than the current mount's, range outside the segment) is answered
// with an error status at once; a refused READ leaves the connection usable, a refused WRITE's
// connection is closed once the answer is out (its payload is never waited for). No byte outside
// the segment is ever read or written. Bytes move with no staging copy: recv() lands in the
// segment, send() leaves from it (but for at most 48 bytes of a WRITE that came with its
// header: a request's first receive asks for a header and a capability at once, DataConn::ahead).
// A request body (DISK_*, STAGE_RELEASE) is held only as its bytes arrive, and all partial bodies
// together hold at most max_body_bytes_held: a request that would pass it has its connection
// closed (shed_bodies), so headers that announce bodies and never send them cost nothing.
//
// Fencing (the mount fence). Each mount has its own token and, from the node, its own memory
// (SetMount, called by the node before it tells the master about the mount). A request is
// accepted under the token it quotes, and every recv() into the segment and every send() out of
// it re-checks, just before the call, that this token is still the current one; SetMount first
// refuses every token, then waits until no I/O thread is inside such a call, and only then
// installs the new memory and token. So once SetMount has returned, no byte of a request
// accepted under an earlier mount is moved, however long its peer paused: the rest of a WRITE's
// payload is drained (never stored) and the WRITE answered SEGMENT_NOT_FOUND; a READ not yet
// answered is refused the same way, one caught mid-answer has its connection closed. The wait
// is for system calls already under way on non-blocking sockets (microseconds), never for a
// peer; it gives up with an error after kFenceWaitMs (the caller must then not mount).
//
// With a disk tier (SetDiskReads), DISK_READ requests are answered from the node's disk
// (node/disk_read_service.h); without one they are refused with OBJECT_NOT_FOUND. With a staging
// region too (SetShmStaging), same-host clients may ask for DISK_STAGE instead: the bytes stay
// in shared memory, in slots owned by the asking connection until its STAGE_RELEASE, its close
// (every slot a connection still holds is freed when it closes) or the region's TTL.
//
// Threads: no thread per connection. Every socket is non-blocking in one epoll set shared by
// io_threads I/O threads (EPOLLONESHOT: a ready connection is driven by one thread at a time).
// Each connection is a small state machine (header, body or payload, reply) that resumes where
// EAGAIN left it, so a slow peer never holds a thread. One acceptor thread accepts and runs the
// deadline timer. DISK_READ and DISK_STAGE, which block on the disk, run on disk_threads
// threads (queued when all are busy), which send their answers with a bounded poll. A queued one
// keeps its request deadline: one not started by then is answered RPC_TIMEOUT (best effort,
// never blocking) and its connection closed; a started one's answers must all be sent by the
// request's deadline, counted from its first header byte with only the bytes actually answered.
// Deadlines: a peer silent for idle_timeout_ms (between requests or mid-frame) is dropped; a
// request must also complete - header, body or payload, and its answer - within
// request_timeout_ms plus its bytes at min_transfer_rate, so a peer trickling one byte a minute
// is dropped at its request's deadline (within a few % of the shorter timeout), not later.
// Connections beyond max_connections are closed on accept and counted (rejected_connections);
// each one costs a descriptor, so RLIMIT_NOFILE must allow them (the node raises it).
//
// Metrics: every request, byte, refusal and answer time is also counted in the granary_node_*
// series of Options::metrics (docs/metrics.md), on the path that does the work: relaxed atomic
// increments only, no lock and no lookup by name on the data path.
//
// Ownership: the caller owns the segment memory: the current mount's until Stop() returns, an
// earlier mount's until the SetMount that replaced it has returned. The server locks nothing on
// the bytes: the master's protocol guarantees nobody reads a range while it is being written.
// Thread safety: Start, Stop, SetMount, SetToken, token, port and stats may be called from any
// thread (SetMount calls are serialised); Stop is idempotent and the destructor calls it.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/metrics.h"
#include "granary/status.h"
#include "node/data_conn.h"
#include "node/disk_read_service.h"
#include "node/shm_staging.h"
#include "security/capability.h"
#include "transfer/protocol.h"

namespace granary::node {

struct DataServerOptions {
  std::string host = "127.0.0.1";  // address to bind (numeric or a name; "0.0.0.0" for all)
  uint16_t port = 0;               // 0: the kernel picks a free port; see port()
  size_t max_connections = 4096;   // open at once; more are closed on accept
  size_t io_threads = 4;           // drive every connection's socket I/O
  size_t disk_threads = 8;         // serve DISK_READ / DISK_STAGE requests, one at a time each
  int idle_timeout_ms = 60000;     // silence tolerated from a peer, mid-frame or between requests
  // A request's deadline, from its first header byte to its answer's last byte:
  // request_timeout_ms plus its payload at min_transfer_rate (bytes/s).
  int request_timeout_ms = 10000;
  uint64_t min_transfer_rate = 1 << 20;
  // Bytes all connections together may hold for request bodies not yet complete.
  uint64_t max_body_bytes_held = 64ull << 20;
  // READ and WRITE are refused (PERMISSION_DENIED): ranges are served under capabilities only
  // (CAP_READ, CAP_WRITE), so a segment's token opens nothing. A node with a secret sets it.
  bool require_capabilities = false;
  // Where the granary_node_* request series are registered (borrowed: it must outlive the
  // server, and be rendered only while the server lives: two gauges read it). Null: a registry
  // of the server's own, so the counters are always there to update.
  MetricsRegistry* metrics = nullptr;
};

class DataServer {
 public:
  using Options = DataServerOptions;

  // Monotonic counters since construction, for /metrics.
  struct Stats {
    uint64_t requests = 0;              // well-formed requests, PING included
    uint64_t bytes_read = 0;            // payload bytes sent to clients (READ)
    uint64_t bytes_written = 0;         // payload bytes stored into the segment (WRITE)
    uint64_t errors = 0;                // refused requests + requests cut off mid-frame
    uint64_t open_connections = 0;      // a gauge, not a counter
    uint64_t rejected_frames = 0;       // malformed headers (their connection was closed)
    uint64_t rejected_connections = 0;  // closed on accept: max_connections reached
    uint64_t timeouts = 0;              // dropped at a deadline (idle or request)
    uint64_t disk_bytes_read = 0;       // payload bytes answered from the disk tier (DISK_READ)
    uint64_t disk_bytes_staged = 0;     // object bytes staged in shared memory (DISK_STAGE)
    uint64_t fenced = 0;                // requests cut off because their mount was replaced
    uint64_t shed_bodies = 0;           // closed: their body would pass max_body_bytes_held
    uint64_t body_bytes_held = 0;       // a gauge: bytes held for partial request bodies
    uint64_t capability_refusals = 0;   // no valid capability: bad MAC, expired, access, range
  };

  // The longest SetMount waits for I/O threads to leave the old mount's memory.
  static constexpr int kFenceWaitMs = 5000;

  // `segment_token` identifies the segment's current mount (0: none yet, nothing is accepted);
  // requests carrying another are stale. `base` holds `size` bytes (so does every later mount's).
  DataServer(uint8_t* base, uint64_t size, uint64_t segment_token, Options options = {});
  ~DataServer();
  DataServer(const DataServer&) = delete;
  DataServer& operator=(const DataServer&) = delete;

  // Binds, listens and starts accepting; returns once listening. Errors: INVALID_PARAMS for a
  // bad host or options, TRANSFER_FAIL when the address cannot be bound (e.g. port taken),
  // UNAVAILABLE_IN_CURRENT_STATUS when already started or stopped.
  Status Start();
  // The bound port (the chosen one when Options::port was 0); 0 before Start().
  uint16_t port() const { return port_.load(); }
  // Closes the listener and every connection (shutdown wakes a disk thread blocked sending) and
  // joins all threads. Idempotent; returns promptly even when peers are stalled.
  void Stop();
  Stats stats() const;
  // The mount fence (above): refuses every token, waits until no I/O thread moves bytes of an
  // earlier mount, then serves `base` (size bytes) under `token` (0: refuse everything). On
  // return the earlier memory is no longer touched and may be unmapped. Errors:
  // UNAVAILABLE_IN_CURRENT_STATUS if an I/O thread stayed inside the old memory for
  // kFenceWaitMs (everything is refused then; call again), INVALID_PARAMS for a null base.
  // CAP_READ and CAP_WRITE are checked under `capability_key` (security/capability.h), the
  // mount's; empty refuses them all.
  Status SetMount(uint8_t* base, uint64_t token, std::string_view capability_key = {});
  // SetMount with the current memory: a new token over the same bytes (tests; a node gives every
  // mount new memory, node/storage_node.h).
  Status SetToken(uint64_t token) { return SetMount(base_.load(std::memory_order_acquire), token); }
  uint64_t token() const { return token_.load(std::memory_order_acquire); }
  // Serves DISK_READ from `reads` (borrowed: it must outlive Stop()); null refuses them.
  void SetDiskReads(DiskReadService* reads) { disk_reads_.store(reads, std::memory_order_release); }
  // Serves DISK_STAGE / STAGE_RELEASE / STAGE_INFO from `staging` (borrowed: it must outlive
  // Stop()); null refuses them with UNAVAILABLE_IN_CURRENT_STATUS. Set before Start().
  void SetShmStaging(ShmStaging* staging) { staging_.store(staging, std::memory_order_release); }

 private:
  using ConnPtr = std::shared_ptr<DataConn>;
  enum class Next { kRead, kWrite, kClose, kHandedOff };  // after driving a connection
  // Why a request failed: the reason label of granary_node_request_errors_total.
  enum class ErrorReason : uint8_t {
    kStaleMount,   // a segment token other than the current mount's (or none yet)
    kOutOfRange,   // a range outside the segment
    kCapability,   // no valid capability (bad MAC, expired, wrong access or range, required)
    kBadFrame,     // a malformed header: its connection was closed
    kTimeout,      // cut off at its deadline, or queued for a disk thread past it
    kFenced,       // its mount was replaced mid-request
    kBodyLimit,    // its body would pass max_body_bytes_held
    kPeerClosed,   // the peer went away (or its socket failed) mid-request
    kDiskRefused,  // a DISK_* refused whole (no disk tier, no staging region, malformed body)
    kDiskEntry,    // one entry of a DISK_* not served (not on disk, unreadable, no staging room)
    kStaging,      // a STAGE_RELEASE or STAGE_INFO refused, or one slot of a release refused
  };
  static constexpr size_t kErrorReasons = 11;
  // The op label of granary_node_requests_total, _bytes_total and _request_seconds.
  static constexpr size_t kOpKinds = 7;  // read, write, ping, disk_read, disk_stage, stage_*
  struct OpSeries {
    Counter* requests = nullptr;
    Counter* bytes = nullptr;
    Histogram* seconds = nullptr;  // first header byte to last answer byte, answered OK
  };
  // One per I/O thread, on its own cache line: the token of the mount whose memory the thread
  // is moving bytes of right now, 0 when none (the fence's reader side).
  struct alignas(64) FenceSlot {
    std::atomic<uint64_t> token{0};
  };

  void AcceptLoop();
  void AcceptReady();
  void ExpireDeadlines();
  void IoLoop(FenceSlot* slot);
  void DiskLoop();
  ConnPtr Find(uint64_t id);
  // The fence's reader side: true (the slot then holds `token`) if `token` is the current mount's,
  // so its memory stays in place until LeaveMount; false (the slot left empty) otherwise.
  bool EnterMount(FenceSlot& slot, uint64_t token);
  // A CAP_* request's whole header is in: OK (it is now its mount's READ or WRITE) or the refusal.
  ErrorCode AdmitCapability(DataConn& c, FenceSlot& slot);
  static void LeaveMount(FenceSlot& slot) { slot.token.store(0, std::memory_order_release); }
  // The connection's mutex is held by the caller in all of these.
  Next Drive(DataConn& c, FenceSlot& slot);
  Next StartRequest(DataConn& c, FenceSlot& slot);
  Next FinishBody(DataConn& c);
  void Respond(DataConn& c, ErrorCode status, const uint8_t* payload, uint64_t length);
  void UpdateDeadline(DataConn& c);
  void Rearm(DataConn& c, Next next);
  ssize_t Receive(DataConn& c, void* into, size_t n);
  void Close(DataConn& c);
  // Grows c.body toward c.request.length to take `arrived` more bytes, within the bound;
  // false when the bound would be passed (the connection must close).
  bool GrowBody(DataConn& c, uint64_t arrived);
  void FreeBody(DataConn& c);
  int64_t BudgetNs(uint64_t bytes) const;
  void RegisterMetrics();
  // Counts a failed request in `errors` and under its reason.
  void CountError(ErrorReason reason) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    error_series_[static_cast<size_t>(reason)]->Inc();
  }
  OpSeries& Op(transfer::Opcode opcode);
  // The request on `c` was answered OK: its time from its first header byte.
  void ObserveAnswered(DataConn& c);

  // DISK_READ and DISK_STAGE share their framing: the request's checks and body, then either one
  // refusal of the whole request or a header announcing one answer per entry.
  static Result<std::vector<DiskReadService::Entry>> ParseDiskBatch(
      const transfer::RequestHeader& h, std::span<const uint8_t> body, const char* op,
      bool has_tier, const Status& missing);
  // False when the connection broke; *serve: the header went out, answer every entry.
  bool StartDiskBatch(DataConn& c, int64_t deadline, const char* op,
                      const Result<std::vector<DiskReadService::Entry>>& entries, bool* serve);
  // On a disk thread, with the whole body in c.body; false when the connection must close.
  bool ServeDiskRead(DataConn& c);
  bool ServeDiskStage(DataConn& c);
  // A DISK_* still queued at its deadline: answers RPC_TIMEOUT without blocking, then closes.
  void ExpireQueuedDisk(DataConn& c);
  // On an I/O thread: builds the answer in c.out (never blocks).
  void ServeStageRelease(DataConn& c);
  void ServeStageInfo(DataConn& c);
  // A disk thread's send: whole, or false when the peer broke, stalled idle_timeout_ms or
  // passed `deadline`.
  bool SendUntil(DataConn& c, iovec* iov, int iovcnt, int64_t deadline);
  bool SendAnswerUntil(DataConn& c, int64_t deadline, uint64_t id, ErrorCode status,
                       const uint8_t* payload, uint64_t length);

  std::atomic<uint8_t*> base_;  // the current mount's memory; changed only by SetMount
  const uint64_t size_;
  std::atomic<uint64_t> token_;
  // The mount's capability key, as a signer: replaced by SetMount only while token_ is 0 and no
  // I/O thread is inside a mount, used inside the fence (EnterMount), so a reader checks under
  // its own mount's key. Null: no key, no capability passes.
  std::unique_ptr<security::CapabilitySigner> signer_;
  std::unique_ptr<FenceSlot[]> fence_slots_;  // one per I/O thread
  std::mutex mount_mu_;  // serialises SetMount
  std::atomic<DiskReadService*> disk_reads_{nullptr};
  std::atomic<ShmStaging*> staging_{nullptr};
  std::atomic<uint64_t> next_conn_id_{1};
  const Options options_;

  std::atomic<uint16_t> port_{0};
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};  // written by Stop() to wake the acceptor's poll
  int epoll_fd_ = -1;
  int stop_event_fd_ = -1;       // in the epoll set, level-triggered: wakes every I/O thread
  std::atomic<bool> io_stopping_{false};
  std::thread acceptor_;
  std::vector<std::thread> io_threads_;
  std::vector<std::thread> disk_threads_;

  std::mutex mu_;  // guards the fields below; a connection's fd is closed only under it
  bool started_ = false;
  bool stopping_ = false;
  std::unordered_map<uint64_t, ConnPtr> conns_;
  std::mutex stop_mu_;  // serialises Stop()

  std::mutex disk_mu_;  // guards disk_queue_ and disk_stopping_
  std::condition_variable disk_cv_;
  std::deque<ConnPtr> disk_queue_;
  bool disk_stopping_ = false;

  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> open_connections_{0};
  std::atomic<uint64_t> rejected_frames_{0};
  std::atomic<uint64_t> rejected_connections_{0};
  std::atomic<uint64_t> timeouts_{0};
  std::atomic<uint64_t> disk_bytes_read_{0};
  std::atomic<uint64_t> disk_bytes_staged_{0};
  std::atomic<uint64_t> fenced_{0};
  std::atomic<uint64_t> shed_bodies_{0};
  std::atomic<uint64_t> body_bytes_held_{0};
  std::atomic<uint64_t> capability_refusals_{0};

  std::unique_ptr<MetricsRegistry> own_metrics_;  // only when Options::metrics is null
  MetricsRegistry* metrics_ = nullptr;
  std::array<OpSeries, kOpKinds> op_series_{};
  std::array<Counter*, kErrorReasons> error_series_{};
  Counter* connections_accepted_ = nullptr;
  Counter* connections_rejected_ = nullptr;
};

}  // namespace granary::node
