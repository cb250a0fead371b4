#include "client/segment_directory.h"

#include "proto/rpc_util.h"

namespace granary::client {

std::optional<LocalSegment> SegmentDirectory::Local(uint64_t segment_id) {
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(segment_id);
    if (it != entries_.end()) {
      return it->second.local ? std::optional(it->second.segment) : std::nullopt;
    }
    if (std::chrono::steady_clock::now() - last_refresh_ < std::chrono::milliseconds(100)) {
      return std::nullopt;
    }
  }
  if (!Refresh().ok()) return std::nullopt;
  std::lock_guard lock(mu_);
  auto it = entries_.find(segment_id);
  if (it == entries_.end() || !it->second.local) return std::nullopt;
  return it->second.segment;
}

Status SegmentDirectory::Refresh() {
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, rpc_timeout_ms_);
  proto::ListSegmentsResponse resp;
  Status s = rpc::FromGrpc(master_->ListSegments(&ctx, proto::ListSegmentsRequest(), &resp),
                           "list segments");
  std::lock_guard lock(mu_);
  last_refresh_ = std::chrono::steady_clock::now();
  if (!s.ok()) return s;
  entries_.clear();
  for (const auto& info : resp.segments()) {
    Entry e;
    e.local = !info.shm_name().empty() && info.host_id() == host_id_;
    e.segment = {info.shm_name(), info.size(), info.token()};
    entries_[info.segment_id()] = std::move(e);
  }
  return Status::Ok();
}

}  // namespace granary::client
