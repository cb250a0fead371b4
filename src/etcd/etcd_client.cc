// The unary half of the client (KV and Lease calls) and Connect; watches live in watch.cc,
// keepalives in keep_alive.cc.
#include "etcd/etcd_client.h"

#include <algorithm>

#include "etcd/endpoints.h"
#include "etcd/etcd_internal.h"
#include "etcd/keep_alive.h"
#include "etcd/watch.h"

namespace granary::etcd {

// ---- shared helpers (etcd_internal.h) ----

std::shared_ptr<grpc::Channel> MakeEtcdChannel(const std::string& target, int timeout_ms,
                                               std::shared_ptr<EtcdAuth> auth) {
  grpc::ChannelArguments args;
  args.SetLoadBalancingPolicyName("pick_first");
  // Its own connections: a second client in the process (a test's, a tool's) neither shares nor
  // breaks this one's.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(256 << 20);
  // Reconnect within a fraction of a second after a member restarts or the channel moves to
  // another member, instead of gRPC's default backoff of up to 2 min.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  // Also the connect timeout (default 20 s): pick_first tries members one after the other, so a
  // member that accepts TCP but never answers (stopped, partitioned) must not hold up the next.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::max(timeout_ms, 1000));
  // Pings find a connection that died silently (a partition) under a long-lived watch; etcd
  // refuses pings more often than every 5 s (--grpc-keepalive-min-time) or without a call open.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, std::max(timeout_ms, 1000));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  const auto insecure = grpc::InsecureChannelCredentials();
  if (auth == nullptr) return grpc::CreateCustomChannel(target, insecure, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> creators;
  creators.push_back(EtcdAuth::Interceptor(auth));
  auto channel = grpc::experimental::CreateCustomChannelWithInterceptors(target, insecure, args,
                                                                         std::move(creators));
  auth->Attach(channel);
  return channel;
}

Status StreamTimeout(const std::string& what, grpc::Channel& channel, int timeout_ms) {
  if (channel.GetState(false) != GRPC_CHANNEL_READY) {
    return Status(ErrorCode::ETCD_OPERATION_ERROR,
                  what + ": no etcd member reachable within " + std::to_string(timeout_ms) + " ms");
  }
  return Status(ErrorCode::RPC_TIMEOUT,
                what + ": etcd did not answer within " + std::to_string(timeout_ms) + " ms");
}

Status FromGrpc(const grpc::Status& status, const std::string& what, grpc::Channel& channel,
                int timeout_ms) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
      return Status::Ok();
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return StreamTimeout(what, channel, timeout_ms);
    case grpc::StatusCode::NOT_FOUND:
      return Status(ErrorCode::OBJECT_NOT_FOUND, what + ": " + status.error_message());
    default:
      return Status(ErrorCode::ETCD_OPERATION_ERROR, what + ": " + status.error_message());
  }
}

