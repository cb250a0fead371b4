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

struct FreeAligned {
  void operator()(std::byte* p) const { std::free(p); }
};

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
    : store_(store), options_(Sane(std::move(options))) {}

DiskReadService::Options DiskReadService::Sane(Options o) {
  o.window_entries = std::max<size_t>(1, o.window_entries);  // a window always advances
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

bool DiskReadService::Serve(const std::vector<Entry>& entries, const Emit& emit) {
  // Only entries naming the copy the index holds get staging and I/O: a request's sizes are the
  // asker's word, the index's are not (made-up keys claiming 1 GiB each must cost nothing).
  std::vector<char> held(entries.size(), 0);
  for (size_t i = 0; i < entries.size(); ++i) {
    std::optional<disk::StoredObject> copy = store_->Lookup(entries[i].key);
    held[i] = copy && copy->location == entries[i].location && copy->size == entries[i].size &&
              copy->checksum == entries[i].checksum;
  }
  size_t next = 0;
  while (next < entries.size()) {
    // The window: consecutive entries up to the entry and byte caps (at least one).
    size_t end = next;
    uint64_t window = 0;
    while (end < entries.size() && end - next < options_.window_entries) {
      const uint64_t need = held[end] ? disk::DiskStore::ReadBufferSize(entries[end].size) : 0;
      if (end > next && window + need > options_.window_bytes) break;
      window += need;
      ++end;
    }
    if (!AcquireStaging(window)) {
      for (size_t i = next; i < end; ++i) {
        {
          std::lock_guard lock(mu_);
          stats_.refused++;
        }
        if (!emit(static_cast<uint32_t>(i), ErrorCode::NO_AVAILABLE_HANDLE, {})) return false;
      }
      next = end;
      continue;
    }
    std::unique_ptr<std::byte, FreeAligned> staging(
        window == 0 ? nullptr
                    : static_cast<std::byte*>(std::aligned_alloc(disk::kBlockSize, window)));
    if (window > 0 && !staging) {
      ReleaseStaging(window);
      for (size_t i = next; i < end; ++i) {
        if (!emit(static_cast<uint32_t>(i), ErrorCode::NO_AVAILABLE_HANDLE, {})) return false;
      }
      next = end;
      continue;
    }
    std::vector<disk::ReadRequest> reads;
    std::vector<size_t> read_of(end - next, SIZE_MAX);  // entry -> its read, if it has one
    reads.reserve(end - next);
    uint64_t at = 0;
    for (size_t i = next; i < end; ++i) {
      if (!held[i]) continue;
      const uint64_t need = disk::DiskStore::ReadBufferSize(entries[i].size);
      read_of[i - next] = reads.size();
      reads.push_back({entries[i].key, entries[i].location,
                       std::span<std::byte>(staging.get() + at, need)});
      at += need;
    }
    std::vector<disk::ReadResult> results =
        reads.empty() ? std::vector<disk::ReadResult>{} : store_->Read(reads);
    bool open = true;
    for (size_t i = next; i < end && open; ++i) {
      const Entry& e = entries[i];
      const size_t r_index = read_of[i - next];
      disk::ReadResult r;
      if (r_index == SIZE_MAX) {
        r.status = Status(ErrorCode::OBJECT_NOT_FOUND, "");  // not the copy the index holds
      } else {
        r = results[r_index];
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
      if (code == ErrorCode::OK) bytes = {reads[r_index].buffer.data(), e.size};
      open = emit(static_cast<uint32_t>(i), code, bytes);
    }
    staging.reset();
    ReleaseStaging(window);
    if (!open) return false;
    next = end;
  }
  return true;
}

DiskReadService::Stats DiskReadService::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace granary::node
