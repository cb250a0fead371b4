#include "node/disk_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "common/host.h"
#include "common/logging.h"
#include "proto/rpc_util.h"

namespace granary::node {

namespace {
constexpr size_t kRegisterBatch = 4096;  // keys per DiskRegister call

Status SyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    return Status(ErrorCode::WRITE_FAIL, "cannot sync " + path);
  }
  ::close(fd);
  return Status::Ok();
}

// <dir>/DISK_ID: "granary-disk-id <16 hex>\n", random and never 0, written once (temp file, sync,
// rename, directory sync) and then only read. The store holds the directory's lock meanwhile.
Result<uint64_t> LoadOrCreateDiskId(const std::string& dir) {
  const std::string path = dir + "/DISK_ID";
  if (std::ifstream in(path); in) {
    std::string magic, hex;
    in >> magic >> hex;
    uint64_t id = 0;
    if (magic != "granary-disk-id" || hex.size() != 16 ||
        std::sscanf(hex.c_str(), "%" SCNx64, &id) != 1 || id == 0) {
      return Status(ErrorCode::INVALID_PARAMS, path + " is not a granary disk id file");
    }
    return id;
  }
  uint64_t id = 0;
  while (id == 0) id = RandomU64();
  char text[64];
  std::snprintf(text, sizeof(text), "granary-disk-id %016" PRIx64 "\n", id);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return Status(ErrorCode::WRITE_FAIL, "cannot write " + tmp);
  }
  if (Status s = SyncPath(tmp, O_RDONLY); !s.ok()) return s;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status(ErrorCode::WRITE_FAIL, "cannot rename " + tmp + " to " + path);
  }
  if (Status s = SyncPath(dir, O_RDONLY | O_DIRECTORY); !s.ok()) return s;
  return id;
}
}  // namespace

uint64_t CopyFootprint(uint64_t size) { return disk::DiskStore::ReadBufferSize(size) + 4096; }

Result<DiskTierOptions> MakeDiskTierOptions(const DiskTierSettings& settings,
                                            int rpc_timeout_ms) {
  DiskTierOptions options;
  if (settings.dir.empty()) return options;
  auto backend = disk::ParseBackend(settings.backend);
  if (!backend.ok()) return backend.status();
  auto eviction = disk::ParseEvictionPolicy(settings.eviction);
  if (!eviction.ok()) return eviction.status();
  auto io = disk::ParseIoMode(settings.io);
  if (!io.ok()) return io.status();
  options.store.dir = settings.dir;
  options.store.disk_size = settings.size;
  options.store.backend = *backend;
  options.store.eviction = *eviction;
  options.store.io = *io;
  options.offload_interval_ms = settings.offload_interval_ms;
  options.rpc_timeout_ms = rpc_timeout_ms;
  return options;
}

Result<std::unique_ptr<DiskTier>> DiskTier::Open(DiskTierOptions options, SegmentSource segment,
                                                 client::MasterLocator* master,
                                                 std::string node_id) {
  std::unique_ptr<DiskTier> tier(new DiskTier(std::move(options), segment, master,
                                              std::move(node_id)));
  const auto opened = std::chrono::steady_clock::now();
  auto store = disk::DiskStore::Open(tier->options_.store);
  if (!store.ok()) return store.status();
  const auto open_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - opened).count();
  tier->store_ = std::move(*store);
  DiskReadServiceOptions reads = tier->options_.reads;
  reads.on_lost = [t = tier.get()](std::string_view key, uint64_t location) {
    t->ReportLost(key, location);
  };
  tier->reads_ = std::make_unique<DiskReadService>(tier->store_.get(), std::move(reads));
  auto disk_id = LoadOrCreateDiskId(tier->options_.store.dir);
  if (!disk_id.ok()) return disk_id.status();
  tier->disk_id_ = *disk_id;
  const auto& r = tier->store_->recovery();
  GLOG_INFO("disk tier {:016x} in {}: {} backend, {} I/O{}, {} objects recovered in {} ms, "
            "{} torn units discarded",
            tier->disk_id_, tier->options_.store.dir, disk::BackendName(tier->store_->backend()),
            tier->store_->io_mode() == disk::IoMode::kUring ? "io_uring" : "POSIX",
            tier->store_->direct_io() ? " (O_DIRECT)" : " (buffered)", r.objects, open_ms,
            r.units_discarded);
  return tier;
}

