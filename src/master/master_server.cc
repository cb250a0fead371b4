#include "master/master_server.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "security/secret.h"
#include "security/tls.h"

namespace granary::master {

namespace {
constexpr auto kHousekeepingTick = std::chrono::milliseconds(100);
constexpr int kMaxMessageBytes = 256 << 20;
}  // namespace

MasterServer::MasterServer(MasterConfig config, const Clock* clock)
    : config_(std::move(config)),
      clock_(clock),
      state_(std::make_unique<MasterState>(config_.EffectivePolicy(), clock_)),
      evictor_(std::make_unique<Evictor>(state_.get())) {
  service_ = std::make_unique<MasterService>(state_.get(), evictor_.get(), &metrics_,
                                             config_.EffectiveOffload(),
                                             static_cast<uint32_t>(config_.promote_after));
  service_->replica_planner().set_mbps(config_.rereplicate_mbps);
  state_->set_apply_turns(static_cast<size_t>(config_.apply_turn_ops),
                          static_cast<size_t>(config_.apply_combine_waiting));
  state_->set_apply_groups(config_.apply_groups);
  RegisterMetrics();
}

MasterServer::~MasterServer() { Shutdown(); }

Status MasterServer::Start() {
  security::Credentials credentials;
  // Each file's first line is the secret; further lines, secondary ones a rotation accepts too.
  if (!config_.auth_token_file.empty()) {
    auto loaded = security::LoadAcceptedSecrets(config_.auth_token_file);
    if (!loaded.ok()) return loaded.status();
    credentials.cluster = std::move(loaded->front());
    credentials.cluster_secondary.assign(loaded->begin() + 1, loaded->end());
  }
  if (!config_.admin_token_file.empty()) {
    auto loaded = security::LoadAcceptedSecrets(config_.admin_token_file);
    if (!loaded.ok()) return loaded.status();
    credentials.admin = std::move(loaded->front());
    credentials.admin_secondary.assign(loaded->begin() + 1, loaded->end());
  }
  if (!config_.tenants_file.empty()) {
    auto loaded = security::LoadTenantsFile(config_.tenants_file);
    if (!loaded.ok()) return loaded.status();
    credentials.tenants = std::move(*loaded);
  }
  if (Status s = credentials.Validate(); !s.ok()) return s;
  const std::string secret = credentials.cluster;
  // TLS: the server's side for gRPC and the fast port (a standby's client side: with HA below).
  std::shared_ptr<const security::TlsContext> tls_server;
  const security::TlsFiles tls_files{config_.tls_cert_file, config_.tls_key_file,
                                     config_.tls_ca_file};
  if (tls_files.any()) {
    auto server = security::TlsContext::Load(tls_files, security::TlsContext::Side::kServer);
    if (!server.ok()) return server.status();
    tls_server = std::move(*server);
  }
  auth_ = std::make_unique<security::Authenticator>(std::move(credentials), &metrics_,
                                                    "granary_master");
  service_->set_authenticator(auth_.get());
  RegisterTenantMetrics();
  if (!config_.history_file.empty()) {
    auto history = HistoryFile::Create(config_.history_file, *state_);
    if (!history.ok()) return history.status();
    history_ = std::move(*history);
    state_->AddObserver([h = history_.get()](const Operation& op, const OpResult&) { h->Append(op); });
  }
  if (!config_.etcd.empty()) {
    ha::HaOptions o;
    o.etcd_endpoints = etcd::EtcdEndpointsOf(config_.etcd).value_or(config_.etcd);
    o.cluster_id = config_.cluster_id;
    o.sync_standbys = static_cast<uint32_t>(config_.sync_standbys);
    o.allow_serving_alone = config_.allow_serving_alone;
    o.leader_lease = std::chrono::milliseconds(config_.leader_lease_ms);
    o.lease_margin = std::chrono::milliseconds(config_.lease_margin_ms);
    o.sync_timeout = std::chrono::milliseconds(config_.sync_timeout_ms);
    o.standby_timeout = std::chrono::milliseconds(config_.standby_timeout_ms);
    o.log_bytes = config_.replication_log_bytes;
    o.restart_settle = config_.restart_settle;
    o.secret = secret;  // a standby presents it to the leader's fast port
    if (tls_files.any()) {  // a standby presents the same certificate to the leader
      auto client = security::TlsContext::Load(tls_files, security::TlsContext::Side::kClient);
      if (!client.ok()) return client.status();
      o.tls = std::move(*client);
    }
    if (!config_.etcd_auth_file.empty()) {
      auto user = security::LoadUserPasswordFile(config_.etcd_auth_file);
      if (!user.ok()) return user.status();
      o.etcd_credentials = {user->user, user->password};
    }
    coordinator_ = std::make_unique<ha::Coordinator>(state_.get(), std::move(o), &metrics_);
    // Before anything can apply: every operation, the leader's or a replayed one, goes to the
    // log standbys stream from.
    state_->AddObserver([c = coordinator_.get()](const Operation& op, const OpResult&) {
      c->Record(op);
    });
    service_->set_gate(coordinator_.get());
    service_->set_cluster_status([c = coordinator_.get()](proto::ClusterStatusResponse* out) {
      c->FillClusterStatus(out);
    });
  }
  // Alone, this master starts empty: clients may still cache what an earlier one named.
  if (!coordinator_ && config_.restart_settle) state_->AssumeEarlierCacheLeases();
  grpc::ServerBuilder builder;
  int selected = 0;
  std::string address = config_.host + ":" + std::to_string(config_.port);
  builder.AddListeningPort(
      address, tls_server ? tls_server->ServerCredentials() : grpc::InsecureServerCredentials(),
      &selected);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // SO_REUSEPORT would let a second master silently share the port; a taken port must fail.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (config_.rpc_threads > 0) {
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                                static_cast<int>(config_.rpc_threads));
  }
  grpc_ = builder.BuildAndStart();
  if (!grpc_ || selected == 0) {
    grpc_.reset();
    return Status(ErrorCode::INTERNAL_ERROR,
                  "cannot listen for gRPC on " + address + " (port taken or address invalid)");
  }
  grpc_port_ = static_cast<uint16_t>(selected);
  if (config_.fast_path) {
    fast_ = std::make_unique<FastServer>(service_.get(), &metrics_);
    fast_->set_authenticator(auth_.get());
    fast_->set_tls(tls_server);
    if (coordinator_) {
      fast_->set_stream_handler(
          [c = coordinator_.get()](net::ByteStream& conn, std::string_view request) {
            c->streams().Serve(conn, request);
          });
    }
    if (Status s = fast_->Start(config_.host, config_.fast_port); !s.ok()) {
      fast_.reset();
      grpc_->Shutdown();
      grpc_.reset();
      return s;
    }
    if (config_.fast_local && tls_server == nullptr) {
      // Optional: without it, clients on this host use the TCP port as others do.
      if (Status s = fast_->StartLocal(); s.ok()) {
        service_->set_fast_local_socket(fast_->local_name());
      } else {
        GLOG_WARN("{}; local clients use the TCP fast port", s.message());
      }
    }
    service_->set_fast_port(fast_->port());
  }

  http_.Get("/metrics", [this] {
    return HttpResponse{200, std::string(kPrometheusContentType), metrics_.RenderPrometheus()};
  });
  http_.Get("/health", [] { return HttpResponse{200, "text/plain; charset=utf-8", "OK\n"}; });
  http_.Get("/status", [this] { return HttpResponse{200, "application/json", StatusJson()}; });
  // The ordered history's position and the digest of the state there; a snapshot of it. For
  // replay tests and for comparing masters (docs/master.md, "Ordered history").
  http_.Get("/debug/digest", [this] {
    MasterState::Fingerprint f = state_->StateFingerprint();
    if (history_) (void)history_->Flush();  // every op up to f.seq is in the file
    nlohmann::json doc;
    doc["seq"] = f.seq;
    doc["digest"] = fmt::format("{:016x}", f.digest);
    return HttpResponse{200, "application/json", doc.dump() + "\n"};
  });
  if (!auth_->required()) {  // the state holds every node's data-plane token
    http_.Get("/debug/snapshot", [this] {
      return HttpResponse{200, "application/octet-stream", state_->EncodeSnapshot()};
    });
  }
  if (Status s = http_.Start(config_.host, config_.http_port); !s.ok()) {
    if (fast_) fast_->Stop();
    grpc_->Shutdown();
    grpc_.reset();
    return s;
  }
  service_->set_http_port(http_.port());
  if (coordinator_) {
    const std::string advertise = config_.advertise.empty()
                                      ? config_.host + ":" + std::to_string(grpc_port_)
                                      : config_.advertise;
    coordinator_->SetEndpoints(advertise, fast_ ? fast_->port() : 0, http_.port(),
                               fast_ ? fast_->local_name() : "");
    if (Status s = coordinator_->Start(); !s.ok()) {
      http_.Stop();
      if (fast_) fast_->Stop();
      grpc_->Shutdown();
      grpc_.reset();
      return s;
    }
  }
  {
    std::lock_guard lock(mu_);
    started_ = true;
  }
  housekeeping_ = std::thread([this] { HousekeepingLoop(); });
  GLOG_INFO("master listening: gRPC {}:{}, HTTP {}:{}, fast {}", config_.host, grpc_port_,
            config_.host, http_.port(), fast_ ? std::to_string(fast_->port()) : "off");
  return Status::Ok();
}

