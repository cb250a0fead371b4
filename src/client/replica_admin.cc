#include "client/replica_admin.h"

#include "proto/rpc_util.h"

namespace granary::client {

std::vector<Status> ReplicateKeys(MasterLocator& master, const std::string& client_id,
                                  const std::vector<std::string>& keys, uint32_t replica_num) {
  proto::ReplicateRequest req;
  req.set_client_id(client_id);
  for (const auto& k : keys) req.add_keys(k);
  req.set_replica_num(replica_num);
  proto::BatchStatusResponse resp;
  // Setting a count twice sets the same count: safe to retry.
  Status s = master.Call(&proto::Master::Stub::Replicate, req, &resp, "replicate",
                         /*idempotent=*/true);
  std::vector<Status> out(keys.size(), s);
  if (!s.ok()) return out;
  if (resp.results_size() != static_cast<int>(keys.size())) {
    return std::vector<Status>(keys.size(),
                               Status(ErrorCode::RPC_FAIL, "replicate: answer of another length"));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& r = resp.results(static_cast<int>(i));
    out[i] = rpc::FromCode(r.code(), r.message());
  }
  return out;
}

Status DrainSegment(MasterLocator& master, const std::string& segment, bool drop, bool undrain) {
  proto::DrainRequest req;
  req.set_segment_name(segment);
  req.set_drop(drop);
  req.set_undrain(undrain);
  proto::DrainResponse resp;
  Status s = master.Call(&proto::Master::Stub::Drain, req, &resp, undrain ? "undrain" : "drain",
                         /*idempotent=*/false);
  if (!s.ok()) return s;
  return rpc::FromCode(resp.code(), resp.message());
}

Result<std::vector<DrainStatus>> ListDrains(MasterLocator& master) {
  proto::ListSegmentsResponse resp;  // the drains come with the segments' list
  Status s = master.Call(&proto::Master::Stub::ListSegments, proto::ListSegmentsRequest(), &resp,
                         "list drains", /*idempotent=*/true);
  if (!s.ok()) return s;
  std::vector<DrainStatus> out;
  for (const auto& d : resp.drains()) {
    out.push_back({d.name(), d.drop(), d.done(), d.start_unix_ms(), d.remaining_objects(),
                   d.remaining_bytes()});
  }
  return out;
}

}  // namespace granary::client