DiskTier::DiskTier(DiskTierOptions options, SegmentSource segment, client::MasterLocator* master,
                   std::string node_id)
    : options_(std::move(options)), segment_(std::move(segment)), master_(master),
      node_id_(std::move(node_id)) {}

DiskTier::~DiskTier() { Stop(); }

void DiskTier::Start() {
  if (options_.offload_interval_ms <= 0) return;
  thread_ = std::thread([this] { OffloadLoop(); });
}

void DiskTier::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status DiskTier::RegisterInventory() {
  std::lock_guard lock(round_mu_);
  return RegisterLocked();
}

Status DiskTier::RegisterLocked() {
  const auto started = std::chrono::steady_clock::now();
  std::vector<disk::StoredObject> objects = store_->ListObjects();
  size_t registered = 0, refused = 0;
  size_t begin = 0;
  do {  // at least one request: an empty disk completes its inventory too
    const size_t end = std::min(objects.size(), begin + kRegisterBatch);
    proto::DiskRegisterRequest req;
    req.set_client_id(node_id_);
    req.set_disk_id(disk_id_);
    req.set_complete(end == objects.size());
    for (size_t i = begin; i < end; ++i) {
      proto::DiskCopy* c = req.add_copies();
      c->set_key(objects[i].key);
      c->set_size(objects[i].size);
      c->set_checksum(objects[i].checksum);
      c->set_location(objects[i].location);
    }
    proto::BatchStatusResponse resp;
    if (Status s = master_->Call(&proto::Master::Stub::DiskRegister, req, &resp, "disk register", false, options_.rpc_timeout_ms);
        !s.ok()) {
      return s;
    }
    for (int i = 0; i < resp.results_size() && begin + i < end; ++i) {
      const int32_t code = resp.results(i).code();
      if (code == 0) {
        registered++;
      } else if (code == static_cast<int32_t>(ErrorCode::ILLEGAL_CLIENT)) {
        return rpc::FromCode(code, resp.results(i).message());  // not mounted yet: next mount
      } else {
        // Removed or replaced since, other bytes committed under the key, a put of it in flight,
        // or an invalid entry: this copy will never be named to a reader, so its space goes back.
        (void)store_->Remove(objects[begin + i].key, objects[begin + i].location);
        refused++;
      }
    }
    begin = end;
  } while (begin < objects.size());
  registered_ = true;
  if (!objects.empty()) {
    GLOG_INFO("disk tier: {} objects registered with the master, {} refused and deleted, in {} ms",
              registered, refused,
              std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - started).count());
  }
  return Status::Ok();
}

void DiskTier::FillStats(proto::DiskStats* out) const {
  const disk::DiskUsage u = store_->Usage();
  out->set_capacity_bytes(u.capacity);
  out->set_used_bytes(u.used);
  out->set_object_count(u.objects);
  out->set_promoted_objects(promoted_.load());
}

