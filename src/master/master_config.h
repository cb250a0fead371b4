// master/master_config.h - every setting of granary-master, with Mooncake Store's defaults.
//
// Promise: RegisterMasterConfig declares each field once in a ConfigSchema, so it is settable from
// the YAML file (--config) and from a flag, flags winning; Validate catches combinations that no
// single setting's range can (e.g. discard timeout above release timeout).
#pragma once

#include <cstdint>
#include <string>

#include "common/config_schema.h"
#include "master/state/master_state.h"
#include "master/policy/offload_planner.h"

namespace granary::master {

struct MasterConfig {
  std::string host = "127.0.0.1";  // bind address of both ports; 0.0.0.0 to serve other hosts
  uint16_t port = 50051;           // gRPC
  uint16_t http_port = 9003;       // /metrics, /health, /status
  uint16_t fast_port = 0;          // the hot calls over framed TCP (0 picks a free one)
  bool fast_path = true;           // false: no fast port, every call over gRPC
  bool fast_local = true;          // the fast port also on a local socket (not under TLS)
  // Started with an empty state, the master makes writes wait out the cache leases an earlier
  // master may have granted (up to --cache-lease from its start): docs/control-path.md.
  bool restart_settle = true;
  std::string log_level = "info";
  uint64_t rpc_threads = 0;        // 0: gRPC's default
  // Operations one caller applies per turn of the apply lock, its own and others' queued
  // meanwhile (ApplyCombiner); 1: each caller applies only its own, in arrival order.
  uint64_t apply_turn_ops = 32;
  // ...and only while at least this many callers wait (fewer: the lock passes in arrival order).
  uint64_t apply_combine_waiting = 4;
  // ...and a turn's PutStarts are applied as one group on the waiting callers' threads. Off by
  // default: on 2 cores it gains nothing (docs/benchmarks.md); it is meant for many cores.
  bool apply_groups = false;
  uint64_t shard_count = 1024;
  std::string history_file;        // empty: no history file
  std::string eviction_policy = "prefix";  // prefix, s3fifo or lru; see EvictionPolicy
  MasterPolicy policy;             // policy.shard_count and eviction_policy are taken from above
  // The SSD tier: which memory objects nodes with a disk copy to it (see OffloadPlanner).
  std::string persistence = "lazy";  // eager, lazy or none
  double offload_watermark = 0.80;
  // A disk-only object read this many times gets a memory replica again (PromotionTracker);
  // 0 disables promotion.
  uint64_t promote_after = 2;
  // Re-replication and drains (docs/operations.md): megabytes per second copied into new
  // replicas, all nodes together; 0: none (a drain without --drop then never ends).
  double rereplicate_mbps = 200;

  // High availability (docs/ha.md). Empty etcd: this master runs alone, as before.
  std::string etcd;                  // "HOST:PORT[;HOST:PORT...]" (an etcd:// prefix is accepted)
  std::string cluster_id = "granary";
  std::string advertise;             // gRPC address others reach (default host:port)
  uint64_t sync_standbys = 1;        // 1: replies wait for the synchronous standby; 0: async
  bool allow_serving_alone = false;  // sync 1 with no standby to be had: serve async, not refuse
  int64_t leader_lease_ms = 2000;
  int64_t lease_margin_ms = 500;
  int64_t sync_timeout_ms = 3000;
  int64_t standby_timeout_ms = 1000;
  uint64_t replication_log_bytes = 256ull << 20;

  // Security (docs/security.md).
  std::string auth_token_file;  // the cluster's secret; empty: no caller is asked for one
  bool insecure = false;        // serve a non-loopback host without a secret anyway
  std::string admin_token_file;  // the admin's secret; empty: the cluster's secret is admin
  std::string tenants_file;      // NAME TOKEN [QUOTA] a line (security/tenants.h); empty: none
  // TLS on gRPC and the fast port (security/tls.h); empty cert and key: plain TCP.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;  // clients must present a certificate it signed (mutual TLS)
  std::string etcd_auth_file;  // USER:PASSWORD of etcd's user (security/secret.h); empty: none

  OffloadPolicy EffectiveOffload() const {
    OffloadPolicy o;
    auto parsed = ParsePersistence(persistence);  // validated by ValidateMasterConfig
    o.persistence = parsed.ok() ? *parsed : Persistence::kLazy;
    o.offload_watermark = offload_watermark;
    return o;
  }

  MasterPolicy EffectivePolicy() const {
    MasterPolicy p = policy;
    p.shard_count = static_cast<uint32_t>(shard_count);
    p.eviction_policy = eviction_policy == "lru"      ? EvictionPolicy::kLru
                        : eviction_policy == "prefix" ? EvictionPolicy::kPrefix
                                                      : EvictionPolicy::kS3Fifo;
    return p;
  }
};

void RegisterMasterConfig(ConfigSchema& schema, MasterConfig* config);
Status ValidateMasterConfig(const MasterConfig& config);

}  // namespace granary::master
