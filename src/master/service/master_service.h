// master/service/master_service.h - the gRPC face of the master: translates requests into operations on
// MasterState and results back into replies.
//
// Promise: every RPC answers (never throws, never hangs on bad input): malformed requests get
// per-key or per-call error codes; a put that finds no space triggers one synchronous eviction
// and one retry of the keys that failed, so a full store keeps taking writes.
// Security (security/principal.h): each call works as its caller's principal. A tenant's keys
// are held in its namespace (master/state/key_namespace.h), so no call of one tenant names,
// lists or removes another's object; its puts past its quota are QUOTA_EXCEEDED (checked and
// applied under the tenant's lock, so concurrent puts cannot pass it together). Calls beyond a
// role are PERMISSION_DENIED as a whole, applying nothing.
// Cache figures (docs/metrics.md): every key BatchGetReplicaList answers (over gRPC or the fast
// port, which calls it too) counts once as a memory hit (memory replicas), a disk hit (disk
// replicas only) or a miss (anything else), overall and per tenant; prefix matches count how
// many leading keys matched; evictions after a failed allocation and demotions by outcome.
// Ownership: borrows the state, the evictor and the metrics registry; they must outlive it.
// Thread safety: gRPC calls it from its thread pool; MasterState is thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <mutex>
#include <unordered_map>
#include <string>

#include "common/metrics.h"
#include "granary/proto/master.grpc.pb.h"
#include "master/policy/evictor.h"
#include "master/policy/offload_planner.h"
#include "master/policy/replica_planner.h"
#include "master/service/serving_gate.h"
#include "master/state/master_state.h"
#include "security/authenticator.h"
#include "security/principal.h"
#include "master/policy/promotion_tracker.h"

namespace granary::master {

// How an answer lets its caller reach a replica's bytes (security/capability.h). Members get
// the segment's token, and a capability for the replica's range (`kind`, until `expiry_unix_ms`)
// where the node requires one; a tenant never gets the token, and a capability whatever the
// node (none in metadata answers, kind kNone). A tenant is given no replica of a segment whose
// node sent no capability key.
struct ReplicaAccess {
  bool tenant = false;
  enum class Kind { kNone, kRead, kWrite } kind = Kind::kNone;
  int64_t expiry_unix_ms = 0;
};

class MasterService final : public proto::Master::Service {
 public:
  MasterService(MasterState* state, Evictor* evictor, MetricsRegistry* metrics,
                OffloadPolicy offload = {}, uint32_t promote_after = 0);

