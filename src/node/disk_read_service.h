// node/disk_read_service.h - serves the SSD tier's loads: DISK_READ requests (transfer/protocol.h)
// answered from the node's DiskStore.
//
// Promise: an entry's bytes are answered only when the store holds exactly the copy asked for -
// that key at that location, with the size and checksum the master named - and read them whole
// and intact (the store verifies each read against the record's checksum); anything else is a
// refusal with no bytes (INVALID_READ or CHECKSUM_MISMATCH for a torn or corrupted record,
// OBJECT_NOT_FOUND for everything else). An entry the index does not hold as named costs no
// staging and no I/O (its size is the asker's word). A copy the store held but found gone, torn
// or corrupted when reading it is reported through on_lost, so the master stops naming it.
// Reads are issued a window at a time (up to window_entries objects and window_bytes, at least
// one object) so the store keeps its queue full; the service's reader threads read window k + 1
// while the caller sends window k, so disk and network overlap. Each window's staging memory
// (4 KiB-aligned, as O_DIRECT needs) is charged to one node-wide budget, so many connections
// cannot make the node allocate without bound: a window waits (bounded) for budget, and is
// refused with NO_AVAILABLE_HANDLE when none frees up in time.
// ServeStaged (same-host clients, DISK_STAGE) reads into slots of the node's shared-memory staging
// region (node/shm_staging.h) instead: the region is that path's budget; an entry answered OK
// leaves its slot handed to the connection (the client copies and releases it), every other
// entry's slot is freed at once.
// Ownership: borrows the store, which must outlive the service; owns its reader threads (the
// I/O engine keeps a ring per thread, so readers are long-lived, not one per window).
// Thread safety: Serve may be called from many threads at once (the data server's disk threads).
#pragma once

#include <condition_variable>
#include <deque>
#include <future>
#include <thread>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "disk/disk_store.h"
#include "granary/status.h"
#include "node/shm_staging.h"

namespace granary::node {

struct DiskReadServiceOptions {
  uint64_t staging_budget = 512ull << 20;  // all windows in flight on the node together
  uint64_t window_bytes = 64ull << 20;     // staging per window (one larger object still goes)
  size_t window_entries = 16;              // the disk queue depth a window fills
  size_t reader_threads = 2;               // read windows ahead, for every connection
  int budget_wait_ms = 5000;
  // A copy the store found torn or corrupted (and dropped): the node tells the master.
  std::function<void(std::string_view key, uint64_t location)> on_lost;
};

class DiskReadService {
 public:
  using Options = DiskReadServiceOptions;

  struct Entry {
    std::string_view key;  // points into the request body
    uint64_t location = 0;
    uint64_t checksum = 0;
    uint64_t size = 0;
  };
  // Decodes a DISK_READ body; INVALID_PARAMS (with what is wrong) for any malformed field.
  static Result<std::vector<Entry>> Parse(std::span<const uint8_t> body);

  // Called once per entry, in order; returns false to stop (the connection broke).
  using Emit = std::function<bool(uint32_t index, ErrorCode code, std::span<const std::byte> bytes)>;

  DiskReadService(disk::DiskStore* store, Options options);
  ~DiskReadService();
  DiskReadService(const DiskReadService&) = delete;
  DiskReadService& operator=(const DiskReadService&) = delete;

  // Reads the entries and emits each; false when an Emit returned false.
  bool Serve(const std::vector<Entry>& entries, const Emit& emit);

  // Called once per entry, in order; `grant` is set (the slot handed to `owner`) when code is OK.
  using EmitStaged =
      std::function<bool(uint32_t index, ErrorCode code, const ShmStaging::Grant* grant)>;
  // Serve, but into `staging` (borrowed) for `owner` (the connection): see above.
  bool ServeStaged(const std::vector<Entry>& entries, ShmStaging* staging, uint64_t owner,
                   const EmitStaged& emit);

  struct Stats {
    uint64_t objects = 0;    // entries answered with bytes
    uint64_t bytes = 0;
    uint64_t refused = 0;    // entries answered with an error
    uint64_t lost = 0;       // copies found torn or corrupted
  };
  Stats stats() const;

 private:
  struct Window;
  static Options Sane(Options options);
  bool AcquireStaging(uint64_t bytes);
  void ReleaseStaging(uint64_t bytes);
  // Stages and reads one window (on a reader thread); leaves it unstaged when budget is short.
  void Load(const std::vector<Entry>& entries, const std::vector<char>& held, Window& w);
  using EmitAny = std::function<bool(uint32_t index, ErrorCode code,
                                     std::span<const std::byte> bytes,
                                     const ShmStaging::Grant* grant)>;
  bool Run(const std::vector<Entry>& entries, ShmStaging* staging, uint64_t owner,
           const EmitAny& emit);
  bool EmitWindow(const std::vector<Entry>& entries, Window& w, const EmitAny& emit);
  void Release(Window& w);
  std::future<void> Submit(std::function<void()> job);
  void ReaderLoop();

  disk::DiskStore* store_;
  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t staging_used_ = 0;
  Stats stats_;

  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> readers_;
};

}  // namespace granary::node