void MasterServer::Wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return stopping_; });
}

void MasterServer::Shutdown() {
  std::lock_guard shutdown_lock(shutdown_mu_);
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (housekeeping_.joinable()) housekeeping_.join();
  if (coordinator_) coordinator_->Stop();  // a leader hands over before its ports close
  http_.Stop();
  if (fast_) {
    service_->set_fast_port(0);
    fast_->Stop();
  }
  if (grpc_) {
    // Calls in flight get a short grace; idle connections would otherwise hold it to the deadline.
    grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
    grpc_->Wait();
    grpc_.reset();
  }
  if (history_) (void)history_->Flush();
}

void MasterServer::HousekeepingLoop() {
  // A new leader gives every client a full TTL from its term's start before it expires one (as
  // etcd's lessor does): a node that pinged the old leader last could not ping this one before.
  uint64_t term_seen = 0;
  int64_t expire_from_ms = 0;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, kHousekeepingTick, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    // Only the leader changes the state; a standby's follows the stream.
    if (coordinator_ && !coordinator_->Enter(false).ok()) {
      lock.lock();
      continue;
    }
    const int64_t now_ms = clock_->NowMs();
    if (coordinator_ && coordinator_->term() != term_seen) {
      term_seen = coordinator_->term();
      expire_from_ms = now_ms + state_->policy().client_ttl_ms;
    }
    const bool may_expire = now_ms >= expire_from_ms;
    for (const auto& client :
         may_expire ? state_->SilentClients(now_ms) : std::vector<std::string>{}) {
      auto expired = state_->ExpireClient(client);
      if (!expired.unmounted.empty()) {
        GLOG_WARN("client {} silent for {} ms: unmounted {} segment(s)", client,
                  state_->policy().client_ttl_ms, expired.unmounted.size());
      }
      expired_clients_->Inc();
    }
    SweepResult swept = state_->Sweep();
    discarded_puts_->Inc(swept.discarded_puts);
    service_->FinishDrains();
    EvictResult evicted = evictor_->RunIfAboveWatermark();
    watermark_evictions_->Inc(evicted.objects);
    if (evicted.objects > 0) {
      GLOG_DEBUG("evicted {} objects, {} bytes", evicted.objects, evicted.bytes);
    }
    if (coordinator_) coordinator_->Exit();
    lock.lock();
  }
}