  using Ctx = grpc::ServerContext;
  grpc::Status MountSegment(Ctx*, const proto::MountSegmentRequest*,
                            proto::MountSegmentResponse*) override;
  grpc::Status UnmountSegment(Ctx*, const proto::UnmountSegmentRequest*,
                              proto::UnmountSegmentResponse*) override;
  grpc::Status ReMountSegment(Ctx*, const proto::ReMountSegmentRequest*,
                              proto::ReMountSegmentResponse*) override;
  grpc::Status ListSegments(Ctx*, const proto::ListSegmentsRequest*,
                            proto::ListSegmentsResponse*) override;
  grpc::Status Ping(Ctx*, const proto::PingRequest*, proto::PingResponse*) override;
  grpc::Status BatchPutStart(Ctx*, const proto::BatchPutStartRequest*,
                             proto::BatchPutStartResponse*) override;
  grpc::Status BatchPutEnd(Ctx*, const proto::BatchPutEndRequest*,
                           proto::BatchStatusResponse*) override;
  grpc::Status Reserve(Ctx*, const proto::ReserveRequest*, proto::ReserveResponse*) override;
  grpc::Status BatchPutCommit(Ctx*, const proto::BatchPutCommitRequest*,
                              proto::BatchStatusResponse*) override;
  grpc::Status ReleaseReservations(Ctx*, const proto::ReleaseReservationsRequest*,
                                   proto::BatchStatusResponse*) override;
  grpc::Status BatchPutRevoke(Ctx*, const proto::BatchPutRevokeRequest*,
                              proto::BatchStatusResponse*) override;
  grpc::Status BatchGetReplicaList(Ctx*, const proto::BatchGetReplicaListRequest*,
                                   proto::BatchGetReplicaListResponse*) override;
  grpc::Status BatchFinishRead(Ctx*, const proto::BatchFinishReadRequest*,
                               proto::BatchStatusResponse*) override;
  grpc::Status BatchExist(Ctx*, const proto::BatchExistRequest*,
                          proto::BatchExistResponse*) override;
  grpc::Status BatchGetSize(Ctx*, const proto::BatchGetSizeRequest*,
                            proto::BatchGetSizeResponse*) override;
  grpc::Status BatchPrefixMatch(Ctx*, const proto::BatchPrefixMatchRequest*,
                                proto::BatchPrefixMatchResponse*) override;
  grpc::Status StatObject(Ctx*, const proto::StatObjectRequest*,
                          proto::StatObjectResponse*) override;
  grpc::Status BatchRemove(Ctx*, const proto::BatchRemoveRequest*,
                           proto::BatchStatusResponse*) override;
  grpc::Status RemoveByRegex(Ctx*, const proto::RegexRequest*,
                             proto::RemoveCountResponse*) override;
  grpc::Status QueryByRegex(Ctx*, const proto::RegexRequest*,
                            proto::QueryByRegexResponse*) override;
  grpc::Status RemoveAll(Ctx*, const proto::RemoveAllRequest*,
                         proto::RemoveCountResponse*) override;
  // The disk tiers of the nodes that have mounted segments, summed (for /status).
  proto::DiskStats DiskTotals() const;
  // The SSD tier (master_service_disk.cc).
  grpc::Status DiskRegister(Ctx*, const proto::DiskRegisterRequest*,
                            proto::BatchStatusResponse*) override;
  grpc::Status DiskDrop(Ctx*, const proto::DiskDropRequest*, proto::BatchStatusResponse*) override;
  grpc::Status OffloadStart(Ctx*, const proto::OffloadStartRequest*,
                            proto::OffloadStartResponse*) override;
  grpc::Status OffloadEnd(Ctx*, const proto::OffloadEndRequest*,
                          proto::BatchStatusResponse*) override;
  grpc::Status PromoteEnd(Ctx*, const proto::PromoteEndRequest*,
                          proto::BatchStatusResponse*) override;
  grpc::Status ClusterStatus(Ctx*, const proto::ClusterStatusRequest*,
                             proto::ClusterStatusResponse*) override;
  // Replica counts, re-replication and drains (master_service_replicas.cc).
  grpc::Status Replicate(Ctx*, const proto::ReplicateRequest*,
                         proto::BatchStatusResponse*) override;
  grpc::Status ReplicaCopyStart(Ctx*, const proto::ReplicaCopyStartRequest*,
                                proto::ReplicaCopyStartResponse*) override;
  grpc::Status ReplicaCopyEnd(Ctx*, const proto::ReplicaCopyEndRequest*,
                              proto::BatchStatusResponse*) override;
  grpc::Status Drain(Ctx*, const proto::DrainRequest*, proto::DrainResponse*) override;
  // The leader's housekeeping: unmounts the segments whose drain has nothing left to copy.
  // Returns how many.
  size_t FinishDrains();
  ReplicaPlanner& replica_planner() { return replicas_; }
  // Fills ClusterStatus's answer (HA); unset: a master running alone. Set before serving.
  using ClusterStatusSource = std::function<void(proto::ClusterStatusResponse*)>;
  void set_cluster_status(ClusterStatusSource source) { cluster_status_ = std::move(source); }
  const PromotionTracker& promotions() const { return promotions_; }
  // Advertised in ListSegments so clients find the fast port; 0: none.
  void set_fast_port(uint16_t port) { fast_port_.store(port); }
  // The fast port's local socket name (FastServer::local_name); set before serving, or empty.
  void set_fast_local_socket(std::string name) { fast_local_socket_ = std::move(name); }
  // Told in ClusterStatus, so that tools find /metrics (granary top); 0: unknown.
  void set_http_port(uint16_t port) { http_port_.store(port); }
  // HA: every call passes this gate (serving_gate.h). Null (the default): every call is served.
  // Set before serving.
  void set_gate(ServingGate* gate) { gate_ = gate; }
  // Security: with a secret, a gRPC call is served only if it presents it ("authorization:
  // Bearer <secret>" metadata). A call without a ServerContext comes from the fast port, whose
  // FastServer checked its connection's hello before any call. Null (the default), or an
  // authenticator without a secret: every call is served. Set before serving.
  void set_authenticator(const security::Authenticator* auth);
  // The fast port's caller, for the handler calls this thread makes while it lives (the
  // connection's hello named it). Without one, a fast-port call is refused where a secret is
  // required.
  class FastCaller {
   public:
    explicit FastCaller(const security::Principal* who);
    ~FastCaller();
    FastCaller(const FastCaller&) = delete;
    FastCaller& operator=(const FastCaller&) = delete;

