#include "node/replica_copier.h"

#include <cstring>

#include "common/checksum.h"
#include "common/logging.h"
#include "node/wire_capability.h"

namespace granary::node {

namespace {
uint64_t Hash(const std::vector<std::byte>& buf) {
  ChecksumStream sum;
  sum.Update(buf.data(), buf.size());
  return sum.Digest();
}
}  // namespace

ReplicaCopier::ReplicaCopier(ReplicaCopierOptions options, SegmentSource segment,
                             client::MasterLocator* master)
    : options_(std::move(options)), segment_(std::move(segment)), master_(master) {}

ReplicaCopier::~ReplicaCopier() { Stop(); }

void ReplicaCopier::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void ReplicaCopier::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ReplicaCopier::Loop() {
  uint64_t round = 0;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    const bool more = Round(++round);
    lock.lock();
    if (more) continue;  // the master has more waiting: no pause
    cv_.wait_for(lock, std::chrono::milliseconds(options_.interval_ms),
                 [this] { return stopping_; });
  }
}

Status ReplicaCopier::Fetch(const proto::ReplicaCopyItem& item, std::vector<std::byte>& buf) {
  Status last(ErrorCode::OBJECT_NOT_FOUND, "no source named");
  for (const proto::Replica& src : item.sources()) {
    if (src.length() != item.size() || src.endpoint().empty()) continue;
    transfer::RemoteRange range{src.endpoint(), src.token(), src.offset(), src.length(),
                                WireCapability(src)};
    Status s = tcp_.Read(range, std::span<std::byte>(buf.data(), buf.size()));
    if (s.ok() && Hash(buf) == item.checksum()) return Status::Ok();
    last = s.ok() ? Status(ErrorCode::CHECKSUM_MISMATCH, "memory source on " + src.endpoint())
                  : s;
  }
  for (const proto::DiskReplica& d : item.disk_sources()) {
    if (d.endpoint().empty()) continue;
    transfer::DiskReadItem read{d.stored_key().empty() ? item.key() : d.stored_key(),
                                d.location(), item.checksum(), item.size(),
                                {std::span<std::byte>(buf.data(), buf.size())}};
    std::vector<Status> got = tcp_.ReadDisk(d.endpoint(), std::span(&read, 1));
    if (got.size() == 1 && got[0].ok() && Hash(buf) == item.checksum()) return Status::Ok();
    last = got.empty() || got[0].ok()
               ? Status(ErrorCode::CHECKSUM_MISMATCH, "disk source on " + d.endpoint())
               : got[0];
  }
  return last;
}

bool ReplicaCopier::Round(uint64_t round) {
  proto::ReplicaCopyStartRequest req;
  req.set_client_id(options_.node_id);
  req.set_round(round);
  req.set_max_keys(options_.max_keys);
  proto::ReplicaCopyStartResponse started;
  if (Status s = master_->Call(&proto::Master::Stub::ReplicaCopyStart, req, &started,
                               "replica copy start", false, options_.rpc_timeout_ms);
      !s.ok() || started.code() != 0) {
    GLOG_DEBUG("replica copy start: {} {}", s.ToString(), started.message());
    return false;
  }
  const int n = started.items_size();
  if (n == 0) return false;
  proto::ReplicaCopyEndRequest end;
  end.set_client_id(options_.node_id);
  end.set_round(round);
  std::vector<std::byte> buf;
  for (int i = 0; i < n; ++i) {
    const proto::ReplicaCopyItem& item = started.items(i);
    const proto::Replica& dst = item.target();
    bool copied = false;
    std::shared_ptr<ShmSegment> segment = segment_();
    const bool in_bounds = segment && dst.offset() <= segment->size() &&
                           item.size() <= segment->size() - dst.offset() &&
                           dst.length() == item.size() && item.size() > 0;
    if (in_bounds) {
      buf.resize(item.size());
      if (Status s = Fetch(item, buf); s.ok()) {
        // Into the memory whose header carries the allocation's token, looked up just now.
        segment = segment_();
        if (segment && segment->token() == dst.token()) {
          std::memcpy(segment->data() + dst.offset(), buf.data(), item.size());
          copied = true;
        }
      } else {
        failed_++;
        GLOG_WARN("copy of {} for re-replication: {}", item.key(), s.ToString());
      }
    }
    end.add_keys(item.key());
    end.add_version_gens(item.version_gen());
    end.add_copied(copied);
  }
  proto::BatchStatusResponse ended;
  if (Status s = master_->Call(&proto::Master::Stub::ReplicaCopyEnd, end, &ended,
                               "replica copy end", false, options_.rpc_timeout_ms);
      !s.ok()) {
    // Unknown outcome: the next round's start frees what the master did not attach.
    GLOG_DEBUG("replica copy end: {}", s.ToString());
    return false;
  }
  for (int i = 0; i < n && i < ended.results_size(); ++i) {
    if (end.copied(i) && ended.results(i).code() == 0) {
      copied_++;
      copied_bytes_ += started.items(i).size();
    }
  }
  return started.more();
}

}  // namespace granary::node