void DiskTier::ReportLost(std::string_view key, uint64_t location) {
  std::lock_guard lock(mu_);
  if (lost_.size() < 100'000) lost_.emplace_back(std::string(key), location);
}

size_t DiskTier::DropWithMaster(const std::vector<std::pair<std::string, uint64_t>>& copies,
                                const char* what) {
  // Small calls: far under the master's batch and message limits, whatever the keys' length.
  constexpr size_t kPerCall = 1000;
  for (size_t begin = 0; begin < copies.size(); begin += kPerCall) {
    const size_t end = std::min(copies.size(), begin + kPerCall);
    proto::DiskDropRequest req;
    req.set_client_id(node_id_);
    for (size_t i = begin; i < end; ++i) {
      req.add_keys(copies[i].first);
      req.add_locations(copies[i].second);
    }
    proto::BatchStatusResponse resp;
    Status s = master_->Call(&proto::Master::Stub::DiskDrop, req, &resp, "disk drop", false,
                             options_.rpc_timeout_ms);
    if (!s.ok()) {
      GLOG_WARN("disk drop of {} {} copies: {}", copies.size() - begin, what, s.ToString());
      return begin;
    }
  }
  return copies.size();
}

void DiskTier::DropLost() {
  std::vector<std::pair<std::string, uint64_t>> lost;
  {
    std::lock_guard lock(mu_);
    lost.swap(lost_);
  }
  if (lost.empty()) return;
  std::sort(lost.begin(), lost.end());
  lost.erase(std::unique(lost.begin(), lost.end()), lost.end());
  const size_t told = DropWithMaster(lost, "lost");
  std::lock_guard lock(mu_);  // the rest is retried next round
  for (size_t i = told; i < lost.size() && lost_.size() < 100'000; ++i) {
    lost_.push_back(std::move(lost[i]));
  }
}

void DiskTier::OffloadLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(options_.offload_interval_ms),
                 [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    DropLost();
    // Rounds back to back while the master has work, at most a few per interval.
    for (int round = 0; round < 8; ++round) {
      auto done = OffloadOnce();
      if (!done.ok()) {
        GLOG_DEBUG("offload round: {}", done.status().ToString());
        break;
      }
      if (*done == 0) break;
    }
    lock.lock();
  }
}

void DiskTier::MakeRoom(uint64_t bytes) {
  disk::DiskUsage u = store_->Usage();
  uint64_t free_bytes = u.capacity > u.used ? u.capacity - u.used : 0;
  if (free_bytes >= bytes) return;
  if (u.reclaiming > 0) {
    // Space already let go (removed copies' holes, units no read holds any more) first: counted
    // as used until reclaimed, it would make eviction take live copies in its place.
    (void)store_->ReclaimVictims(std::chrono::milliseconds(0));
    u = store_->Usage();
    free_bytes = u.capacity > u.used ? u.capacity - u.used : 0;
    if (free_bytes >= bytes) return;
  }
  std::vector<disk::StoredObject> victims = store_->SelectVictims(bytes - free_bytes);
  if (!victims.empty()) {
    // The master stops naming these before their files go.
    std::vector<std::pair<std::string, uint64_t>> evicted;
    evicted.reserve(victims.size());
    for (auto& v : victims) evicted.emplace_back(std::move(v.key), v.location);
    evicted_objects_.fetch_add(victims.size(), std::memory_order_relaxed);
    (void)DropWithMaster(evicted, "evicted");
  }
  // Readers the master named a victim to before the drop find it gone from the index: a miss.
  (void)store_->ReclaimVictims(std::chrono::milliseconds(1000));
}

size_t DiskTier::DeleteGarbage(const proto::OffloadStartResponse& started) {
  const int n = std::min({started.delete_keys_size(), started.delete_locations_size(),
                          started.delete_ids_size()});
  size_t gone = 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t location = started.delete_locations(i);
    // Location 0 names no copy (Remove would take the key's current one): nothing to delete.
    Status s = location == 0 ? Status(ErrorCode::OBJECT_NOT_FOUND, "")
                             : store_->Remove(started.delete_keys(i), location);
    if (s.ok() || s.code() == ErrorCode::OBJECT_NOT_FOUND) {
      deleted_ids_.push_back(started.delete_ids(i));
      gone++;
    } else {
      GLOG_WARN("disk garbage {}: {}", started.delete_keys(i), s.ToString());
    }
  }
  deleted_garbage_ += gone;
  return gone;
}