void MasterServer::RegisterTenantMetrics() {
  if (auth_->tenants().empty()) return;
  using Series = std::vector<std::pair<Labels, double>>;
  const security::Authenticator* auth = auth_.get();
  MasterState* s = state_.get();
  auto per_tenant = [auth, s](auto value_of) {
    return [auth, s, value_of] {
      Series series;
      for (const auto& t : auth->tenants()) {
        series.push_back({{{"tenant", t.tenant}}, value_of(t, s->UsageOf(t.tenant))});
      }
      return series;
    };
  };
  metrics_.AddGaugeCallback(
      "granary_master_tenant_bytes", "bytes of a tenant's objects, complete and being put",
      per_tenant([](const security::Principal&, const MasterState::TenantUsage& u) {
        return static_cast<double>(u.bytes);
      }));
  metrics_.AddGaugeCallback(
      "granary_master_tenant_objects", "a tenant's complete objects",
      per_tenant([](const security::Principal&, const MasterState::TenantUsage& u) {
        return static_cast<double>(u.objects);
      }));
  metrics_.AddGaugeCallback(
      "granary_master_tenant_quota_bytes", "a tenant's quota (0: none)",
      per_tenant([](const security::Principal& t, const MasterState::TenantUsage&) {
        return static_cast<double>(t.quota_bytes);
      }));
}

