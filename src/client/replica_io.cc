#include "client/replica_io.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <set>

#include "client/split_copy.h"
#include "common/checksum.h"
#include "common/copy.h"
#include "common/tsan.h"
#include "node/wire_capability.h"

namespace granary::client {

namespace {
uint64_t TotalSize(const auto& parts) {
  uint64_t total = 0;
  for (const auto& p : parts) total += p.size();
  return total;
}
}  // namespace

ReplicaIo::ReplicaIo(SegmentDirectory* directory, transfer::ShmMappingCache* mappings,
                     transfer::TcpTransport* tcp, bool use_shared_memory, bool warm_mappings,
                     ThreadPool* copy_pool)
    : directory_(directory),
      mappings_(mappings),
      tcp_(tcp),
      use_shm_(use_shared_memory),
      copy_pool_(copy_pool) {
  const bool warm = use_shared_memory && warm_mappings;
  if (warm) {
    warmer_ = std::make_unique<transfer::MappingWarmer>();
    mappings_->OnAttach([w = warmer_.get()](const auto& mapping) { w->Warm(mapping); });
  }
  directory_->OnRefresh([mappings, warm](const std::vector<LocalSegment>& live) {
    std::set<std::string> names;
    for (const auto& segment : live) names.insert(segment.shm_name);
    mappings->Retain(names);
    // This host's segments are mapped (and warmed) ahead of the first put that needs them.
    if (warm) {
      for (const auto& segment : live) (void)mappings->Get(segment.shm_name, segment.size);
    }
  });
}

ReplicaIo::~ReplicaIo() {
  if (warmer_) mappings_->OnAttach(nullptr);  // the cache may outlive this object
}

ReplicaIo::LocalView ReplicaIo::MapLocal(const proto::Replica& replica) {
  if (!use_shm_) return {};
  auto local = directory_->Local(replica.segment_id());
  if (!local) return {};
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto mapping = mappings_->Get(local->shm_name, local->size);
    if (!mapping.ok()) return {};  // e.g. another container's shm: TCP still works
    std::shared_ptr<transfer::ShmMapping> m = std::move(*mapping);
    if (m->token() != replica.token()) {
      // Either the replica is of an older mount (refused: TCP, where the node refuses it too),
      // or our mapping is of a file a remount retired or a restart replaced: drop it (its
      // memory is nobody's) and attach the one the name refers to now.
      if (attempt == 0 && (m->retired() || !m->StillLinked())) {
        mappings_->DropIf(local->shm_name, m.get());
        continue;
      }
      return {};
    }
    if (replica.offset() > m->size() || replica.length() > m->size() - replica.offset()) return {};
    std::byte* bytes = m->data() + replica.offset();
    return {std::move(m), bytes};
  }
  return {};
}

void ReplicaIo::RegisterMapping(transfer::ShmMapping& mapping, DeviceMemory& device) {
  mapping.HoldUntilUnmapped([&] { return device.Register(mapping.data(), mapping.size()); });
}

bool ReplicaIo::IsLocal(const proto::Replica& replica) { return MapLocal(replica).bytes != nullptr; }

