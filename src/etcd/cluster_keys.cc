#include "etcd/cluster_keys.h"

#include <nlohmann/json.hpp>

namespace granary::etcd {

std::string ClusterPrefix(const std::string& cluster_id) { return "/granary/" + cluster_id + "/"; }
std::string LeaderKey(const std::string& cluster_id) { return ClusterPrefix(cluster_id) + "leader"; }
std::string SyncKey(const std::string& cluster_id) { return ClusterPrefix(cluster_id) + "sync"; }
std::string MembersPrefix(const std::string& cluster_id) {
  return ClusterPrefix(cluster_id) + "members/";
}
std::string MemberKey(const std::string& cluster_id, const std::string& member_id) {
  return MembersPrefix(cluster_id) + member_id;
}

std::string EncodeLeaderRecord(const LeaderRecord& r) {
  nlohmann::json doc;
  doc["id"] = r.id;
  doc["grpc"] = r.grpc;
  doc["fast_port"] = r.fast_port;
  doc["http_port"] = r.http_port;
  doc["term"] = r.term;
  doc["serving"] = r.serving;
  if (!r.fast_local.empty()) doc["fast_local"] = r.fast_local;
  return doc.dump();
}

Result<LeaderRecord> ParseLeaderRecord(const std::string& json) {
  nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("id") || !doc["id"].is_string() ||
      !doc.contains("grpc") || !doc["grpc"].is_string() || !doc.contains("term") ||
      !doc["term"].is_number_unsigned()) {
    return Status(ErrorCode::ETCD_OPERATION_ERROR, "malformed leader record: " + json);
  }
  LeaderRecord r;
  r.id = doc["id"].get<std::string>();
  r.grpc = doc["grpc"].get<std::string>();
  r.term = doc["term"].get<uint64_t>();
  auto port = [&](const char* name) -> uint16_t {
    if (!doc.contains(name) || !doc[name].is_number_unsigned()) return 0;
    const uint64_t v = doc[name].get<uint64_t>();
    return v <= 65535 ? static_cast<uint16_t>(v) : 0;
  };
  r.fast_port = port("fast_port");
  r.http_port = port("http_port");
  r.serving = doc.contains("serving") && doc["serving"].is_boolean() && doc["serving"].get<bool>();
  if (doc.contains("fast_local") && doc["fast_local"].is_string()) {
    r.fast_local = doc["fast_local"].get<std::string>();
  }
  return r;
}

std::string HostOf(const std::string& address) {
  if (!address.empty() && address.front() == '[') {  // "[v6]:port": its colons are not the port's
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return "";
    }
    return address.substr(1, close - 1);
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return "";
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace granary::etcd