void MasterServer::RegisterMetrics() {
  evicted_objects_ = metrics_.AddCounter("granary_master_evicted_objects_total", "objects evicted");
  evicted_bytes_ = metrics_.AddCounter("granary_master_evicted_bytes_total",
                                       "replica bytes freed by eviction");
  eviction_runs_ = metrics_.AddCounter("granary_master_eviction_runs_total", "eviction runs");
  // The service counts reason="allocation" (a put that found no space); same help, one family.
  watermark_evictions_ = metrics_.AddCounter(
      "granary_master_evictions_total",
      "objects evicted from memory, by what started it: usage above the high watermark "
      "(housekeeping) or a put that found no space",
      {{"reason", "watermark"}});
  expired_clients_ = metrics_.AddCounter("granary_master_expired_clients_total",
                                         "clients declared dead after their TTL");
  discarded_puts_ = metrics_.AddCounter("granary_master_discarded_puts_total",
                                        "unfinished puts freed at the release timeout");
  state_->AddObserver([this](const Operation&, const OpResult& result) {
    if (const auto* e = std::get_if<EvictResult>(&result)) {
      evicted_objects_->Inc(e->objects);
      evicted_bytes_->Inc(e->bytes);
      eviction_runs_->Inc();
    }
  });
  auto single = [](double v) { return std::vector<std::pair<Labels, double>>{{{}, v}}; };
  MasterState* s = state_.get();
  MasterService* service = service_.get();
  // One unlabelled value read from the state by one of its getters.
  auto of_state = [s, single](auto getter) {
    return [s, single, getter] { return single(static_cast<double>((s->*getter)())); };
  };
  metrics_.AddGaugeCallback(
      "granary_master_rereplication_backlog_objects",
      "objects short of their memory replica count, as of the last re-replication scan",
      [service, single] {
        return single(static_cast<double>(service->replica_planner().GetStats().backlog_objects));
      });
  metrics_.AddGaugeCallback(
      "granary_master_rereplication_backlog_bytes", "bytes of those objects",
      [service, single] {
        return single(static_cast<double>(service->replica_planner().GetStats().backlog_bytes));
      });
  metrics_.AddCounterCallback("granary_master_apply_turns_total",
                              "turns of the apply lock taken by Apply callers (ApplyCombiner)",
                              of_state(&MasterState::apply_turns));
  metrics_.AddCounterCallback(
      "granary_master_applies_combined_total",
      "operations applied on another caller's turn: under contention, most of them",
      of_state(&MasterState::applies_combined));
  metrics_.AddCounterCallback(
      "granary_master_applies_grouped_total",
      "put starts applied in a group of a turn (--apply-groups), one by one after a check "
      "included",
      of_state(&MasterState::applies_grouped));
  metrics_.AddCounterCallback(
      "granary_master_apply_parts_helped_total",
      "parts of a group's shard work that ran on a waiting caller's thread",
      of_state(&MasterState::apply_parts_helped));
  metrics_.AddGaugeCallback("granary_master_replica_copies_in_flight",
                            "re-replication copies nodes are making now",
                            of_state(&MasterState::copies_in_flight));
  metrics_.AddGaugeCallback("granary_master_draining_segments", "segments being drained",
                            [s, single] {
                              double n = 0;
                              for (const auto& [name, mark] : s->segments().Drains()) {
                                n += !mark.done;
                              }
                              return single(n);
                            });
  metrics_.AddCounterCallback(
      "granary_master_rereplicated_objects_total", "copies attached as new memory replicas",
      of_state(&MasterState::copies_attached));
  metrics_.AddCounterCallback(
      "granary_master_rereplicated_bytes_total", "bytes of copies attached as new memory replicas",
      of_state(&MasterState::copied_bytes));
  metrics_.AddGaugeCallback("granary_master_objects", "complete objects",
                            of_state(&MasterState::object_count));
  metrics_.AddGaugeCallback("granary_master_pending_puts", "puts between start and end",
                            of_state(&MasterState::pending_count));
  metrics_.AddGaugeCallback("granary_master_reservations", "extents reserved for puts",
                            of_state(&MasterState::reservation_count));
  metrics_.AddGaugeCallback("granary_master_reserved_bytes", "bytes reserved for puts",
                            of_state(&MasterState::reserved_bytes));
  metrics_.AddGaugeCallback("granary_master_clients", "live clients and nodes",
                            of_state(&MasterState::client_count));
  metrics_.AddGaugeCallback(
      "granary_master_deferred_frees", "extents waiting for read locks or zombie writers to end",
      of_state(&MasterState::deferred_free_count));
  metrics_.AddGaugeCallback(
      "granary_master_disk_garbage", "disk copies the master let go that their nodes must delete",
      of_state(&MasterState::disk_garbage_count));
  metrics_.AddGaugeCallback(
      "granary_master_disk_garbage_dropped",
      "disk garbage forgotten at the bound (those copies keep their disk space until evicted)",
      of_state(&MasterState::disk_garbage_dropped));
  metrics_.AddGaugeCallback("granary_master_capacity_bytes", "bytes of all mounted segments", [s, single] {
    return single(static_cast<double>(s->segments().total_capacity()));
  });
  metrics_.AddGaugeCallback("granary_master_used_bytes", "allocated bytes of all segments", [s, single] {
    return single(static_cast<double>(s->segments().used_bytes()));
  });
  metrics_.AddGaugeCallback("granary_master_segments", "mounted segments", [s, single] {
    return single(static_cast<double>(s->segments().segment_count()));
  });
  using Series = std::vector<std::pair<Labels, double>>;
  auto per_segment = [s](auto value_of) {
    return [s, value_of] {
      Series series;
      for (const auto& u : s->segments().Usage()) {
        series.push_back({{{"segment", u.identity->name}}, value_of(u)});
      }
      return series;
    };
  };
  metrics_.AddGaugeCallback("granary_segment_capacity_bytes", "segment size",
                            per_segment([](const SegmentUsage& u) {
                              return static_cast<double>(u.stats.capacity);
                            }));
  metrics_.AddGaugeCallback("granary_segment_free_bytes", "free bytes of a segment",
                            per_segment([](const SegmentUsage& u) {
                              return static_cast<double>(u.stats.free_bytes);
                            }));
  metrics_.AddGaugeCallback("granary_segment_largest_free_block_bytes",
                            "largest allocatable block of a segment",
                            per_segment([](const SegmentUsage& u) {
                              return static_cast<double>(u.stats.largest_free_block);
                            }));
  metrics_.AddGaugeCallback("granary_segment_fragmentation_ratio",
                            "1 - largest free block / free bytes",
                            per_segment([](const SegmentUsage& u) {
                              return u.stats.fragmentation();
                            }));
  metrics_.AddGaugeCallback("granary_segment_replicas", "replicas held by a segment",
                            per_segment([](const SegmentUsage& u) {
                              return static_cast<double>(u.replica_count);
                            }));
}