KeyValue FromProto(const ::mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

// ---- the client ----

namespace {

Status InvalidKey(const std::string& what) {
  return Status(ErrorCode::INVALID_PARAMS, what + ": empty key");
}

pb::Compare ToProto(const Compare& c) {
  pb::Compare out;
  out.set_key(c.key);
  switch (c.result) {
    case Compare::Result::kEqual:
      out.set_result(pb::Compare::EQUAL);
      break;
    case Compare::Result::kNotEqual:
      out.set_result(pb::Compare::NOT_EQUAL);
      break;
    case Compare::Result::kGreater:
      out.set_result(pb::Compare::GREATER);
      break;
    case Compare::Result::kLess:
      out.set_result(pb::Compare::LESS);
      break;
  }
  switch (c.target) {
    case Compare::Target::kCreateRevision:
      out.set_target(pb::Compare::CREATE);
      out.set_create_revision(c.number);
      break;
    case Compare::Target::kModRevision:
      out.set_target(pb::Compare::MOD);
      out.set_mod_revision(c.number);
      break;
    case Compare::Target::kVersion:
      out.set_target(pb::Compare::VERSION);
      out.set_version(c.number);
      break;
    case Compare::Target::kValue:
      out.set_target(pb::Compare::VALUE);
      out.set_value(c.value);
      break;
    case Compare::Target::kLease:
      out.set_target(pb::Compare::LEASE);
      out.set_lease(c.number);
      break;
  }
  return out;
}

pb::RequestOp ToProto(const TxnOp& op) {
  pb::RequestOp out;
  switch (op.kind) {
    case TxnOp::Kind::kPut: {
      pb::PutRequest* put = out.mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case TxnOp::Kind::kDelete:
      out.mutable_request_delete_range()->set_key(op.key);
      break;
    case TxnOp::Kind::kGet:
      out.mutable_request_range()->set_key(op.key);
      break;
  }
  return out;
}

class EtcdClientImpl final : public EtcdClient {
 public:
  EtcdClientImpl(std::string endpoints, std::shared_ptr<grpc::Channel> channel, int timeout_ms,
                 std::shared_ptr<EtcdAuth> auth)
      : EtcdClient(std::move(endpoints)),
        auth_(std::move(auth)),
        channel_(std::move(channel)),
        kv_(pb::KV::NewStub(channel_)),
        lease_(pb::Lease::NewStub(channel_)),
        timeout_ms_(timeout_ms) {}

  Result<std::optional<KeyValue>> Get(const std::string& key, int64_t* revision) override {
    if (key.empty()) return InvalidKey("etcd Get");
    pb::RangeRequest req;
    req.set_key(key);
    pb::RangeResponse resp;
    Status s =
        Call("etcd Get", [&](grpc::ClientContext* ctx) { return kv_->Range(ctx, req, &resp); });
    if (!s.ok()) return s;
    if (revision != nullptr) *revision = resp.header().revision();
    if (resp.kvs_size() == 0) return std::optional<KeyValue>();
    return std::optional<KeyValue>(FromProto(resp.kvs(0)));
  }

  Result<std::vector<KeyValue>> GetPrefix(const std::string& prefix, int64_t* revision) override {
    pb::RangeRequest req;
    // etcd's "every key": key and range_end both "\0".
    req.set_key(prefix.empty() ? std::string(1, '\0') : prefix);
    req.set_range_end(PrefixRangeEnd(prefix));
    pb::RangeResponse resp;
    Status s = Call("etcd GetPrefix",
                    [&](grpc::ClientContext* ctx) { return kv_->Range(ctx, req, &resp); });
    if (!s.ok()) return s;
    if (revision != nullptr) *revision = resp.header().revision();
    std::vector<KeyValue> out;
    out.reserve(resp.kvs_size());
    for (const auto& kv : resp.kvs()) out.push_back(FromProto(kv));
    return out;
  }

  Result<int64_t> Put(const std::string& key, const std::string& value, int64_t lease) override {
    if (key.empty()) return InvalidKey("etcd Put");
    pb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    req.set_lease(lease);
    pb::PutResponse resp;
    Status s =
        Call("etcd Put", [&](grpc::ClientContext* ctx) { return kv_->Put(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp.header().revision();
  }

  Result<int64_t> Delete(const std::string& key) override {
    if (key.empty()) return InvalidKey("etcd Delete");
    pb::DeleteRangeRequest req;
    req.set_key(key);
    pb::DeleteRangeResponse resp;
    Status s = Call("etcd Delete",
                    [&](grpc::ClientContext* ctx) { return kv_->DeleteRange(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp.deleted();
  }

  Result<TxnResult> Txn(const std::vector<Compare>& compares, const std::vector<TxnOp>& success,
                        const std::vector<TxnOp>& failure) override {
    pb::TxnRequest req;
    for (const Compare& c : compares) {
      if (c.key.empty()) return InvalidKey("etcd Txn compare");
      *req.add_compare() = ToProto(c);
    }
    for (const TxnOp& op : success) {
      if (op.key.empty()) return InvalidKey("etcd Txn");
      *req.add_success() = ToProto(op);
    }
    for (const TxnOp& op : failure) {
      if (op.key.empty()) return InvalidKey("etcd Txn");
      *req.add_failure() = ToProto(op);
    }
    pb::TxnResponse resp;
    Status s =
        Call("etcd Txn", [&](grpc::ClientContext* ctx) { return kv_->Txn(ctx, req, &resp); });
    if (!s.ok()) return s;
    TxnResult out;
    out.succeeded = resp.succeeded();
    out.revision = resp.header().revision();
    // etcd answers one response per operation of the branch that ran, in order.
    const std::vector<TxnOp>& ran = out.succeeded ? success : failure;
    for (size_t i = 0; i < ran.size() && i < static_cast<size_t>(resp.responses_size()); ++i) {
      if (ran[i].kind != TxnOp::Kind::kGet) continue;
      const pb::RangeResponse& range = resp.responses(static_cast<int>(i)).response_range();
      out.gets.push_back(range.kvs_size() == 0 ? std::nullopt
                                               : std::optional<KeyValue>(FromProto(range.kvs(0))));
    }
    return out;
  }

  Result<Lease> GrantLease(int64_t ttl_seconds) override {
    if (ttl_seconds <= 0) {
      return Status(ErrorCode::INVALID_PARAMS,
                    "etcd GrantLease: TTL must be positive, not " + std::to_string(ttl_seconds));
    }
    pb::LeaseGrantRequest req;
    req.set_ttl(ttl_seconds);
    pb::LeaseGrantResponse resp;
    Status s = Call("etcd GrantLease",
                    [&](grpc::ClientContext* ctx) { return lease_->LeaseGrant(ctx, req, &resp); });
    if (!s.ok()) return s;
    if (!resp.error().empty()) {
      return Status(ErrorCode::ETCD_OPERATION_ERROR, "etcd GrantLease: " + resp.error());
    }
    return Lease{resp.id(), resp.ttl()};
  }

  Status RevokeLease(int64_t id) override {
    if (id <= 0) return BadLease("etcd RevokeLease", id);
    pb::LeaseRevokeRequest req;
    req.set_id(id);
    pb::LeaseRevokeResponse resp;
    return Call("etcd RevokeLease",
                [&](grpc::ClientContext* ctx) { return lease_->LeaseRevoke(ctx, req, &resp); });
  }

  Result<int64_t> LeaseTimeToLive(int64_t id) override {
    if (id <= 0) return BadLease("etcd LeaseTimeToLive", id);
    pb::LeaseTimeToLiveRequest req;
    req.set_id(id);
    pb::LeaseTimeToLiveResponse resp;
    Status s = Call("etcd LeaseTimeToLive", [&](grpc::ClientContext* ctx) {
      return lease_->LeaseTimeToLive(ctx, req, &resp);
    });
    if (!s.ok()) return s;
    // etcd answers TTL -1, not an error, for a lease it does not know.
    if (resp.ttl() == -1) {
      return Status(ErrorCode::OBJECT_NOT_FOUND,
                    "etcd LeaseTimeToLive: lease " + std::to_string(id) + " not found");
    }
    return resp.ttl();
  }

  Result<std::unique_ptr<KeepAlive>> StartKeepAlive(int64_t id) override {
    if (id <= 0) return BadLease("etcd StartKeepAlive", id);
    return std::unique_ptr<KeepAlive>(std::make_unique<KeepAliveImpl>(channel_, id, timeout_ms_, auth_));
  }

  Result<std::unique_ptr<Watch>> StartWatch(const std::string& key, bool prefix,
                                            int64_t start_revision, WatchCallback on_events,
                                            std::function<void(Status)> on_error) override {
    if (key.empty() && !prefix) return InvalidKey("etcd StartWatch");
    if (start_revision < 0 || !on_events || !on_error) {
      return Status(ErrorCode::INVALID_PARAMS,
                    "etcd StartWatch: needs start_revision >= 0 and both callbacks");
    }
    WatchSpec spec;
    spec.key = prefix && key.empty() ? std::string(1, '\0') : key;
    spec.range_end = prefix ? PrefixRangeEnd(key) : "";
    spec.start_revision = start_revision;
    return StartWatchStream(channel_, auth_, std::move(spec), timeout_ms_, std::move(on_events),
                            std::move(on_error));
  }

 private:
  static Status BadLease(const std::string& what, int64_t id) {
    return Status(ErrorCode::INVALID_PARAMS, what + ": bad lease id " + std::to_string(id));
  }

  // One unary call with the client's deadline. wait_for_ready: while the channel moves to another
  // member (or a restarted one comes back) the call waits for it, up to the deadline, instead of
  // failing at once. A call that reached a member and then lost it still fails (UNAVAILABLE), so
  // nothing is sent twice.
  template <typename Fn>
  Status Call(const std::string& what, Fn&& fn) {
    const GrpcTime deadline = DeadlineIn(timeout_ms_);
    // Twice at most: a call refused for its token was not applied (etcd checks it first).
    for (int attempt = 0;; ++attempt) {
      if (auth_ != nullptr) {
        if (Status s = auth_->EnsureToken(deadline); !s.ok()) {
          return Status(s.code(), what + ": " + s.message());
        }
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline);
      ctx.set_wait_for_ready(true);
      const grpc::Status status = fn(&ctx);
      if (auth_ != nullptr && attempt == 0 && EtcdAuth::Refused(status)) continue;
      return FromGrpc(status, what, *channel_, timeout_ms_);
    }
  }

  std::shared_ptr<EtcdAuth> auth_;  // null: no user
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::KV::Stub> kv_;
  std::unique_ptr<pb::Lease::Stub> lease_;
  const int timeout_ms_;
};

}  // namespace

Result<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const std::string& endpoints,
                                                        int timeout_ms,
                                                        const EtcdCredentials& credentials) {
  if (timeout_ms <= 0) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "etcd timeout must be positive, not " + std::to_string(timeout_ms));
  }
  auto parsed = ParseEndpoints(endpoints);
  if (!parsed.ok()) return parsed.status();
  auto target = ResolveTarget(*parsed);
  if (!target.ok()) return target.status();
  std::shared_ptr<EtcdAuth> auth;
  if (!credentials.user.empty()) {
    auth = std::make_shared<EtcdAuth>(credentials.user, credentials.password);
  }
  auto channel = MakeEtcdChannel(*target, timeout_ms, auth);
  return std::unique_ptr<EtcdClient>(std::make_unique<EtcdClientImpl>(
      JoinEndpoints(*parsed), std::move(channel), timeout_ms, std::move(auth)));
}

}  // namespace granary::etcd