Status ReplicaIo::Write(const proto::Replica& replica, const std::vector<ByteSpan>& parts,
                        ChecksumStream* checksum, DeviceMemory* device) {
  if (TotalSize(parts) != replica.length()) {
    return Status(ErrorCode::INVALID_WRITE, "object size differs from its replica's length");
  }
  auto on_device = [&](const ByteSpan& part) {
    return device != nullptr && !part.empty() && device->Holds(part.data(), part.size());
  };
  if (LocalView view = MapLocal(replica); view.bytes) {
    std::byte* base = view.bytes;
    uint64_t offset = 0;
    if (device != nullptr) {
      RegisterMapping(*view.mapping, *device);
      // The device writes its parts into the segment first; the CPU cannot read them where
      // they are, so they are hashed from the segment below, in order with the host parts.
      Status copied;
      bool device_copies = false;
      for (const auto& part : parts) {
        if (on_device(part)) {
          if (copied.ok()) copied = device->CopyOut(base + offset, part.data(), part.size());
          device_copies = true;
        }
        offset += part.size();
      }
      if (device_copies) {
        Status waited = device->Wait();
        if (!copied.ok()) return copied;
        if (!waited.ok()) return waited;
        device_written_.fetch_add(offset, std::memory_order_relaxed);
      }
      offset = 0;
    }
    // Shared-memory bytes: ordered by the master (common/tsan.h); each copy guards its stores.
    for (const auto& part : parts) {
      if (on_device(part)) {
        if (checksum) checksum->Update(base + offset, part.size());
      } else if (checksum) {
        // The source: the shared memory may be written by someone else while we copy.
        SplitCopyToSegment(copy_pool_, *checksum, base + offset, part.data(), part.size());
      } else {
        ScopedSegmentWrite payload;
        CopyIntoShared(base + offset, part.data(), part.size());
      }
      offset += part.size();
    }
    if (view.mapping->token() != replica.token()) {
      // The node remounted while we copied: the put must not be committed.
      return Status(ErrorCode::SEGMENT_NOT_FOUND, "segment " + replica.segment_name() +
                                                      " was remounted during the write");
    }
    shm_written_.fetch_add(offset, std::memory_order_relaxed);
    return Status::Ok();
  }
  uint64_t offset = replica.offset();
  std::vector<std::byte> bounce;  // device parts leave through here
  for (const auto& part : parts) {
    if (part.empty()) continue;
    transfer::RemoteRange range{replica.endpoint(), replica.token(), offset, part.size(),
                                node::WireCapability(replica)};
    ByteSpan from = part;
    if (on_device(part)) {
      bounce.resize(part.size());
      Status s = device->CopyOut(bounce.data(), part.data(), part.size());
      Status waited = device->Wait();
      if (!s.ok()) return s;
      if (!waited.ok()) return waited;
      from = ByteSpan(bounce.data(), part.size());
    }
    if (Status s = tcp_->Write(range, from, checksum); !s.ok()) return s;
    offset += part.size();
  }
  tcp_written_.fetch_add(replica.length(), std::memory_order_relaxed);
  return Status::Ok();
}

Result<uint64_t> ReplicaIo::Read(const proto::Replica& replica,
                                 const std::vector<MutableByteSpan>& dst, DeviceMemory* device) {
  if (TotalSize(dst) != replica.length()) {
    return Status(ErrorCode::INVALID_READ, "destination size differs from the replica's length");
  }
  auto on_device = [&](const MutableByteSpan& part) {
    return device != nullptr && !part.empty() && device->Holds(part.data(), part.size());
  };
  ChecksumStream checksum;
  if (LocalView view = MapLocal(replica); view.bytes) {
    const std::byte* base = view.bytes;
    uint64_t offset = 0;
    bool device_copies = false;
    Status copied;
    if (device != nullptr) {
      RegisterMapping(*view.mapping, *device);
      // The device starts reading its parts out of the segment; the CPU hashes them meanwhile.
      for (const auto& part : dst) {
        if (on_device(part)) {
          if (copied.ok()) copied = device->CopyIn(part.data(), base + offset, part.size());
          device_copies = true;
        }
        offset += part.size();
      }
      offset = 0;
    }
    // Shared-memory bytes: ordered by the master (common/tsan.h); each copy guards its loads.
    for (const auto& part : dst) {
      if (on_device(part)) {
        ScopedSegmentRead payload;
        checksum.Update(base + offset, part.size());
      } else {
        SplitCopyFromSegment(copy_pool_, checksum, part.data(), base + offset, part.size());
      }
      offset += part.size();
    }
    if (device_copies) {
      // The device's loads of the segment are over before the second look at the token.
      Status waited = device->Wait();
      if (!copied.ok()) return copied;
      if (!waited.ok()) return waited;
      device_read_.fetch_add(offset, std::memory_order_relaxed);
    }
    // The copy's loads before the second look at the token (a seqlock's reader side).
    std::atomic_thread_fence(std::memory_order_acquire);
    if (view.mapping->token() != replica.token()) {
      return Status(ErrorCode::SEGMENT_NOT_FOUND, "segment " + replica.segment_name() +
                                                      " was remounted during the read");
    }
    shm_read_.fetch_add(offset, std::memory_order_relaxed);
    return checksum.Digest();
  }
  uint64_t offset = replica.offset();
  std::vector<std::byte> bounce;  // device parts arrive here first
  for (const auto& part : dst) {
    if (part.empty()) continue;
    transfer::RemoteRange range{replica.endpoint(), replica.token(), offset, part.size(),
                                node::WireCapability(replica)};
    MutableByteSpan into = part;
    if (on_device(part)) {
      bounce.resize(part.size());
      into = MutableByteSpan(bounce.data(), part.size());
    }
    // Hashed piece by piece as it arrives, in cache: no second pass over the object.
    if (Status s = tcp_->Read(range, into, &checksum); !s.ok()) return s;
    if (into.data() != part.data()) {
      Status s = device->CopyIn(part.data(), into.data(), part.size());
      Status waited = device->Wait();  // before the bounce buffer is reused
      if (!s.ok()) return s;
      if (!waited.ok()) return waited;
    }
    offset += part.size();
  }
  tcp_read_.fetch_add(replica.length(), std::memory_order_relaxed);
  return checksum.Digest();
}

