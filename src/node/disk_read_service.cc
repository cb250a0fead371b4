#include "node/disk_read_service.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "transfer/protocol.h"

namespace granary::node {

namespace {

using transfer::DiskReadBody;
using transfer::DiskReadEntry;

Status Malformed(const std::string& what) {
  return Status(ErrorCode::INVALID_PARAMS, "malformed DISK_READ body: " + what);
}


}  // namespace

Result<std::vector<DiskReadService::Entry>> DiskReadService::Parse(std::span<const uint8_t> body) {
  if (body.size() < sizeof(DiskReadBody)) return Malformed("shorter than its header");
  DiskReadBody head;
  std::memcpy(&head, body.data(), sizeof(head));
  if (head.reserved != 0) return Malformed("reserved field is not 0");
  if (head.count == 0 || head.count > transfer::kMaxDiskReadEntries) {
    return Malformed("entry count " + std::to_string(head.count) + " is not in [1, " +
                     std::to_string(transfer::kMaxDiskReadEntries) + "]");
  }
  std::vector<Entry> entries;
  entries.reserve(head.count);
  size_t at = sizeof(DiskReadBody);
  for (uint32_t i = 0; i < head.count; ++i) {
    if (body.size() - at < sizeof(DiskReadEntry)) return Malformed("entries run past the body");
    DiskReadEntry e;
    std::memcpy(&e, body.data() + at, sizeof(e));
    at += sizeof(e);
    if (e.reserved != 0) return Malformed("an entry's reserved field is not 0");
    if (e.key_len == 0 || e.key_len > transfer::kMaxDiskReadKey) {
      return Malformed("key length " + std::to_string(e.key_len) + " is not in [1, " +
                       std::to_string(transfer::kMaxDiskReadKey) + "]");
    }
    if (e.location == 0) return Malformed("location 0");
    if (e.size > transfer::kMaxDiskReadObject) {
      return Malformed("object size " + std::to_string(e.size) + " is over the limit");
    }
    if (body.size() - at < e.key_len) return Malformed("a key runs past the body");
    entries.push_back({std::string_view(reinterpret_cast<const char*>(body.data() + at), e.key_len),
                       e.location, e.checksum, e.size});
    at += e.key_len;
  }
  if (at != body.size()) return Malformed("bytes after the last entry");
  return entries;
}

DiskReadService::DiskReadService(disk::DiskStore* store, Options options)
    : store_(store), options_(Sane(std::move(options))) {
  for (size_t i = 0; i < options_.reader_threads; ++i) {
    readers_.emplace_back([this] { ReaderLoop(); });
  }
}

DiskReadService::Options DiskReadService::Sane(Options o) {
  o.window_entries = std::max<size_t>(1, o.window_entries);  // a window always advances
  o.reader_threads = std::max<size_t>(1, o.reader_threads);
  o.budget_wait_ms = std::max(0, o.budget_wait_ms);
  return o;
}

bool DiskReadService::AcquireStaging(uint64_t bytes) {
  std::unique_lock lock(mu_);
  // A window larger than the whole budget (one huge object) waits for the node to be idle.
  const uint64_t need = std::min(bytes, options_.staging_budget);
  bool got = cv_.wait_for(lock, std::chrono::milliseconds(options_.budget_wait_ms), [&] {
    return staging_used_ == 0 || staging_used_ + need <= options_.staging_budget;
  });
  if (!got) return false;
  staging_used_ += bytes;
  return true;
}

void DiskReadService::ReleaseStaging(uint64_t bytes) {
  {
    std::lock_guard lock(mu_);
    staging_used_ -= bytes;
  }
  cv_.notify_all();
}

// One window of a request: its entries, its staging, its reads and their results.
struct DiskReadService::Window {
  size_t begin = 0, end = 0;
  uint64_t bytes = 0;          // staging it needs
  bool staged = false;         // budget and memory obtained
  std::unique_ptr<std::byte, void (*)(std::byte*)> staging{nullptr, [](std::byte* p) { std::free(p); }};
  ShmStaging* shm = nullptr;   // set: the window's memory is slots of this region
  uint64_t owner = 0;
  std::vector<ShmStaging::Grant> grants;  // per read, when shm
  std::vector<char> handed;               // per read: the slot went to the client
  std::vector<disk::ReadRequest> reads;
  std::vector<size_t> read_of;  // entry - begin -> its read, SIZE_MAX when it has none
  std::vector<disk::ReadResult> results;
};

void DiskReadService::Load(const std::vector<Entry>& entries, const std::vector<char>& held,
                           Window& w) {
  if (w.shm != nullptr) {
    // One slot per object read: each is released on its own by the client.
    std::vector<uint64_t> sizes;
    for (size_t i = w.begin; i < w.end; ++i) {
      if (held[i]) sizes.push_back(disk::DiskStore::ReadBufferSize(entries[i].size));
    }
    if (!sizes.empty()) {
      auto grants = w.shm->Acquire(sizes, w.owner, options_.budget_wait_ms);
      if (!grants.ok()) return;
      w.grants = std::move(*grants);
      w.handed.assign(w.grants.size(), 0);
    }
  } else {
    if (!AcquireStaging(w.bytes)) return;
    if (w.bytes > 0) {
      w.staging.reset(static_cast<std::byte*>(std::aligned_alloc(disk::kBlockSize, w.bytes)));
      if (!w.staging) {
        ReleaseStaging(w.bytes);
        return;
      }
    }
  }
  w.staged = true;
  w.read_of.assign(w.end - w.begin, SIZE_MAX);
  uint64_t at = 0;
  for (size_t i = w.begin; i < w.end; ++i) {
    if (!held[i]) continue;
    const uint64_t need = disk::DiskStore::ReadBufferSize(entries[i].size);
    const size_t r = w.reads.size();
    w.read_of[i - w.begin] = r;
    std::span<std::byte> buffer = w.shm != nullptr
                                      ? w.grants[r].buffer.first(need)
                                      : std::span<std::byte>(w.staging.get() + at, need);
    w.reads.push_back({entries[i].key, entries[i].location, buffer});
    at += need;
  }
  if (!w.reads.empty()) w.results = store_->Read(w.reads);
}

bool DiskReadService::EmitWindow(const std::vector<Entry>& entries, Window& w,
                                 const EmitAny& emit) {
  for (size_t i = w.begin; i < w.end; ++i) {
    const Entry& e = entries[i];
    if (!w.staged) {
      {
        std::lock_guard lock(mu_);
        stats_.refused++;
      }
      if (!emit(static_cast<uint32_t>(i), ErrorCode::NO_AVAILABLE_HANDLE, {}, nullptr)) {
        return false;
      }
      continue;
    }
    const size_t r_index = w.read_of[i - w.begin];
    disk::ReadResult r;
    if (r_index == SIZE_MAX) {
      r.status = Status(ErrorCode::OBJECT_NOT_FOUND, "");  // not the copy the index holds
    } else {
      r = w.results[r_index];
    }
    ErrorCode code = r.status.code();
    // The store found the copy it held gone (its file vanished), torn or corrupted, and
    // dropped it: the master must stop naming it. A miss at lookup is the asker's problem.
    const bool lost = r_index != SIZE_MAX &&
                      (code == ErrorCode::OBJECT_NOT_FOUND || code == ErrorCode::INVALID_READ ||
                       code == ErrorCode::CHECKSUM_MISMATCH);
    if (code != ErrorCode::OK && !lost) code = ErrorCode::OBJECT_NOT_FOUND;
    if (r.status.ok() && (r.size != e.size || r.checksum != e.checksum)) {
      // Replaced between the lookup and the read (the asker's view is stale): not lost.
      code = ErrorCode::OBJECT_NOT_FOUND;
    }
    if (lost && options_.on_lost) options_.on_lost(e.key, e.location);
    {
      std::lock_guard lock(mu_);
      if (code == ErrorCode::OK) {
        stats_.objects++;
        stats_.bytes += e.size;
      } else {
        stats_.refused++;
        stats_.lost += lost && code != ErrorCode::OBJECT_NOT_FOUND;
      }
    }
    std::span<const std::byte> bytes;
    const ShmStaging::Grant* grant = nullptr;
    if (code == ErrorCode::OK) {
      bytes = {w.reads[r_index].buffer.data(), e.size};
      if (w.shm != nullptr) {
        // Handed before the client can know of it: from now on only its release, the
        // connection's close or the TTL frees it.
        grant = &w.grants[r_index];
        w.shm->Hand(grant->slot);
        w.handed[r_index] = 1;
      }
    }
    if (!emit(static_cast<uint32_t>(i), code, bytes, grant)) return false;
  }
  return true;
}

void DiskReadService::Release(Window& w) {
  if (!w.staged) return;
  if (w.shm != nullptr) {
    for (size_t r = 0; r < w.grants.size(); ++r) {
      if (!w.handed[r]) w.shm->Free(w.grants[r].slot);  // refused entries: nobody will read them
    }
    w.grants.clear();
  } else {
    w.staging.reset();
    ReleaseStaging(w.bytes);
  }
  w.staged = false;
}

bool DiskReadService::Serve(const std::vector<Entry>& entries, const Emit& emit) {
  return Run(entries, nullptr, 0,
             [&](uint32_t index, ErrorCode code, std::span<const std::byte> bytes,
                 const ShmStaging::Grant*) { return emit(index, code, bytes); });
}

bool DiskReadService::ServeStaged(const std::vector<Entry>& entries, ShmStaging* staging,
                                  uint64_t owner, const EmitStaged& emit) {
  return Run(entries, staging, owner,
             [&](uint32_t index, ErrorCode code, std::span<const std::byte>,
                 const ShmStaging::Grant* grant) { return emit(index, code, grant); });
}

bool DiskReadService::Run(const std::vector<Entry>& entries, ShmStaging* staging, uint64_t owner,
                          const EmitAny& emit) {
  // Only entries naming the copy the index holds get staging and I/O: a request's sizes are the
  // asker's word, the index's are not (made-up keys claiming 1 GiB each must cost nothing).
  std::vector<char> held(entries.size(), 0);
  for (size_t i = 0; i < entries.size(); ++i) {
    std::optional<disk::StoredObject> copy = store_->Lookup(entries[i].key);
    held[i] = copy && copy->location == entries[i].location && copy->size == entries[i].size &&
              copy->checksum == entries[i].checksum;
  }
  // Windows: consecutive entries up to the entry and byte caps (at least one each).
  std::vector<Window> windows;
  // In shared memory a window's slots stay taken until the client releases them after the
  // whole answer (the client keeps a request's total to a fraction of the region); a window
  // is at most half of it, so one large request cannot starve every other connection.
  const uint64_t window_bytes =
      staging != nullptr ? std::min(options_.window_bytes, staging->data_bytes() / 2)
                         : options_.window_bytes;
  for (size_t next = 0; next < entries.size();) {
    Window w;
    w.shm = staging;
    w.owner = owner;
    w.begin = next;
    w.end = next;
    while (w.end < entries.size() && w.end - w.begin < options_.window_entries) {
      const uint64_t need = held[w.end] ? disk::DiskStore::ReadBufferSize(entries[w.end].size) : 0;
      if (w.end > w.begin && w.bytes + need > window_bytes) break;
      w.bytes += need;
      ++w.end;
    }
    next = w.end;
    windows.push_back(std::move(w));
  }
  // Window k + 1 is read by a reader thread while window k is sent: disk and network overlap.
  bool open = true;
  std::future<void> loading = Submit([&] { Load(entries, held, windows[0]); });
  for (size_t k = 0; k < windows.size(); ++k) {
    loading.get();
    if (open && k + 1 < windows.size()) {
      loading = Submit([&, k] { Load(entries, held, windows[k + 1]); });
    }
    if (open) open = EmitWindow(entries, windows[k], emit);
    Release(windows[k]);
    if (!open && k + 1 < windows.size() && loading.valid()) {
      loading.get();  // the reader must be done with the next window's staging
      Release(windows[k + 1]);
      break;
    }
  }
  return open;
}

std::future<void> DiskReadService::Submit(std::function<void()> job) {
  std::packaged_task<void()> task(std::move(job));
  std::future<void> done = task.get_future();
  {
    std::lock_guard lock(jobs_mu_);
    jobs_.push_back(std::move(task));
  }
  jobs_cv_.notify_one();
  return done;
}

void DiskReadService::ReaderLoop() {
  while (true) {
    std::packaged_task<void()> task;
    {
      std::unique_lock lock(jobs_mu_);
      jobs_cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left to finish
      task = std::move(jobs_.front());
      jobs_.pop_front();
    }
    task();
  }
}

DiskReadService::~DiskReadService() {
  {
    std::lock_guard lock(jobs_mu_);
    stopping_ = true;
  }
  jobs_cv_.notify_all();
  for (auto& t : readers_) t.join();
}

DiskReadService::Stats DiskReadService::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace granary::node