std::string MasterServer::StatusJson() const {
  nlohmann::json doc;
  doc["capacity_bytes"] = state_->segments().total_capacity();
  doc["used_bytes"] = state_->segments().used_bytes();
  doc["objects"] = state_->object_count();
  doc["pending_puts"] = state_->pending_count();
  doc["clients"] = state_->client_count();
  doc["view_version"] = state_->segments().view_version();
  const proto::DiskStats disk = service_->DiskTotals();
  doc["disk_capacity_bytes"] = disk.capacity_bytes();
  doc["disk_used_bytes"] = disk.used_bytes();
  doc["disk_objects"] = disk.object_count();
  doc["disk_promoted_objects"] = disk.promoted_objects();
  doc["disk_garbage"] = state_->disk_garbage_count();
  nlohmann::json segments = nlohmann::json::array();
  for (const auto& u : state_->segments().Usage()) {
    segments.push_back({{"id", u.identity->id},
                        {"name", u.identity->name},
                        {"node_id", u.identity->client_id},
                        {"endpoint", u.identity->endpoint},
                        {"capacity_bytes", u.stats.capacity},
                        {"used_bytes", u.stats.used_bytes},
                        {"free_bytes", u.stats.free_bytes},
                        {"largest_free_block", u.stats.largest_free_block},
                        {"fragmentation", u.stats.fragmentation()},
                        {"replicas", u.replica_count}});
  }
  doc["segments"] = std::move(segments);
  if (coordinator_) doc["ha"] = coordinator_->StatusJson();
  return doc.dump(2) + "\n";
}

}  // namespace granary::master