std::optional<ReplicaIo::DeviceRead> ReplicaIo::StartDeviceRead(
    const proto::Replica& replica, const std::vector<MutableByteSpan>& dst, DeviceMemory& device) {
  if (TotalSize(dst) != replica.length() || replica.length() == 0) return std::nullopt;
  for (const auto& part : dst) {
    if (!part.empty() && !device.Holds(part.data(), part.size())) return std::nullopt;
  }
  DeviceRead read;
  read.view = MapLocal(replica);
  if (!read.view.bytes) return std::nullopt;
  RegisterMapping(*read.view.mapping, device);
  const std::byte* base = read.view.bytes;
  uint64_t offset = 0;
  for (const auto& part : dst) {
    if (read.started.ok() && !part.empty()) {
      read.started = device.CopyIn(part.data(), base + offset, part.size());
    }
    offset += part.size();
  }
  if (!read.started.ok()) return read;  // nothing to check the bytes against
  ChecksumStream checksum;
  {
    // Shared-memory bytes: ordered by the master (common/tsan.h).
    ScopedSegmentRead payload;
    checksum.Update(base, replica.length());
  }
  read.digest = checksum.Digest();
  return read;
}

Result<uint64_t> ReplicaIo::FinishDeviceRead(const DeviceRead& read, const proto::Replica& replica,
                                             const Status& waited) {
  if (!read.started.ok()) return read.started;
  if (!waited.ok()) return waited;
  device_read_.fetch_add(replica.length(), std::memory_order_relaxed);
  // The device's loads and the hash before the second look at the token (a seqlock's reader).
  std::atomic_thread_fence(std::memory_order_acquire);
  if (read.view.mapping->token() != replica.token()) {
    return Status(ErrorCode::SEGMENT_NOT_FOUND, "segment " + replica.segment_name() +
                                                    " was remounted during the read");
  }
  shm_read_.fetch_add(replica.length(), std::memory_order_relaxed);
  return read.digest;
}

std::shared_ptr<transfer::StagingView> ReplicaIo::StagingFor(const std::string& endpoint) {
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(staging_mu_);
    auto it = staging_.find(endpoint);
    if (it != staging_.end() && (it->second.view || now < it->second.retry_after)) {
      return it->second.view;
    }
  }
  // Asked outside the lock (a round trip and a mapping); a node without a region, or whose
  // region is not in this host's /dev/shm, is asked again only after a pause.
  std::shared_ptr<transfer::StagingView> view;
  auto info = tcp_->StageInfo(endpoint);
  if (info.ok()) {
    auto attached = transfer::StagingView::Attach(info->name, info->token);
    if (attached.ok()) view = std::move(*attached);
  }
  std::lock_guard lock(staging_mu_);
  Staging& s = staging_[endpoint];
  if (view || !s.view) s.view = view;
  s.retry_after = now + std::chrono::seconds(5);
  return s.view;
}

void ReplicaIo::DropStaging(const std::string& endpoint, const transfer::StagingView* view) {
  std::lock_guard lock(staging_mu_);
  auto it = staging_.find(endpoint);
  if (it != staging_.end() && it->second.view.get() == view) {
    it->second.view.reset();
    it->second.retry_after = {};  // the node restarted: look again at once
  }
}