Result<size_t> DiskTier::OffloadOnce() {
  std::lock_guard round(round_mu_);
  if (!registered_) {
    if (Status s = RegisterLocked(); !s.ok()) return s;
  }
  proto::OffloadStartRequest req;
  req.set_client_id(node_id_);
  req.set_max_keys(options_.offload_max_keys);
  req.set_max_bytes(options_.offload_max_bytes);
  req.set_disk_id(disk_id_);
  req.set_round(++round_);  // rounds are serial (round_mu_): this one proves the last is over
  for (uint64_t id : deleted_ids_) req.add_deleted_ids(id);
  proto::OffloadStartResponse started;
  {
    if (Status s = master_->Call(&proto::Master::Stub::OffloadStart, req, &started, "offload start", false, options_.rpc_timeout_ms);
        !s.ok()) {
      return s;  // the acknowledgements go again (an entry acknowledged twice is harmless)
    }
  }
  deleted_ids_.clear();  // the master applied them before answering
  // Deleted before anything is written: a location the disk reuses never meets its garbage.
  const size_t deleted = DeleteGarbage(started);
  if (started.code() != 0) return rpc::FromCode(started.code(), started.message());
  if (started.disk_unknown()) {  // the master forgot this disk (or a registration failed)
    registered_ = false;
    if (Status s = RegisterLocked(); !s.ok()) return s;
    return deleted;
  }
  const size_t promoted = Promote(started, req.round());
  const int n = started.items_size();
  if (n == 0) return deleted + promoted;

  // Copies straight from the segment: the master holds these versions' memory (a demotion) until
  // OffloadEnd, and the store checks each against the master's checksum. `segment` stays mapped
  // until the writes are done; a remount meanwhile retires it (zeros: refused by the checksum).
  const std::shared_ptr<ShmSegment> segment = segment_();
  const uint64_t token = token_.load();
  std::vector<disk::ObjectWrite> writes;
  std::vector<int> write_item;
  uint64_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    const proto::OffloadItem& item = started.items(i);
    const proto::Replica& src = item.source();
    const bool in_bounds = src.offset() <= segment->size() &&
                           item.size() <= segment->size() - src.offset() &&
                           src.length() == item.size();
    if (!in_bounds || src.token() != token || src.token() != segment->token() ||
        src.segment_name().empty()) {
      continue;
    }
    writes.push_back({item.key(), item.version_gen(),
                      std::span<const std::byte>(
                          reinterpret_cast<const std::byte*>(segment->data() + src.offset()),
                          item.size()),
                      item.checksum()});
    write_item.push_back(i);
    bytes += CopyFootprint(item.size());
  }
  MakeRoom(bytes);
  std::vector<Result<disk::StoredObject>> written = store_->Write(writes);
  // The footprint is an estimate (metadata, a bucket's padding): what did not fit gets one more
  // round of eviction sized from what failed, then one retry.
  std::vector<size_t> retry;
  uint64_t retry_bytes = 0;
  for (size_t w = 0; w < written.size(); ++w) {
    if (!written[w].ok() && written[w].status().code() == ErrorCode::NO_AVAILABLE_HANDLE) {
      retry.push_back(w);
      retry_bytes += 2 * CopyFootprint(writes[w].value.size());
    }
  }
  if (!retry.empty()) {
    MakeRoom(retry_bytes);
    std::vector<disk::ObjectWrite> again;
    for (size_t w : retry) again.push_back(writes[w]);
    std::vector<Result<disk::StoredObject>> second = store_->Write(again);
    for (size_t j = 0; j < retry.size(); ++j) written[retry[j]] = std::move(second[j]);
  }

  proto::OffloadEndRequest end;
  end.set_client_id(node_id_);
  end.set_disk_id(disk_id_);
  std::vector<uint64_t> location_of(n, 0);
  std::vector<bool> ok(n, false);
  for (size_t w = 0; w < written.size(); ++w) {
    if (written[w].ok()) {
      ok[write_item[w]] = true;
      location_of[write_item[w]] = written[w]->location;
    } else if (written[w].status().code() == ErrorCode::CHECKSUM_MISMATCH) {
      GLOG_WARN("offload of {}: memory bytes do not match their checksum; not copied",
                started.items(write_item[w]).key());
    } else {
      GLOG_WARN("offload of {}: {}", started.items(write_item[w]).key(),
                written[w].status().ToString());
    }
  }
  size_t copied = 0;
  uint64_t copied_bytes = 0;
  for (int i = 0; i < n; ++i) {
    end.add_keys(started.items(i).key());
    end.add_version_gens(started.items(i).version_gen());
    end.add_locations(location_of[i]);
    end.add_written(ok[i]);
    copied += ok[i];
    if (ok[i]) copied_bytes += started.items(i).size();
  }
  proto::BatchStatusResponse ended;
  if (Status s = master_->Call(&proto::Master::Stub::OffloadEnd, end, &ended, "offload end", false, options_.rpc_timeout_ms); !s.ok()) {
    // Unknown outcome: the copies stay; the next registration (after a remount) settles them.
    return s;
  }
  for (int i = 0; i < n && i < ended.results_size(); ++i) {
    if (ok[i] && ended.results(i).code() != 0) {  // replaced or removed meanwhile
      (void)store_->Remove(started.items(i).key(), location_of[i]);
      copied--;
      copied_bytes -= started.items(i).size();
    }
  }
  offloaded_ += copied;
  offloaded_bytes_ += copied_bytes;
  return copied + deleted + promoted;
}