   private:
    const security::Principal* previous_;
  };

 private:
  struct RpcMetrics {
    Counter* calls = nullptr;
    Counter* keys = nullptr;
    Counter* key_errors = nullptr;
    Histogram* seconds = nullptr;
  };
  // Counts a call and times it until destroyed.
  class CallScope {
   public:
    CallScope(RpcMetrics& m, size_t keys);
    ~CallScope();
    void KeyErrors(size_t n) { errors_ += n; }

   private:
    RpcMetrics& m_;
    size_t errors_ = 0;
    std::chrono::steady_clock::time_point start_;
  };
  RpcMetrics& Metrics(const char* method);
  using Principal = security::Principal;
  // The caller's principal into *who (never null on success).
  Status Authenticate(Ctx* ctx, const Principal** who) const;
  // Per tenant: its namespace's prefix, the lock its quota checks hold, its refusals.
  // The outcome label of granary_master_gets_total: memory_hit, disk_hit, miss.
  static constexpr size_t kGetOutcomes = 3;
  struct TenantRuntime {
    std::string prefix;
    std::mutex quota_mu;
    Counter* quota_refusals = nullptr;
    std::array<Counter*, kGetOutcomes> gets{};  // granary_master_tenant_gets_total
  };
  TenantRuntime* TenantOf(const Principal* who) const;
  const std::string& PrefixOf(const Principal* who) const;
  // Keys as held for the caller (key_namespace.h).
  template <typename Repeated>
  std::vector<std::string> HeldKeys(const Repeated& keys, const Principal* who) const;
  // A tenant's client ids live in its namespace too, so it cannot ping, reserve or release as
  // a node or another tenant's client. "" stays "" (refused as such by the state).
  std::string HeldClient(const std::string& id, const Principal* who) const;
  // A commit's or remove's answer: how long its writer waits for other clients' cache leases
  // on the keys that succeeded (MasterState::SettleMs); for a remove, also on keys not found,
  // which a client may still cache from an earlier master (AssumeEarlierCacheLeases). Asks
  // nothing when no lease is live.
  template <typename Repeated>
  void SetSettle(const std::string& client_id, const Repeated& keys, const Principal* who,
                 const std::vector<Status>& statuses, proto::BatchStatusResponse* resp,
                 bool not_found_too = false) const {
    if (state_->SettleAllMs() == 0) return;
    std::vector<std::string> held = HeldKeys(keys, who);
    std::vector<std::string> done;
    for (size_t i = 0; i < held.size() && i < statuses.size(); ++i) {
      if (statuses[i].ok() ||
          (not_found_too && statuses[i].code() == ErrorCode::OBJECT_NOT_FOUND)) {
        done.push_back(std::move(held[i]));
      }
    }
    if (done.empty()) return;
    resp->set_settle_ms(
        static_cast<uint64_t>(state_->SettleMs(HeldClient(client_id, who), done)));
  }
  // Of sizes[i] in order, which fit the tenant's quota beside what it holds (*admitted[i]);
  // the others are QUOTA_EXCEEDED in *refused[i]. No quota: all. Caller holds quota_mu.
  void FitQuota(const Principal* who, TenantRuntime* t, std::span<const uint64_t> sizes,
                std::vector<bool>* admitted, std::vector<Status>* refused) const;
  static grpc::Status Deny(const Principal* who, const char* call);
  // How a call meets the gate: a query reads the state, a soft call changes only what a failover
  // may lose (liveness, read-lock releases), an update's reply waits for its replication.
  enum class CallKind { kQuery, kSoft, kUpdate };
  // One call's passage through the gate: Enter()ed at construction, Exit()ed at destruction;
  // Finish() commits what the call applied (updates) and stamps the term on the reply.
  class Admission {
   public:
    // authenticated: the caller's check (Authenticate); a refusal there enters nothing.
    template <typename Resp>
    Admission(ServingGate* gate, CallKind kind, Resp* resp, Status authenticated)
        : gate_(authenticated.ok() ? gate : nullptr), kind_(kind), reply_(resp),
          set_term_([](google::protobuf::Message* m, uint64_t term) {
            if constexpr (requires { static_cast<Resp*>(m)->set_term(term); }) {
              static_cast<Resp*>(m)->set_term(term);
            }
          }),
          entry_(std::move(authenticated)) {
      if (gate_) {
        entry_ = gate_->Enter(kind == CallKind::kUpdate);
        // The term the call was admitted under: a reply that outlives a step-down still names the
        // term that served it (never 0, which clients take from a master running alone).
        term_ = gate_->term();
        applied_before_ = MasterState::AppliedOnThisThread();
      }
    }
    ~Admission() {
      if (gate_ && entry_.ok()) gate_->Exit();
    }
    Admission(const Admission&) = delete;
    Admission& operator=(const Admission&) = delete;
    bool ok() const { return entry_.ok(); }
    grpc::Status refusal() const;  // the Enter() error, for the caller to return
    grpc::Status Finish();

