// The storage node's HTTP endpoint: /metrics, /health and /status (see storage_node.h), and the
// node's own series beside the data server's. Values the node does not count itself (segment,
// staging region, disk tier) are read at each scrape from their owners, so the data path pays
// nothing for them.
#include "node/storage_node.h"

#include <nlohmann/json.hpp>

#include "common/logging.h"

namespace granary::node {

namespace {

using Series = std::vector<std::pair<Labels, double>>;

Series One(double v) { return Series{{{}, v}}; }

}  // namespace

bool StorageNode::serving() const {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
  }
  return mounted_.load() && server_ != nullptr && server_->port() != 0;
}

void StorageNode::RegisterMetrics() {
  // A node outlives every scrape of its registry (the HTTP server stops first), so `this` holds.
  metrics_.AddGaugeCallback("granary_node_info", "1, labelled with the node's identity", [this] {
    return Series{{{{"node_id", client_id_},
                    {"segment", options_.segment_name},
                    {"endpoint", endpoint_}},
                   1.0}};
  });
  metrics_.AddGaugeCallback("granary_node_up", "1 while the segment is mounted and served",
                            [this] { return One(serving() ? 1.0 : 0.0); });
  metrics_.AddGaugeCallback("granary_node_segment_capacity_bytes", "bytes of the DRAM segment",
                            [this] {
                              const auto segment = this->segment();
                              return One(segment ? static_cast<double>(segment->size()) : 0.0);
                            });
  if (staging_ != nullptr) {
    ShmStaging* staging = staging_.get();
    auto stat = [staging](auto field) {
      return [staging, field] { return One(static_cast<double>(staging->stats().*field)); };
    };
    metrics_.AddGaugeCallback("granary_node_staging_capacity_bytes",
                              "bytes of the shared-memory staging region for disk loads",
                              [staging] { return One(static_cast<double>(staging->data_bytes())); });
    metrics_.AddGaugeCallback("granary_node_staging_slots", "slots of the staging region",
                              [staging] { return One(static_cast<double>(staging->slot_count())); });
    metrics_.AddGaugeCallback("granary_node_staging_used_bytes", "staging bytes held by clients",
                              stat(&ShmStaging::Stats::bytes_in_use));
    metrics_.AddGaugeCallback("granary_node_staging_slots_in_use", "staging slots held by clients",
                              stat(&ShmStaging::Stats::slots_in_use));
    metrics_.AddCounterCallback("granary_node_staging_granted_total",
                                "staging slots handed to clients (DISK_STAGE entries)",
                                stat(&ShmStaging::Stats::granted));
    metrics_.AddCounterCallback(
        "granary_node_staging_freed_total",
        "staging slots freed: released by their client, at its connection's close, or past the TTL",
        [staging] {
          const ShmStaging::Stats s = staging->stats();
          return Series{{{{"how", "released"}}, static_cast<double>(s.released)},
                        {{{"how", "closed"}}, static_cast<double>(s.closed)},
                        {{{"how", "ttl"}}, static_cast<double>(s.reclaimed)}};
        });
    metrics_.AddCounterCallback("granary_node_staging_refused_releases_total",
                                "STAGE_RELEASE slots refused (not this connection's, or stale)",
                                stat(&ShmStaging::Stats::refused_releases));
  }
  if (copier_ != nullptr) {
    ReplicaCopier* copier = copier_.get();
    metrics_.AddCounterCallback("granary_node_rereplicated_objects_total",
                                "re-replication copies made into this segment and attached",
                                [copier] { return One(static_cast<double>(copier->copied_objects())); });
    metrics_.AddCounterCallback("granary_node_rereplicated_bytes_total",
                                "bytes of those copies",
                                [copier] { return One(static_cast<double>(copier->copied_bytes())); });
    metrics_.AddCounterCallback(
        "granary_node_rereplication_failures_total",
        "copies no source gave the right bytes for (reported not made; the master retries)",
        [copier] { return One(static_cast<double>(copier->failed_copies())); });
  }
  if (disk_ != nullptr) {
    DiskTier* tier = disk_.get();
    auto usage = [tier](uint64_t disk::DiskUsage::*field) {
      return [tier, field] { return One(static_cast<double>(tier->store().Usage().*field)); };
    };
    auto count = [tier](uint64_t (DiskTier::*read)() const) {
      return [tier, read] { return One(static_cast<double>((tier->*read)())); };
    };
    metrics_.AddGaugeCallback("granary_node_disk_capacity_bytes", "the disk tier's byte budget",
                              usage(&disk::DiskUsage::capacity));
    metrics_.AddGaugeCallback("granary_node_disk_used_bytes",
                              "bytes of the disk tier's files, those being reclaimed included",
                              usage(&disk::DiskUsage::used));
    metrics_.AddGaugeCallback("granary_node_disk_objects", "objects on the disk tier",
                              usage(&disk::DiskUsage::objects));
    metrics_.AddCounterCallback("granary_node_offloaded_objects_total",
                                "objects copied to disk and attached by the master",
                                count(&DiskTier::offloaded_objects));
    metrics_.AddCounterCallback("granary_node_offloaded_bytes_total",
                                "object bytes copied to disk and attached by the master",
                                count(&DiskTier::offloaded_bytes));
    metrics_.AddCounterCallback("granary_node_promoted_objects_total",
                                "objects copied from disk back to memory and attached",
                                count(&DiskTier::promoted_objects));
    metrics_.AddCounterCallback("granary_node_disk_evicted_objects_total",
                                "disk copies evicted to make room for offloads",
                                count(&DiskTier::evicted_objects));
    metrics_.AddCounterCallback("granary_node_disk_garbage_deleted_total",
                                "disk copies deleted because the master let them go",
                                count(&DiskTier::deleted_garbage));
  }
}

