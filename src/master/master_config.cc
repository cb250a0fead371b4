#include "master/master_config.h"

#include "security/secret.h"

namespace granary::master {

void RegisterMasterConfig(ConfigSchema& schema, MasterConfig* c) {
  schema.AddString("host", &c->host, "address to bind the gRPC and HTTP ports to");
  schema.AddPort("port", &c->port, "gRPC port of the master API (0 picks a free one)");
  schema.AddPort("http_port", &c->http_port, "HTTP port for /metrics, /health, /status");
  schema.AddPort("fast_port", &c->fast_port,
                 "port of the hot calls (put, get, exist, ping) as framed protobuf over TCP; "
                 "clients learn it over gRPC (0 picks a free one; docs/control-path.md)");
  schema.AddBool("fast_path", &c->fast_path,
                 "serve the fast port; false: clients make every call over gRPC");
  schema.AddBool("fast_local", &c->fast_local,
                 "also serve the fast port on a local (unix) socket for clients on this host, "
                 "about half a loopback TCP round trip; ignored under TLS");
  schema.AddString("log_level", &c->log_level, "trace, debug, info, warn, error or off");
  schema.AddUint("rpc_threads", &c->rpc_threads, "gRPC server threads (0: gRPC's default)", 0, 256);
  schema.AddUint("apply_turn_ops", &c->apply_turn_ops,
                 "operations one caller applies per turn of the apply lock, its own and those "
                 "queued meanwhile (1: only its own)", 1, 4096);
  schema.AddUint("apply_combine_waiting", &c->apply_combine_waiting,
                 "a caller applies others' operations only while at least this many wait; "
                 "with fewer the apply lock passes in arrival order", 1, 4096);
  schema.AddBool("apply_groups", &c->apply_groups,
                 "a turn's concurrent put starts are applied as one group: their keys' checks "
                 "and inserts shard by shard on the waiting callers' threads, their placements "
                 "in order (the same state as one by one)");
  MasterPolicy& p = c->policy;
  schema.AddDurationMs("lease_ttl", &p.lease_ttl_ms, "how long a read lock lasts unless released");
  schema.AddDurationMs("cache_lease", &p.cache_lease_ms,
                       "the longest cache lease a get grants: a client re-reads the key from the "
                       "replicas it was named without asking, and another client's put or remove "
                       "of the key waits it out (0: none; at most 60s)");
  schema.AddBool("restart_settle", &c->restart_settle,
                 "started with an empty state, make puts and removes wait out the cache leases "
                 "a previous master may have granted (until --cache-lease after the start); "
                 "false only where no earlier master served these nodes' clients");
  schema.AddDurationMs("mount_quarantine", &p.mount_quarantine_ms,
                       "a remounted segment takes no new objects for this long (late readers and "
                       "writers of its old mount)");
  schema.AddDurationMs("write_quarantine", &p.write_quarantine_ms,
                       "space of a put revoked after a transfer error is reused only after this");
  schema.AddString("history_file", &c->history_file,
                   "append every operation of the ordered history to this file (debugging, "
                   "replay tests); empty: off");
  schema.AddDurationMs("soft_pin_ttl", &p.soft_pin_ttl_ms,
                       "how long a soft pin protects an object after its last read");
  schema.AddDurationMs("client_ttl", &p.client_ttl_ms,
                       "a node silent this long is dead: its segments are unmounted");
  schema.AddDurationMs("put_discard_timeout", &p.put_discard_timeout_ms,
                       "after this, an unfinished put may be started again by anyone");
  schema.AddDurationMs("put_release_timeout", &p.put_release_timeout_ms,
                       "after this, the space of an unfinished put is freed");
  schema.AddDurationMs("reservation_ttl", &p.reservation_ttl_ms,
                       "lease of space a client reserves for one-round-trip puts");
  schema.AddSize("reservation_max_bytes", &p.reservation_max_bytes,
                 "most bytes one client may hold reserved (0: no reservations)");
  schema.AddDouble("eviction_high_watermark", &p.eviction_high_watermark,
                   "usage fraction above which background eviction runs", 0.0, 1.0);
  schema.AddDouble("eviction_ratio", &p.eviction_ratio,
                   "fraction of the capacity one eviction run frees", 0.0, 1.0);
  schema.AddBool("allow_evict_soft_pinned", &p.allow_evict_soft_pinned,
                 "evict soft-pinned objects once nothing else is left");
  schema.AddString("eviction_policy", &c->eviction_policy,
                   "prefix (the default: s3fifo that lets a put batch's tail and long batches "
                   "leave probation first, and copies no unread tail to disk; docs/eviction.md), "
                   "s3fifo (probation queue, main queue, ghost) or lru (least recently read "
                   "first)");
  schema.AddDouble("eviction_small_ratio", &p.eviction_small_ratio,
                   "s3fifo: share of the evictable bytes the probation queue keeps", 0.0, 1.0);
  schema.AddDouble("eviction_ghost_ratio", &p.eviction_ghost_ratio,
                   "s3fifo: evicted keys remembered, as a multiple of the objects held", 0.0, 64.0);
  schema.AddString("persistence", &c->persistence,
                   "SSD tier: eager (nodes copy every object to disk soon after its put), lazy "
                   "(objects near eviction, so eviction keeps them on disk) or none");
  schema.AddDouble("offload_watermark", &c->offload_watermark,
                   "SSD tier, lazy: a node's memory usage above which it offloads", 0.0, 1.0);
  schema.AddUint("promote_after", &c->promote_after,
                 "SSD tier: a disk-only object read this many times is copied back to memory by "
                 "its node, if its segment stays below eviction_high_watermark (0: never)",
                 0, 1'000'000);
  schema.AddDouble("rereplicate_mbps", &c->rereplicate_mbps,
                   "megabytes per second that nodes copy into new replicas of objects short of "
                   "their replica count (a node died, a drain, granary replicate), all nodes "
                   "together; 0: no re-replication",
                   0.0, 1e6);
  schema.AddUint("shard_count", &c->shard_count, "metadata shards, each with its own lock", 1024,
                 1 << 20);
  schema.AddString("etcd", &c->etcd,
                   "HA: etcd endpoints HOST:PORT[;HOST:PORT...]; masters of one cluster elect a "
                   "leader there and the others stand by (docs/ha.md). Empty: run alone");
  schema.AddString("cluster_id", &c->cluster_id,
                   "HA: the cluster's name: its keys live under /granary/<cluster_id>/ in etcd");
  schema.AddString("advertise", &c->advertise,
                   "HA: this master's gRPC address as nodes, clients and other masters reach it "
                   "(default host:port; required when host is 0.0.0.0)");
  schema.AddUint("sync_standbys", &c->sync_standbys,
                 "HA: 1: a reply that changes the state waits until the synchronous standby has "
                 "the operation (no acknowledged put is lost by a failover); 0: asynchronous "
                 "(a failover may lose the last operations)",
                 0, 1);
  schema.AddBool("allow_serving_alone", &c->allow_serving_alone,
                 "HA, sync_standbys 1: with no synchronous standby to be had for standby_timeout, "
                 "serve asynchronously instead of refusing changes (reported in /metrics)");
  schema.AddDurationMs("leader_lease", &c->leader_lease_ms,
                       "HA: the etcd lease of a master (whole seconds; etcd may grant more): a "
                       "dead leader is replaced about this long after it died");
  schema.AddDurationMs("lease_margin", &c->lease_margin_ms,
                       "HA: a leader stops serving this long before etcd could expire its lease");
  schema.AddDurationMs("sync_timeout", &c->sync_timeout_ms,
                       "HA: how long a reply waits for the synchronous standby before it fails "
                       "(outcome unknown to the caller)");
  schema.AddDurationMs("standby_timeout", &c->standby_timeout_ms,
                       "HA: a standby (or leader) silent this long on the history stream is "
                       "dropped; another standby becomes synchronous");
  schema.AddSize("replication_log_bytes", &c->replication_log_bytes,
                 "HA: recent history kept for standbys that reconnect (older: a snapshot)");
  schema.AddString("auth_token_file", &c->auth_token_file,
                   "file (mode 0600) whose first line is the cluster's secret: every call, on "
                   "gRPC and the fast port, must present it (clients, nodes and standby masters "
                   "read the same file); further lines: secondary secrets accepted too, for a "
                   "rotation; empty: none (docs/security.md)");
  schema.AddString("admin_token_file", &c->admin_token_file,
                   "file (mode 0600) whose first line is the admin's secret: only it may remove "
                   "across tenants (remove-all, remove by regex) or force a removal; needs "
                   "auth_token_file; empty: the cluster's secret is the admin's");
  schema.AddString("tenants_file", &c->tenants_file,
                   "file (mode 0600) naming tenants, a line each: NAME TOKEN [QUOTA]; a client "
                   "presenting a tenant's token works in that tenant's own key namespace, within "
                   "its quota; needs auth_token_file (docs/security.md)");
  schema.AddString("tls_cert", &c->tls_cert_file,
                   "TLS on gRPC and the fast port: this master's certificate chain (PEM); a "
                   "standby presents it to the leader too (docs/security.md)");
  schema.AddString("tls_key", &c->tls_key_file, "TLS: the key of tls_cert (PEM, mode 0600)");
  schema.AddString("tls_ca", &c->tls_ca_file,
                   "TLS: the CA (PEM) whose certificates clients, nodes and other masters must "
                   "present (mutual TLS); a standby verifies the leader with it (without it, "
                   "with the system's roots)");
  schema.AddString("etcd_auth_file", &c->etcd_auth_file,
                   "HA: file (mode 0600) whose first line is USER:PASSWORD of an etcd user, for "
                   "an etcd with auth enabled (docs/security.md); empty: none");
  schema.AddBool("insecure", &c->insecure,
                 "serve a host other than loopback without auth_token_file (anyone who reaches "
                 "the ports can then read, write and remove everything)");
}

Status ValidateMasterConfig(const MasterConfig& c) {
  const MasterPolicy& p = c.policy;
  auto positive = [](int64_t v, const char* name) -> Status {
    if (v <= 0) return Status(ErrorCode::INVALID_PARAMS, std::string(name) + " must be positive");
    return Status::Ok();
  };
  for (auto [v, name] : {std::pair{p.lease_ttl_ms, "lease_ttl"}, {p.client_ttl_ms, "client_ttl"},
                         {p.put_discard_timeout_ms, "put_discard_timeout"},
                         {p.put_release_timeout_ms, "put_release_timeout"},
                         {p.soft_pin_ttl_ms, "soft_pin_ttl"},
                         {p.reservation_ttl_ms, "reservation_ttl"}}) {
    if (Status s = positive(v, name); !s.ok()) return s;
  }
  if (p.cache_lease_ms < 0 || p.cache_lease_ms > 60'000) {
    // A client waits at most 60 s for a settle (client_impl.h Settle): a longer lease could
    // outlive the wait.
    return Status(ErrorCode::INVALID_PARAMS, "cache_lease must be between 0 and 60s");
  }
  if (c.eviction_policy != "lru" && c.eviction_policy != "s3fifo" && c.eviction_policy != "prefix") {
    return Status(ErrorCode::INVALID_PARAMS,
                  "eviction_policy '" + c.eviction_policy + "' is not lru, s3fifo or prefix");
  }
  if (auto persistence = ParsePersistence(c.persistence); !persistence.ok()) {
    return persistence.status();
  }
  if (!c.etcd.empty()) {
    if (c.cluster_id.empty() || c.cluster_id.find('/') != std::string::npos) {
      return Status(ErrorCode::INVALID_PARAMS, "cluster_id must be non-empty and without '/'");
    }
    if (c.advertise.empty() && (c.host == "0.0.0.0" || c.host == "::" || c.host.empty())) {
      return Status(ErrorCode::INVALID_PARAMS,
                    "--advertise HOST:PORT is needed with --etcd when binding " + c.host +
                        ": other masters, nodes and clients must know where to reach this one");
    }
    if (c.leader_lease_ms < 1000) {
      return Status(ErrorCode::INVALID_PARAMS, "leader_lease must be at least 1s (etcd counts "
                                               "leases in whole seconds)");
    }
    if (c.lease_margin_ms <= 0 || c.lease_margin_ms >= c.leader_lease_ms) {
      return Status(ErrorCode::INVALID_PARAMS,
                    "lease_margin must be positive and shorter than leader_lease");
    }
    for (auto [v, name] : {std::pair{c.sync_timeout_ms, "sync_timeout"},
                           {c.standby_timeout_ms, "standby_timeout"}}) {
      if (Status s = positive(v, name); !s.ok()) return s;
    }
    if (!c.fast_path) {
      return Status(ErrorCode::INVALID_PARAMS,
                    "--etcd needs the fast port (standbys stream the history over it)");
    }
  }
  if (c.auth_token_file.empty() && !c.insecure && !security::IsLoopbackHost(c.host)) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "host " + c.host + " serves other machines, and without --auth-token-file "
                  "anyone who reaches the port can read, write and remove every object and "
                  "unmount every node: give the cluster's secret file (docs/security.md), or "
                  "--insecure on a network only trusted hosts reach");
  }
  if (c.auth_token_file.empty() && (!c.admin_token_file.empty() || !c.tenants_file.empty())) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "--admin-token-file and --tenants-file need --auth-token-file too (the "
                  "cluster's secret, which nodes and standby masters present)");
  }
  if ((!c.tls_cert_file.empty() || !c.tls_key_file.empty() || !c.tls_ca_file.empty()) &&
      (c.tls_cert_file.empty() || c.tls_key_file.empty())) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "TLS needs both --tls-cert and --tls-key (--tls-ca adds client certificates)");
  }
  if (p.put_release_timeout_ms < p.put_discard_timeout_ms) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "put_release_timeout must not be shorter than put_discard_timeout");
  }
  return Status::Ok();
}

}  // namespace granary::master