   private:
    ServingGate* gate_;
    CallKind kind_;
    google::protobuf::Message* reply_;
    void (*set_term_)(google::protobuf::Message*, uint64_t);
    Status entry_;
    uint64_t term_ = 0;
    uint64_t applied_before_ = 0;  // operations this thread had applied before the call
  };
  // What `who` gets for replicas it may `kind` (kRead, kWrite, kNone) for `ttl_ms` from now.
  // Called before the state grants them, so a capability ends no later than the lock, lease or
  // put that guards the bytes.
  static ReplicaAccess AccessFor(const Principal* who, ReplicaAccess::Kind kind, int64_t ttl_ms);
  void FillReplicas(const std::vector<Extent>& extents,
                    google::protobuf::RepeatedPtrField<proto::Replica>* out,
                    const ReplicaAccess& access = ReplicaAccess()) const;
  // held: the key as the state holds it, named in each replica when it is not what the caller
  // named (a tenant's).
  void FillDiskReplicas(const std::vector<DiskReplica>& disk,
                        google::protobuf::RepeatedPtrField<proto::DiskReplica>* out,
                        std::string_view held = {}, std::string_view named = {}) const;

  MasterState* state_;
  Evictor* evictor_;
  MetricsRegistry* registry_;
  OffloadPlanner planner_;
  PromotionTracker promotions_;
  ReplicaPlanner replicas_;
  // Fills the answer's promotions: the node's earlier rounds end, due keys start (a logged
  // PromoteStart, only when there is something to end or start).
  void StartPromotions(const proto::OffloadStartRequest& req, const std::vector<uint64_t>& own,
                       proto::OffloadStartResponse* resp);
  // Each node's disk tier as its last ping reported it: soft state, not in the history.
  mutable std::mutex disks_mu_;
  std::unordered_map<std::string, proto::DiskStats> disks_;
  std::atomic<uint16_t> fast_port_{0};
  std::string fast_local_socket_;  // set before serving; advertised while fast_port_ is
  std::atomic<uint16_t> http_port_{0};
  ServingGate* gate_ = nullptr;
  const security::Authenticator* auth_ = nullptr;
  // Built by set_authenticator, read-only after (the TenantRuntimes' locks aside).
  std::unordered_map<const Principal*, std::unique_ptr<TenantRuntime>> tenants_;
  ClusterStatusSource cluster_status_;
  // Filled in the constructor, read-only after; std::less<> finds a method name without
  // building a std::string on every call.
  std::map<std::string, RpcMetrics, std::less<>> rpc_metrics_;
  // Cache figures; registered in the constructor, updated with relaxed atomics.
  std::array<Counter*, kGetOutcomes> gets_{};
  Counter* memory_hit_bytes_ = nullptr;
  Counter* disk_hit_bytes_ = nullptr;
  // Keys whose put BatchPutStart started or BatchPutCommit committed, and their object bytes.
  Counter* puts_ = nullptr;
  Counter* put_bytes_ = nullptr;
  void CountPuts(const std::vector<Status>& statuses, const std::vector<uint64_t>& sizes);
  Histogram* prefix_match_keys_ = nullptr;
  Counter* allocation_evictions_ = nullptr;
  Counter* demotions_started_ = nullptr;
  Counter* demotions_completed_ = nullptr;
  Counter* demotions_failed_ = nullptr;   // the node wrote it, the master refused its end
  Counter* demotions_aborted_ = nullptr;  // not written, or the source was gone
  void RegisterCacheMetrics();
};

}  // namespace granary::master