std::string StorageNode::StatusJson() const {
  nlohmann::json doc;
  doc["node_id"] = client_id_;
  doc["endpoint"] = endpoint_;
  doc["master"] = options_.master_address;
  doc["mounted"] = mounted_.load();
  doc["serving"] = serving();
  const auto segment = this->segment();
  doc["segment"] = {{"name", options_.segment_name},
                    {"shm_name", segment ? segment->name() : std::string()},
                    {"size_bytes", segment ? segment->size() : 0}};
  const DataServer::Stats d = server_->stats();
  doc["data_plane"] = {{"port", server_->port()},
                       {"connections", d.open_connections},
                       {"requests", d.requests},
                       {"errors", d.errors},
                       {"bytes_read", d.bytes_read},
                       {"bytes_written", d.bytes_written}};
  if (disk_ != nullptr) {
    const disk::DiskUsage u = disk_->store().Usage();
    doc["disk"] = {{"capacity_bytes", u.capacity},
                   {"used_bytes", u.used},
                   {"objects", u.objects},
                   {"offloaded_objects", disk_->offloaded_objects()},
                   {"offloaded_bytes", disk_->offloaded_bytes()},
                   {"promoted_objects", disk_->promoted_objects()},
                   {"evicted_objects", disk_->evicted_objects()}};
  } else {
    doc["disk"] = nullptr;
  }
  if (staging_ != nullptr) {
    const ShmStaging::Stats s = staging_->stats();
    doc["staging"] = {{"name", staging_->name()},
                      {"capacity_bytes", staging_->data_bytes()},
                      {"used_bytes", s.bytes_in_use},
                      {"slots_in_use", s.slots_in_use}};
  } else {
    doc["staging"] = nullptr;
  }
  return doc.dump(2) + "\n";
}

Status StorageNode::StartHttp() {
  http_ = std::make_unique<HttpServer>();
  http_->Get("/metrics", [this] {
    return HttpResponse{200, std::string(kPrometheusContentType), metrics_.RenderPrometheus()};
  });
  // A load balancer or orchestrator takes the node out of rotation while it is not mounted.
  http_->Get("/health", [this] {
    return serving() ? HttpResponse{200, "text/plain; charset=utf-8", "ok\n"}
                     : HttpResponse{503, "text/plain; charset=utf-8", "not mounted\n"};
  });
  http_->Get("/status", [this] { return HttpResponse{200, "application/json", StatusJson()}; });
  if (Status s = http_->Start(options_.listen_host, *options_.http_port); !s.ok()) return s;
  GLOG_INFO("node HTTP endpoint on {}:{} (/metrics /health /status)", options_.listen_host,
            http_->port());
  return Status::Ok();
}

}  // namespace granary::node
