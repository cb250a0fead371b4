#include "client/segment_directory.h"

#include "proto/rpc_util.h"

namespace granary::client {

std::optional<LocalSegment> SegmentDirectory::Local(uint64_t segment_id) {
  {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    auto it = entries_.find(segment_id);
    if (it != entries_.end()) {
      // Known: answer from the cache, unless it is old; then one caller refreshes (the others
      // keep using the cache meanwhile).
      const bool old = master_ != nullptr && now - last_success_ > kMaxAge &&
                       now - age_claim_ > std::chrono::milliseconds(100);
      if (!old) return it->second.local ? std::optional(it->second.segment) : std::nullopt;
      age_claim_ = now;
    } else if (now - last_refresh_ < std::chrono::milliseconds(100)) {
      return std::nullopt;  // unknown, and the master was asked a moment ago
    }
  }
  (void)Refresh();  // on failure the cached answer, if any, still stands
  std::lock_guard lock(mu_);
  auto it = entries_.find(segment_id);
  if (it == entries_.end() || !it->second.local) return std::nullopt;
  return it->second.segment;
}

bool SegmentDirectory::NodeIsLocal(const std::string& node_id) {
  if (node_id.empty()) return false;
  auto look = [&]() -> std::optional<bool> {  // caller holds mu_
    for (const auto& [id, e] : entries_) {
      if (e.node_id == node_id) return e.local;
    }
    return std::nullopt;
  };
  {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    std::optional<bool> known = look();
    if (known) {
      const bool old = master_ != nullptr && now - last_success_ > kMaxAge &&
                       now - age_claim_ > std::chrono::milliseconds(100);
      if (!old) return *known;
      age_claim_ = now;
    } else if (now - last_refresh_ < std::chrono::milliseconds(100)) {
      return false;
    }
  }
  (void)Refresh();
  std::lock_guard lock(mu_);
  return look().value_or(false);
}

void SegmentDirectory::Learn(uint64_t segment_id, LocalSegment segment) {
  std::lock_guard lock(mu_);
  entries_[segment_id] = Entry{true, std::move(segment)};
}

Status SegmentDirectory::Refresh() {
  if (master_ == nullptr) return Status(ErrorCode::RPC_FAIL, "no master");
  proto::ListSegmentsResponse resp;
  Status s = master_->Call(&proto::Master::Stub::ListSegments, proto::ListSegmentsRequest(), &resp,
                           "list segments", /*idempotent=*/true, rpc_timeout_ms_);
  std::vector<LocalSegment> live;
  {
    std::lock_guard lock(mu_);
    last_refresh_ = std::chrono::steady_clock::now();
    if (!s.ok()) return s;
    last_success_ = last_refresh_;
    entries_.clear();
    for (const auto& info : resp.segments()) {
      Entry e;
      e.local = !info.shm_name().empty() && info.host_id() == host_id_;
      e.segment = {info.shm_name(), info.size(), info.token()};
      e.node_id = info.node_id();
      if (e.local) live.push_back(e.segment);
      entries_[info.segment_id()] = std::move(e);
    }
  }
  if (listener_) listener_(live);
  return Status::Ok();
}

}  // namespace granary::client