size_t DiskTier::Promote(const proto::OffloadStartResponse& started, uint64_t round) {
  const int n = started.promotions_size();
  if (n == 0) return 0;
  const uint64_t token = token_.load();
  const uint64_t segment_size = segment_()->size();  // the same for every mount
  proto::PromoteEndRequest end;
  end.set_client_id(node_id_);
  end.set_round(round);
  // One staging buffer, grown to the largest item: the store reads whole aligned blocks, which
  // the target extent (exactly `size` bytes) cannot take.
  struct AlignedFree {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, AlignedFree> staging;
  uint64_t staging_size = 0;
  for (int i = 0; i < n; ++i) {
    const proto::PromoteItem& item = started.promotions(i);
    const proto::Replica& dst = item.target();
    bool copied = false;
    const bool in_bounds = dst.offset() <= segment_size &&
                           item.size() <= segment_size - dst.offset() &&
                           dst.length() == item.size() && item.size() > 0;
    const uint64_t need = disk::DiskStore::ReadBufferSize(item.size());
    if (in_bounds && dst.token() == token && !dst.segment_name().empty() && need > 0) {
      if (need > staging_size) {
        staging.reset(static_cast<std::byte*>(std::aligned_alloc(4096, need)));
        staging_size = staging ? need : 0;
      }
      if (staging) {
        const disk::ReadRequest request{item.key(), item.location(),
                                        std::span<std::byte>(staging.get(), need)};
        std::vector<disk::ReadResult> got = store_->Read(std::span(&request, 1));
        // The store checked the bytes against its record; the record must be the master's
        // version too (a location reused after a restart can hold another one).
        // Into the memory whose header carries the allocation's token, looked up just before
        // the copy (the token taken at the start of the round would miss a remount during this
        // round's disk reads). Each mount has its own memory: a copy a remount overtakes lands
        // in the retired memory, which `segment` keeps mapped and no mount names again.
        const std::shared_ptr<ShmSegment> segment = segment_();
        if (got.size() == 1 && got[0].status.ok() && got[0].size == item.size() &&
            got[0].checksum == item.checksum() && segment->token() == dst.token()) {
          std::memcpy(segment->data() + dst.offset(), staging.get(), item.size());
          copied = true;
        } else if (got.size() == 1 && !got[0].status.ok()) {
          GLOG_DEBUG("promotion of {}: {}", item.key(), got[0].status.ToString());
        }
      }
    }
    end.add_keys(item.key());
    end.add_version_gens(item.version_gen());
    end.add_copied(copied);
  }
  proto::BatchStatusResponse ended;
  if (Status s = master_->Call(&proto::Master::Stub::PromoteEnd, end, &ended, "promote end", false, options_.rpc_timeout_ms); !s.ok()) {
    // Unknown outcome: the next round's OffloadStart frees what the master did not attach.
    GLOG_DEBUG("promote end: {}", s.ToString());
    return 0;
  }
  size_t attached = 0;
  for (int i = 0; i < n && i < ended.results_size(); ++i) {
    attached += end.copied(i) && ended.results(i).code() == 0;
  }
  promoted_ += attached;
  return attached;
}

}  // namespace granary::node
