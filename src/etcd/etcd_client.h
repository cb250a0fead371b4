// etcd/etcd_client.h - the part of etcd's v3 API that Granary speaks (KV Range/Put/DeleteRange/
// Txn, Lease Grant/KeepAlive/Revoke/TimeToLive, Watch), over gRPC to a real etcd server.
//
// Promise: every call is bounded by the client's timeout and answers a Status, never throws;
// ErrorCode::ETCD_OPERATION_ERROR carries etcd's own message (or "no etcd member reachable" when
// the deadline passed without a connection to any member), RPC_TIMEOUT a deadline that passed
// while connected, OBJECT_NOT_FOUND a lease etcd does not know, INVALID_PARAMS a bad argument
// (checked before any call). A call that reached a member is never sent twice. Endpoints are
// "HOST:PORT[;HOST:PORT...]" (',' also separates; an optional "etcd://" or "http://" prefix is
// accepted and ignored); the client resolves each host once at Connect and keeps one gRPC channel
// over all of them, so a call fails over to another member when one dies (a call made while the
// channel moves waits for it, up to the deadline).
// Ownership: owns its channel and its watch threads; a Watch or KeepAlive object must be
// destroyed before the client.
// Thread safety: every method of EtcdClient from any thread. A Watch's callback runs on the
// watch's own thread, one call at a time; a KeepAlive's methods from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "granary/status.h"

namespace granary::etcd {

// How a client proves itself to etcd (docs/security.md, "etcd"): etcd's user and password, for
// an etcd with `auth enable`. Empty: none.
struct EtcdCredentials {
  std::string user;
  std::string password;
};

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// One comparison of a transaction's guard. A missing key has create_revision, mod_revision and
// version 0 and an empty value (etcd's own rule).
struct Compare {
  enum class Target { kCreateRevision, kModRevision, kVersion, kValue, kLease };
  enum class Result { kEqual, kNotEqual, kGreater, kLess };
  std::string key;
  Target target = Target::kCreateRevision;
  Result result = Result::kEqual;
  int64_t number = 0;  // for every target but kValue
  std::string value;   // for kValue

  static Compare CreateRevision(std::string key, Result r, int64_t n) {
    return {std::move(key), Target::kCreateRevision, r, n, {}};
  }
  static Compare ModRevision(std::string key, Result r, int64_t n) {
    return {std::move(key), Target::kModRevision, r, n, {}};
  }
  static Compare Value(std::string key, Result r, std::string v) {
    return {std::move(key), Target::kValue, r, 0, std::move(v)};
  }
};

// One operation of a transaction's branch.
struct TxnOp {
  enum class Kind { kPut, kDelete, kGet };
  Kind kind = Kind::kGet;
  std::string key;
  std::string value;  // kPut
  int64_t lease = 0;  // kPut: 0 for none

  static TxnOp Put(std::string key, std::string value, int64_t lease = 0) {
    return {Kind::kPut, std::move(key), std::move(value), lease};
  }
  static TxnOp Delete(std::string key) { return {Kind::kDelete, std::move(key), {}, 0}; }
  static TxnOp Get(std::string key) { return {Kind::kGet, std::move(key), {}, 0}; }
};

struct TxnResult {
  bool succeeded = false;  // the guard held: the success branch ran
  int64_t revision = 0;    // the store's revision after the transaction
  // One entry per kGet of the branch that ran, in order (empty: the key is absent).
  std::vector<std::optional<KeyValue>> gets;
};

struct Lease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;  // as granted: etcd may raise a TTL below its minimum
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for a delete: the key and mod_revision of the deletion
};