void ReplicaIo::ReadDiskStaged(const std::string& endpoint,
                               std::span<transfer::DiskReadItem> items, std::vector<Status>& out,
                               std::vector<char>& done) {
  std::shared_ptr<transfer::StagingView> view = StagingFor(endpoint);
  if (!view) return;
  // Objects up to half the region, requests up to a quarter: several clients share it, and
  // one request's slots stay taken until its last entry is copied.
  std::vector<size_t> index;
  std::vector<transfer::DiskReadItem> staged;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].size + 8192 <= view->data_bytes() / 2) {
      index.push_back(i);
      staged.push_back(items[i]);
    }
  }
  if (staged.empty()) return;
  std::vector<uint64_t> sums(staged.size(), 0);
  bool other_region = false;
  std::vector<Status> got = tcp_->ReadDiskStaged(
      endpoint, staged, view->data_bytes() / 4,
      [&](size_t k, const transfer::StagedSlot& slot) {
        ScopedSegmentRead payload;  // staged bytes: fenced by the slot's generation
        Status st = view->Copy(slot, staged[k].dst, &sums[k]);
        if (st.code() == ErrorCode::INVALID_PARAMS) other_region = true;
        return st;
      });
  if (other_region) DropStaging(endpoint, view.get());
  for (size_t k = 0; k < staged.size(); ++k) {
    const size_t i = index[k];
    const ErrorCode code = got[k].code();
    if (got[k].ok()) {
      if (sums[k] != items[i].checksum) continue;  // cannot happen: read it again over TCP
      out[i] = Status::Ok();
      done[i] = 1;
      disk_read_.fetch_add(items[i].size, std::memory_order_relaxed);
      disk_read_shm_.fetch_add(items[i].size, std::memory_order_relaxed);
    } else if (code == ErrorCode::OBJECT_NOT_FOUND || code == ErrorCode::INVALID_READ ||
               code == ErrorCode::CHECKSUM_MISMATCH) {
      out[i] = got[k];  // the node's word on the copy itself: TCP would hear the same
      done[i] = 1;
    }
  }
}

std::vector<Status> ReplicaIo::ReadDisk(const std::string& endpoint,
                                        std::span<transfer::DiskReadItem> items, bool same_host) {
  std::vector<Status> out(items.size());
  std::vector<char> done(items.size(), 0);
  if (use_shm_ && same_host) ReadDiskStaged(endpoint, items, out, done);
  std::vector<size_t> rest;
  std::vector<transfer::DiskReadItem> tcp_items;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!done[i]) {
      rest.push_back(i);
      tcp_items.push_back(items[i]);
    }
  }
  if (rest.empty()) return out;
  std::vector<Status> got = tcp_->ReadDisk(endpoint, tcp_items);
  for (size_t k = 0; k < rest.size(); ++k) out[rest[k]] = std::move(got[k]);
  for (size_t i : rest) {
    if (!out[i].ok()) continue;
    ChecksumStream checksum;
    for (const auto& part : items[i].dst) checksum.Update(part.data(), part.size());
    if (checksum.Digest() != items[i].checksum) {
      out[i] = Status(ErrorCode::CHECKSUM_MISMATCH,
                      "disk copy of an object on " + endpoint + " failed its checksum");
      continue;
    }
    disk_read_.fetch_add(items[i].size, std::memory_order_relaxed);
  }
  return out;
}

ClientStats ReplicaIo::Stats() const {
  const transfer::MappingWarmer::Stats warm =
      warmer_ ? warmer_->stats() : transfer::MappingWarmer::Stats{};
  return {shm_written_.load(std::memory_order_relaxed), shm_read_.load(std::memory_order_relaxed),
          tcp_written_.load(std::memory_order_relaxed), tcp_read_.load(std::memory_order_relaxed),
          mappings_->size(), disk_read_.load(std::memory_order_relaxed),
          disk_read_shm_.load(std::memory_order_relaxed),
          warm.bytes_warmed, warm.bytes_pending, warm.warm_ns,
          0, 0, device_read_.load(std::memory_order_relaxed),
          device_written_.load(std::memory_order_relaxed)};
}

}  // namespace granary::client