// A watch on one key or a prefix, from a revision on. The callback gets each batch of events in
// revision order; `on_error` once if the watch breaks for good (its stream failed and could not
// be resumed within the client's timeout, or etcd compacted past the next revision wanted): the
// caller then re-reads the key and watches again. A stream that fails (a member died, etcd
// restarted) is re-created from the revision after the last one delivered, so no event is lost
// or repeated. A connection that dies without an error (a partition) is found by gRPC keepalive
// pings within about 10 s plus the timeout; a member that lost its cluster's leader ends the
// watch after a few election timeouts. A Watch may be destroyed from its own callbacks.
class Watch {
 public:
  virtual ~Watch() = default;  // cancels the watch and joins its thread
};

// Keeps a lease alive over one KeepAlive stream: Renew() sends one keepalive and waits for its
// answer. A lease that etcd no longer knows (expired or revoked) answers OBJECT_NOT_FOUND. Nothing
// is sent before the first Renew(); the caller decides how often (e.g. every TTL/3).
class KeepAlive {
 public:
  virtual ~KeepAlive() = default;
  // The TTL etcd reset the lease to, counted from some moment after this call began (so the
  // lease lives at least until the call's start + the returned seconds, by the caller's clock).
  virtual Result<int64_t> Renew() = 0;
};

class EtcdClient {
 public:
  // Parses the endpoints, resolves their hosts and opens the channel. INVALID_PARAMS for an empty
  // or malformed list (or timeout_ms <= 0); ETCD_OPERATION_ERROR when no host resolves. No call
  // is made to etcd yet (an unreachable etcd fails the first call, not Connect).
  // With a user, the first call authenticates (etcd/etcd_auth.h), and a call etcd refuses for
  // its token (not applied) authenticates again and is sent once more.
  static Result<std::unique_ptr<EtcdClient>> Connect(const std::string& endpoints,
                                                     int timeout_ms = 2000,
                                                     const EtcdCredentials& credentials = {});
  virtual ~EtcdClient() = default;

  // The key, or nullopt when absent. *revision (if given): the store's revision of the answer.
  virtual Result<std::optional<KeyValue>> Get(const std::string& key,
                                              int64_t* revision = nullptr) = 0;
  // Every key starting with prefix, in key order.
  virtual Result<std::vector<KeyValue>> GetPrefix(const std::string& prefix,
                                                  int64_t* revision = nullptr) = 0;
  // The store's revision after the put.
  virtual Result<int64_t> Put(const std::string& key, const std::string& value,
                              int64_t lease = 0) = 0;
  // How many keys were deleted.
  virtual Result<int64_t> Delete(const std::string& key) = 0;
  virtual Result<TxnResult> Txn(const std::vector<Compare>& compares,
                                const std::vector<TxnOp>& success,
                                const std::vector<TxnOp>& failure = {}) = 0;

  virtual Result<Lease> GrantLease(int64_t ttl_seconds) = 0;
  virtual Status RevokeLease(int64_t id) = 0;
  // Seconds left (<= 0 or OBJECT_NOT_FOUND: expired or unknown).
  virtual Result<int64_t> LeaseTimeToLive(int64_t id) = 0;
  virtual Result<std::unique_ptr<KeepAlive>> StartKeepAlive(int64_t id) = 0;

  using WatchCallback = std::function<void(const std::vector<WatchEvent>&)>;
  // Watches `key` (or every key under it when prefix) from start_revision (0: from now).
  // Returns once etcd has created the watch, so every later change is seen.
  virtual Result<std::unique_ptr<Watch>> StartWatch(const std::string& key, bool prefix,
                                                    int64_t start_revision, WatchCallback on_events,
                                                    std::function<void(Status)> on_error) = 0;

  const std::string& endpoints() const { return endpoints_; }

 protected:
  explicit EtcdClient(std::string endpoints) : endpoints_(std::move(endpoints)) {}

 private:
  std::string endpoints_;
};

// "etcd://h1:p1;h2:p2" -> "h1:p1;h2:p2"; anything else -> nullopt. The address form every place
// that takes a master address accepts (Mooncake's).
std::optional<std::string> EtcdEndpointsOf(const std::string& address);

}  // namespace granary::etcd
