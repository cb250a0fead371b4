// The etcd client (src/etcd) against the real etcd server: KV, transactions, leases, watches,
// failover in a 3-member cluster, an unreachable etcd, and a partition made by TcpProxy.
#include "etcd/etcd_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>

#include "etcd_harness.h"

namespace granary::it {
namespace {

using etcd::Compare;
using etcd::EtcdClient;
using etcd::TxnOp;
using etcd::WatchEvent;
using Clock = std::chrono::steady_clock;

Millis Since(Clock::time_point start) {
  return std::chrono::duration_cast<Millis>(Clock::now() - start);
}

std::unique_ptr<EtcdClient> MustConnect(const std::string& endpoints, int timeout_ms = 2000) {
  auto client = EtcdClient::Connect(endpoints, timeout_ms);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(client).value() : nullptr;
}

// Collects what a watch delivers, for a test thread to wait on.
class WatchLog {
 public:
  EtcdClient::WatchCallback Events() {
    return [this](const std::vector<WatchEvent>& batch) {
      std::lock_guard lock(mu_);
      events_.insert(events_.end(), batch.begin(), batch.end());
      cv_.notify_all();
    };
  }
  std::function<void(Status)> Errors() {
    return [this](Status s) {
      std::lock_guard lock(mu_);
      errors_.push_back(std::move(s));
      cv_.notify_all();
    };
  }
  bool WaitEvents(size_t n, Millis timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return events_.size() >= n; });
  }
  bool WaitError(Millis timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return !errors_.empty(); });
  }
  std::vector<WatchEvent> events() {
    std::lock_guard lock(mu_);
    return events_;
  }
  std::vector<Status> errors() {
    std::lock_guard lock(mu_);
    return errors_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<WatchEvent> events_;
  std::vector<Status> errors_;
};

void ExpectEvent(const WatchEvent& e, WatchEvent::Type type, const std::string& key,
                 const std::string& value) {
  EXPECT_EQ(e.type, type) << key;
  EXPECT_EQ(e.kv.key, key);
  if (type == WatchEvent::Type::kPut) {
    EXPECT_EQ(e.kv.value, value) << key;
  }
}

// The key's value; "<absent>" or "<error: ...>" otherwise, for one-line expectations.
std::string ValueOf(EtcdClient& client, const std::string& key) {
  auto got = client.Get(key);
  if (!got.ok()) return "<error: " + got.status().ToString() + ">";
  return got->has_value() ? (*got)->value : "<absent>";
}

// ---- endpoint strings (no server) ----

TEST(EtcdEndpointsTest, MalformedListsAreInvalidParams) {
  for (const std::string bad : {"",
                                " ",
                                ";",
                                ",;",
                                "host",
                                "host:",
                                ":2379",
                                "host:0",
                                "host:65536",
                                "host:12a",
                                "host:-1",
                                "host:+1",
                                "https://127.0.0.1:2379",
                                "ftp://127.0.0.1:2379",
                                "::1:2379",
                                "[::1:2379",
                                "[::1]2379",
                                "[nothost]:2379",
                                "a b:1",
                                "127.0.0.1:2379;bad",
                                "etcd://"}) {
    auto client = EtcdClient::Connect(bad, 500);
    EXPECT_FALSE(client.ok()) << "'" << bad << "'";
    EXPECT_EQ(client.code(), ErrorCode::INVALID_PARAMS) << "'" << bad << "'";
  }
  EXPECT_EQ(EtcdClient::Connect("127.0.0.1:2379", 0).code(), ErrorCode::INVALID_PARAMS);
}

TEST(EtcdEndpointsTest, AcceptedFormsAreNormalized) {
  struct Case {
    std::string in, out;
  };
  for (const Case& c : std::vector<Case>{
           {"127.0.0.1:2379", "127.0.0.1:2379"},
           {"etcd://127.0.0.1:1;127.0.0.1:2", "127.0.0.1:1;127.0.0.1:2"},
           {"http://127.0.0.1:1/, http://localhost:2", "127.0.0.1:1;localhost:2"},
           {"etcd://127.0.0.1:1;etcd://127.0.0.1:2;", "127.0.0.1:1;127.0.0.1:2"},
           {"[::1]:2379", "[::1]:2379"},
       }) {
    auto client = EtcdClient::Connect(c.in, 500);
    ASSERT_TRUE(client.ok()) << c.in << ": " << client.status().ToString();
    EXPECT_EQ((*client)->endpoints(), c.out);
  }
}

TEST(EtcdEndpointsTest, EtcdEndpointsOfTakesOnlyTheEtcdScheme) {
  EXPECT_EQ(etcd::EtcdEndpointsOf("etcd://h1:1;h2:2"), std::optional<std::string>("h1:1;h2:2"));
  EXPECT_EQ(etcd::EtcdEndpointsOf("etcd://h1:1"), std::optional<std::string>("h1:1"));
  EXPECT_EQ(etcd::EtcdEndpointsOf("h1:1"), std::nullopt);
  EXPECT_EQ(etcd::EtcdEndpointsOf("http://h1:1"), std::nullopt);
  EXPECT_EQ(etcd::EtcdEndpointsOf("127.0.0.1:50051"), std::nullopt);
  EXPECT_EQ(etcd::EtcdEndpointsOf(""), std::nullopt);
}

// Nothing listens on the port: every call fails within its timeout, none hangs.
TEST(EtcdEndpointsTest, UnreachableEtcdFailsWithinTimeout) {
  constexpr int kTimeoutMs = 500;
  auto client = MustConnect("127.0.0.1:" + std::to_string(PickFreePort()), kTimeoutMs);
  ASSERT_NE(client, nullptr);
  auto bounded = [&](const char* what, auto&& call) {
    const auto start = Clock::now();
    const Status s = call();
    const Millis took = Since(start);
    EXPECT_EQ(s.code(), ErrorCode::ETCD_OPERATION_ERROR) << what << ": " << s.ToString();
    EXPECT_LT(took.count(), 2 * kTimeoutMs) << what;
  };
  bounded("Get", [&] { return client->Get("k").status(); });
  bounded("Put", [&] { return client->Put("k", "v").status(); });
  bounded("Txn", [&] { return client->Txn({}, {TxnOp::Put("k", "v")}).status(); });
  bounded("GrantLease", [&] { return client->GrantLease(5).status(); });
  bounded("StartWatch", [&] {
    return client
        ->StartWatch(
            "k", false, 0, [](const auto&) {}, [](Status) {})
        .status();
  });
  auto keepalive = client->StartKeepAlive(12345);  // sends nothing yet
  ASSERT_TRUE(keepalive.ok());
  bounded("Renew", [&] { return (*keepalive)->Renew().status(); });
}

// ---- one shared member with short raft timing (1 s leases) ----

class EtcdClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new EtcdServer(EtcdOptions{"etcd0", 50, 500});
    started_ = server_->Start();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(started_) << started_.message();
    client_ = MustConnect(server_->endpoint());
    ASSERT_NE(client_, nullptr);
    // Keys of one test never meet another's.
    prefix_ =
        std::string("/") + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/";
  }
  void TearDown() override {
    if (HasFailure() && server_ != nullptr) std::cerr << server_->Log();
  }
  std::string Key(const std::string& name) const { return prefix_ + name; }

  static inline EtcdServer* server_ = nullptr;
  static inline ::testing::AssertionResult started_ = ::testing::AssertionFailure();
  std::unique_ptr<EtcdClient> client_;
  std::string prefix_;
};

TEST_F(EtcdClientTest, PutGetDeleteRoundTrip) {
  auto rev = client_->Put(Key("a"), "one");
  ASSERT_TRUE(rev.ok()) << rev.status().ToString();
  int64_t read_rev = 0;
  auto got = client_->Get(Key("a"), &read_rev);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->key, Key("a"));
  EXPECT_EQ((*got)->value, "one");
  EXPECT_EQ((*got)->create_revision, *rev);
  EXPECT_EQ((*got)->mod_revision, *rev);
  EXPECT_EQ((*got)->version, 1);
  EXPECT_EQ((*got)->lease, 0);
  EXPECT_GE(read_rev, *rev);

  auto rev2 = client_->Put(Key("a"), std::string("two\0bytes", 9));
  ASSERT_TRUE(rev2.ok());
  EXPECT_GT(*rev2, *rev);
  got = client_->Get(Key("a"));
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->value, std::string("two\0bytes", 9));
  EXPECT_EQ((*got)->create_revision, *rev);
  EXPECT_EQ((*got)->mod_revision, *rev2);
  EXPECT_EQ((*got)->version, 2);

  auto deleted = client_->Delete(Key("a"));
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 1);
  got = client_->Get(Key("a"));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  deleted = client_->Delete(Key("a"));
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 0);

  EXPECT_EQ(client_->Put("", "v").code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(client_->Get("").code(), ErrorCode::INVALID_PARAMS);
}

TEST_F(EtcdClientTest, GetPrefixReturnsKeysUnderThePrefixInOrder) {
  for (const char* k : {"p/b", "p/a", "p/c", "pz", "p"}) ASSERT_TRUE(client_->Put(Key(k), k).ok());
  // A prefix ending in 0xff: its range end is the prefix's previous byte incremented.
  const std::string ff = Key("x\xff");
  for (const std::string& k : {ff + "1", ff + "\xff", Key("y")}) {
    ASSERT_TRUE(client_->Put(k, "v").ok());
  }
  int64_t rev = 0;
  auto kvs = client_->GetPrefix(Key("p/"), &rev);
  ASSERT_TRUE(kvs.ok()) << kvs.status().ToString();
  ASSERT_EQ(kvs->size(), 3u);
  EXPECT_EQ((*kvs)[0].key, Key("p/a"));
  EXPECT_EQ((*kvs)[1].key, Key("p/b"));
  EXPECT_EQ((*kvs)[2].key, Key("p/c"));
  EXPECT_EQ((*kvs)[0].value, "p/a");
  EXPECT_GT(rev, 0);

  kvs = client_->GetPrefix(ff);
  ASSERT_TRUE(kvs.ok());
  ASSERT_EQ(kvs->size(), 2u);
  EXPECT_EQ((*kvs)[0].key, ff + "1");
  EXPECT_EQ((*kvs)[1].key, ff + "\xff");

  kvs = client_->GetPrefix(Key("none/"));
  ASSERT_TRUE(kvs.ok());
  EXPECT_TRUE(kvs->empty());
  kvs = client_->GetPrefix(prefix_);
  ASSERT_TRUE(kvs.ok());
  EXPECT_EQ(kvs->size(), 8u);
}

// The leader election's step: create the key only if absent. Of two clients racing, one wins.
TEST_F(EtcdClientTest, TxnCreateIfAbsentWinsOnceBetweenTwoRacingClients) {
  auto other = MustConnect(server_->endpoint());
  ASSERT_NE(other, nullptr);
  EtcdClient* clients[2] = {client_.get(), other.get()};
  for (int round = 0; round < 10; ++round) {
    const std::string key = Key("leader-" + std::to_string(round));
    std::atomic<int> ready{0};
    Result<etcd::TxnResult> results[2] = {Status(ErrorCode::INTERNAL_ERROR, "not run"),
                                          Status(ErrorCode::INTERNAL_ERROR, "not run")};
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        ready.fetch_add(1);
        while (ready.load() < 2) std::this_thread::yield();  // both start together
        results[i] =
            clients[i]->Txn({Compare::CreateRevision(key, Compare::Result::kEqual, 0)},
                            {TxnOp::Put(key, "client-" + std::to_string(i))}, {TxnOp::Get(key)});
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_TRUE(results[0].ok()) << results[0].status().ToString();
    ASSERT_TRUE(results[1].ok()) << results[1].status().ToString();
    ASSERT_NE(results[0]->succeeded, results[1]->succeeded) << "round " << round;
    const int winner = results[0]->succeeded ? 0 : 1;
    const etcd::TxnResult& lost = *results[1 - winner];
    // The loser's failure branch read the winner's value, at the revision of the winner's put.
    ASSERT_EQ(lost.gets.size(), 1u);
    ASSERT_TRUE(lost.gets[0].has_value());
    EXPECT_EQ(lost.gets[0]->value, "client-" + std::to_string(winner));
    EXPECT_EQ(lost.gets[0]->mod_revision, results[winner]->revision);
    EXPECT_TRUE(results[winner]->gets.empty());
    auto stored = client_->Get(key);
    ASSERT_TRUE(stored.ok() && stored->has_value());
    EXPECT_EQ((*stored)->value, "client-" + std::to_string(winner));
  }
}

TEST_F(EtcdClientTest, TxnGuardFailureRunsTheFailureBranch) {
  auto rev = client_->Put(Key("k"), "a");
  ASSERT_TRUE(rev.ok());
  auto r = client_->Txn({Compare::Value(Key("k"), Compare::Result::kEqual, "b")},
                        {TxnOp::Put(Key("k"), "x"), TxnOp::Put(Key("s"), "success")},
                        {TxnOp::Get(Key("k")), TxnOp::Put(Key("f"), "failure"),
                         TxnOp::Get(Key("absent")), TxnOp::Delete(Key("gone"))});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->succeeded);
  ASSERT_EQ(r->gets.size(), 2u);
  ASSERT_TRUE(r->gets[0].has_value());
  EXPECT_EQ(r->gets[0]->value, "a");
  EXPECT_FALSE(r->gets[1].has_value());
  EXPECT_EQ(ValueOf(*client_, Key("k")), "a");
  EXPECT_FALSE(client_->Get(Key("s"))->has_value());
  EXPECT_EQ(ValueOf(*client_, Key("f")), "failure");

  // The guard holds: the success branch runs (mod revision and version compares).
  r = client_->Txn({Compare::ModRevision(Key("k"), Compare::Result::kEqual, *rev),
                    Compare{Key("k"), Compare::Target::kVersion, Compare::Result::kLess, 2, {}},
                    Compare::Value(Key("k"), Compare::Result::kNotEqual, "b")},
                   {TxnOp::Put(Key("k"), "x"), TxnOp::Get(Key("k"))});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->succeeded);
  ASSERT_EQ(r->gets.size(), 1u);
  EXPECT_EQ(r->gets[0]->value, "x");  // operations of a branch see the ones before them
  EXPECT_EQ(r->gets[0]->mod_revision, r->revision);
  // A greater-than compare on a stale revision fails.
  r = client_->Txn({Compare::ModRevision(Key("k"), Compare::Result::kGreater, r->revision)},
                   {TxnOp::Delete(Key("k"))});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->succeeded);
  EXPECT_TRUE(client_->Get(Key("k"))->has_value());
}

TEST_F(EtcdClientTest, KeepAliveKeepsAKeyPastItsTtl) {
  auto lease = client_->GrantLease(1);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->ttl_seconds, 1);  // etcd's minimum with a 500 ms election timeout
  ASSERT_TRUE(client_->Put(Key("k"), "v", lease->id).ok());
  auto got = client_->Get(Key("k"));
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->lease, lease->id);
  auto keepalive = client_->StartKeepAlive(lease->id);
  ASSERT_TRUE(keepalive.ok());
  const auto start = Clock::now();
  while (Since(start) < Millis(2500)) {  // 2.5 TTLs
    auto ttl = (*keepalive)->Renew();
    ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
    EXPECT_EQ(*ttl, 1);
    std::this_thread::sleep_for(Millis(250));
  }
  EXPECT_TRUE(client_->Get(Key("k"))->has_value());
  auto left = client_->LeaseTimeToLive(lease->id);
  ASSERT_TRUE(left.ok());
  EXPECT_GE(*left, 0);
  EXPECT_LE(*left, 1);

  // Renewals stop: the key goes with the lease, and the keepalive then says so.
  EXPECT_TRUE(WaitUntil([&] { return !client_->Get(Key("k"))->has_value(); }, Millis(5000)));
  EXPECT_EQ((*keepalive)->Renew().code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(client_->LeaseTimeToLive(lease->id).code(), ErrorCode::OBJECT_NOT_FOUND);
}

TEST_F(EtcdClientTest, WithoutKeepAliveTheKeyGoesWhenTheLeaseExpires) {
  auto lease = client_->GrantLease(1);
  ASSERT_TRUE(lease.ok());
  const auto start = Clock::now();
  ASSERT_TRUE(client_->Put(Key("k"), "v", lease->id).ok());
  ASSERT_TRUE(WaitUntil([&] { return !client_->Get(Key("k"))->has_value(); }, Millis(5000)));
  // Not before the TTL (less a little: the lease's clock started at the grant, before `start`).
  EXPECT_GE(Since(start).count(), 900);
  EXPECT_EQ(client_->LeaseTimeToLive(lease->id).code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(client_->RevokeLease(lease->id).code(), ErrorCode::OBJECT_NOT_FOUND);
}

TEST_F(EtcdClientTest, RevokeDeletesTheKeyAtOnce) {
  auto lease = client_->GrantLease(60);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->ttl_seconds, 60);
  ASSERT_TRUE(client_->Put(Key("k"), "v", lease->id).ok());
  auto left = client_->LeaseTimeToLive(lease->id);
  ASSERT_TRUE(left.ok());
  EXPECT_GT(*left, 55);
  ASSERT_TRUE(client_->RevokeLease(lease->id).ok());
  auto got = client_->Get(Key("k"));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  EXPECT_EQ(client_->RevokeLease(lease->id).code(), ErrorCode::OBJECT_NOT_FOUND);
  auto keepalive = client_->StartKeepAlive(lease->id);
  ASSERT_TRUE(keepalive.ok());
  EXPECT_EQ((*keepalive)->Renew().code(), ErrorCode::OBJECT_NOT_FOUND);
  // A put on a revoked lease is etcd's error, passed on.
  auto put = client_->Put(Key("k"), "v", lease->id);
  EXPECT_EQ(put.code(), ErrorCode::OBJECT_NOT_FOUND) << put.status().ToString();
  EXPECT_EQ(client_->GrantLease(0).code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(client_->StartKeepAlive(0).code(), ErrorCode::INVALID_PARAMS);
}

TEST_F(EtcdClientTest, WatchSeesPutsAndDeletesInOrder) {
  WatchLog log;
  auto watch = client_->StartWatch(Key("w/"), true, 0, log.Events(), log.Errors());
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  // Started before any of these: it sees all of them, and nothing outside the prefix.
  ASSERT_TRUE(client_->Put(Key("w/a"), "1").ok());
  ASSERT_TRUE(client_->Put(Key("other"), "x").ok());
  ASSERT_TRUE(client_->Put(Key("w/b"), "2").ok());
  ASSERT_TRUE(client_->Delete(Key("w/a")).ok());
  auto txn = client_->Txn({}, {TxnOp::Put(Key("w/c"), "3"), TxnOp::Delete(Key("w/b"))});
  ASSERT_TRUE(txn.ok());
  ASSERT_TRUE(log.WaitEvents(5, Millis(5000)));
  std::this_thread::sleep_for(Millis(100));  // nothing more comes
  auto events = log.events();
  ASSERT_EQ(events.size(), 5u);
  ExpectEvent(events[0], WatchEvent::Type::kPut, Key("w/a"), "1");
  ExpectEvent(events[1], WatchEvent::Type::kPut, Key("w/b"), "2");
  ExpectEvent(events[2], WatchEvent::Type::kDelete, Key("w/a"), "");
  ExpectEvent(events[3], WatchEvent::Type::kPut, Key("w/c"), "3");
  ExpectEvent(events[4], WatchEvent::Type::kDelete, Key("w/b"), "");
  for (size_t i = 1; i < 4; ++i)
    EXPECT_LT(events[i - 1].kv.mod_revision, events[i].kv.mod_revision);
  EXPECT_EQ(events[3].kv.mod_revision, txn->revision);  // one transaction, one revision
  EXPECT_EQ(events[4].kv.mod_revision, txn->revision);
  EXPECT_TRUE(log.errors().empty());
}

TEST_F(EtcdClientTest, WatchFromAPastRevisionReplaysHistory) {
  auto r1 = client_->Put(Key("k"), "v1");
  ASSERT_TRUE(r1.ok());
  ASSERT_TRUE(client_->Put(Key("k"), "v2").ok());
  ASSERT_TRUE(client_->Delete(Key("k")).ok());
  ASSERT_TRUE(client_->Put(Key("k2"), "not watched").ok());

  WatchLog log;
  auto watch = client_->StartWatch(Key("k"), false, *r1, log.Events(), log.Errors());
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  ASSERT_TRUE(client_->Put(Key("k"), "v3").ok());
  ASSERT_TRUE(log.WaitEvents(4, Millis(5000)));
  auto events = log.events();
  ASSERT_EQ(events.size(), 4u);
  ExpectEvent(events[0], WatchEvent::Type::kPut, Key("k"), "v1");
  EXPECT_EQ(events[0].kv.mod_revision, *r1);
  ExpectEvent(events[1], WatchEvent::Type::kPut, Key("k"), "v2");
  ExpectEvent(events[2], WatchEvent::Type::kDelete, Key("k"), "");
  ExpectEvent(events[3], WatchEvent::Type::kPut, Key("k"), "v3");
  EXPECT_EQ(events[3].kv.version, 1);  // recreated after the delete
}

TEST_F(EtcdClientTest, WatchDestroyedFromItsOwnCallbackStopsCleanly) {
  WatchLog log;
  std::unique_ptr<etcd::Watch> watch;
  std::mutex mu;
  std::atomic<int> calls{0};
  auto started = client_->StartWatch(
      Key("k"), false, 0,
      [&](const std::vector<WatchEvent>& events) {
        ++calls;
        std::lock_guard lock(mu);
        watch.reset();  // the callback's own Watch
        log.Events()(events);
      },
      log.Errors());
  ASSERT_TRUE(started.ok());
  {
    std::lock_guard lock(mu);
    watch = std::move(started).value();
  }
  ASSERT_TRUE(client_->Put(Key("k"), "1").ok());
  ASSERT_TRUE(log.WaitEvents(1, Millis(5000)));
  ASSERT_TRUE(client_->Put(Key("k"), "2").ok());
  std::this_thread::sleep_for(Millis(300));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(log.errors().empty());
}

// etcd compacted the revisions a watch asks for: on_error once, no events.
TEST_F(EtcdClientTest, WatchFromACompactedRevisionReportsTheError) {
  auto r1 = client_->Put(Key("k"), "v1");
  ASSERT_TRUE(r1.ok());
  auto r2 = client_->Put(Key("k"), "v2");
  ASSERT_TRUE(r2.ok());
  std::string error;
  ASSERT_TRUE(Etcdctl(server_->endpoint(), {"compact", std::to_string(*r2)}, &error)) << error;

  WatchLog log;
  auto watch = client_->StartWatch(Key("k"), false, *r1, log.Events(), log.Errors());
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  ASSERT_TRUE(log.WaitError(Millis(5000)));
  ASSERT_TRUE(client_->Put(Key("k"), "v3").ok());
  std::this_thread::sleep_for(Millis(200));
  auto errors = log.errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), ErrorCode::ETCD_OPERATION_ERROR);
  EXPECT_NE(errors[0].message().find("compacted"), std::string::npos) << errors[0].ToString();
  EXPECT_TRUE(log.events().empty());
}

// ---- a member of its own: restarts ----

// etcd raises a TTL below its minimum (1.5 election timeouts, whole seconds) and says so.
TEST(EtcdLeaseTest, GrantedTtlIsEtcdsMinimumWhenAskedForLess) {
  EtcdServer server;  // etcd's default timing: 1 s election timeout, 2 s minimum TTL
  ASSERT_TRUE(server.Start());
  auto client = MustConnect(server.endpoint());
  ASSERT_NE(client, nullptr);
  auto lease = client->GrantLease(1);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->ttl_seconds, 2);
  auto keepalive = client->StartKeepAlive(lease->id);
  ASSERT_TRUE(keepalive.ok());
  auto ttl = (*keepalive)->Renew();
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_EQ(*ttl, 2);
}

// Documented: a watch whose stream fails is re-created from the next revision when etcd answers
// again within the client's timeout, losing and repeating nothing.
TEST(EtcdRestartTest, WatchAndKeepAliveSurviveARestartWithinTheTimeout) {
  EtcdServer server(EtcdOptions{"etcd0", 50, 500});
  ASSERT_TRUE(server.Start());
  auto client = MustConnect(server.endpoint(), 5000);
  ASSERT_NE(client, nullptr);
  WatchLog log;
  auto watch = client->StartWatch("/r/", true, 0, log.Events(), log.Errors());
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  auto lease = client->GrantLease(30);
  ASSERT_TRUE(lease.ok());
  auto keepalive = client->StartKeepAlive(lease->id);
  ASSERT_TRUE(keepalive.ok());
  ASSERT_TRUE((*keepalive)->Renew().ok());
  ASSERT_TRUE(client->Put("/r/before", "1").ok());
  ASSERT_TRUE(log.WaitEvents(1, Millis(5000)));

  ASSERT_TRUE(server.Restart()) << server.Log();
  // A put right after the restart, before the watch has necessarily come back: not lost.
  ASSERT_TRUE(client->Put("/r/after", "2").ok());
  ASSERT_TRUE(client->Put("/r/after", "3").ok());
  ASSERT_TRUE(log.WaitEvents(3, Millis(6000))) << server.Log();
  auto events = log.events();
  ASSERT_EQ(events.size(), 3u);
  ExpectEvent(events[0], WatchEvent::Type::kPut, "/r/before", "1");
  ExpectEvent(events[1], WatchEvent::Type::kPut, "/r/after", "2");
  ExpectEvent(events[2], WatchEvent::Type::kPut, "/r/after", "3");
  EXPECT_TRUE(log.errors().empty());
  // The keepalive's stream broke with the old process: Renew re-opens it, the lease persisted.
  auto ttl = (*keepalive)->Renew();
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_EQ(*ttl, 30);
}

// Documented: when etcd does not come back within the timeout, on_error runs once.
TEST(EtcdRestartTest, WatchReportsLossOnceWhenEtcdStaysDown) {
  EtcdServer server(EtcdOptions{"etcd0", 50, 500});
  ASSERT_TRUE(server.Start());
  constexpr int kTimeoutMs = 1000;
  auto client = MustConnect(server.endpoint(), kTimeoutMs);
  ASSERT_NE(client, nullptr);
  WatchLog log;
  auto watch = client->StartWatch("/d/", true, 0, log.Events(), log.Errors());
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  server.Kill();
  const auto killed = Clock::now();
  ASSERT_TRUE(log.WaitError(Millis(3 * kTimeoutMs)));
  EXPECT_GE(Since(killed).count(), kTimeoutMs - 100);  // it did retry for the timeout
  // Back now, too late: the watch stays ended, and says so only once.
  ASSERT_TRUE(server.Start());
  ASSERT_TRUE(client->Put("/d/k", "v").ok());
  std::this_thread::sleep_for(Millis(300));
  auto errors = log.errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), ErrorCode::ETCD_OPERATION_ERROR) << errors[0].ToString();
  EXPECT_TRUE(log.events().empty());
  const auto start = Clock::now();
  watch->reset();
  EXPECT_LT(Since(start).count(), 500);
}

// ---- a 3-member cluster ----

TEST(EtcdClusterTest, ClientKeepsAnsweringWhenTheMemberItUsesIsKilled) {
  EtcdCluster cluster;
  ASSERT_TRUE(cluster.Start());
  auto client = MustConnect(cluster.endpoints());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("/c/k", "0").ok());
  WatchLog log;
  auto watch = client->StartWatch("/c/", true, 0, log.Events(), log.Errors());
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();

  // pick_first: the channel is on the first endpoint, member 0.
  cluster.Kill(0);
  // If member 0 led, the others elect a new leader first (~1 s); reads wait for it. A read, not
  // a put, so that no put is retried after its outcome was unknown.
  ASSERT_TRUE(WaitUntil([&] { return client->Get("/c/k").ok(); }, Millis(10'000))) << cluster.Log();
  for (int i = 1; i < 12; ++i) {
    auto put = client->Put("/c/k", std::to_string(i));
    ASSERT_TRUE(put.ok()) << put.status().ToString();
    auto got = client->Get("/c/k");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(got->has_value());
    EXPECT_EQ((*got)->value, std::to_string(i));
  }
  auto lease = client->GrantLease(10);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  // The watch moved to a surviving member and saw every put since the kill, in order.
  ASSERT_TRUE(log.WaitEvents(11, Millis(5000)));
  auto events = log.events();
  ASSERT_EQ(events.size(), 11u);
  for (int i = 0; i < 11; ++i) EXPECT_EQ(events[i].kv.value, std::to_string(i + 1));
  EXPECT_TRUE(log.errors().empty());

  // The killed member rejoins from its data directory.
  ASSERT_TRUE(cluster.Restart(0)) << cluster.Log();
  auto direct = MustConnect(cluster.member(0).endpoint());
  ASSERT_NE(direct, nullptr);
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto got = direct->Get("/c/k");
        return got.ok() && got->has_value() && (*got)->value == "11";
      },
      Millis(5000)));
}

// The member a watch is on loses its leader (the two others hang): etcd ends the watch, and
// refuses to re-create it while it has no leader, so on_error reports it instead of a watch
// that silently sees nothing.
TEST(EtcdClusterTest, WatchOnAMemberWithoutALeaderReportsLoss) {
  EtcdCluster cluster(EtcdOptions{"", 50, 500});
  ASSERT_TRUE(cluster.Start());
  constexpr int kTimeoutMs = 1000;
  auto client = MustConnect(cluster.member(0).endpoint(), kTimeoutMs);  // this member only
  ASSERT_NE(client, nullptr);
  WatchLog log;
  auto watch = client->StartWatch("/l/", true, 0, log.Events(), log.Errors());
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  auto lease = client->GrantLease(30);
  ASSERT_TRUE(lease.ok());
  auto keepalive = client->StartKeepAlive(lease->id);
  ASSERT_TRUE(keepalive.ok());
  ASSERT_TRUE((*keepalive)->Renew().ok());
  ASSERT_TRUE(client->Put("/l/k", "v").ok());
  ASSERT_TRUE(log.WaitEvents(1, Millis(5000)));

  ASSERT_TRUE(cluster.member(1).Pause());
  ASSERT_TRUE(cluster.member(2).Pause());
  // etcd ends leader-requiring streams after 3 election timeouts without a leader.
  ASSERT_TRUE(log.WaitError(Millis(10'000))) << cluster.Log();
  auto errors = log.errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), ErrorCode::ETCD_OPERATION_ERROR);
  EXPECT_NE(errors[0].message().find("no leader"), std::string::npos) << errors[0].ToString();
  const auto start = Clock::now();
  EXPECT_FALSE((*keepalive)->Renew().ok());
  EXPECT_LT(Since(start).count(), 2 * kTimeoutMs);

  ASSERT_TRUE(cluster.member(1).Resume());
  ASSERT_TRUE(cluster.member(2).Resume());
  ASSERT_TRUE(WaitUntil([&] { return (*keepalive)->Renew().ok(); }, Millis(10'000)));
  EXPECT_EQ(log.events().size(), 1u);
}

// ---- a partition between the client and etcd ----

TEST(EtcdProxyTest, BlackholeTimesCallsOutAndForwardRestoresThem) {
  EtcdServer server(EtcdOptions{"etcd0", 50, 500});
  ASSERT_TRUE(server.Start());
  TcpProxy proxy(server.endpoint());
  std::string error;
  ASSERT_TRUE(proxy.Start(&error)) << error;
  constexpr int kTimeoutMs = 500;
  auto client = MustConnect(proxy.endpoint(), kTimeoutMs);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("/p/k", "v").ok());
  auto lease = client->GrantLease(30);
  ASSERT_TRUE(lease.ok());
  auto keepalive = client->StartKeepAlive(lease->id);
  ASSERT_TRUE(keepalive.ok());
  ASSERT_TRUE((*keepalive)->Renew().ok());
  WatchLog log;
  auto watch = client->StartWatch("/p/", true, 0, log.Events(), log.Errors());
  ASSERT_TRUE(watch.ok());
  EXPECT_EQ(proxy.open_connections(), 1u);  // one channel, one connection

  ASSERT_TRUE(proxy.SetMode(TcpProxy::Mode::kBlackhole));
  auto start = Clock::now();
  EXPECT_EQ(client->Get("/p/k").code(), ErrorCode::RPC_TIMEOUT);
  EXPECT_LT(Since(start).count(), 2 * kTimeoutMs);
  start = Clock::now();
  EXPECT_EQ((*keepalive)->Renew().code(), ErrorCode::RPC_TIMEOUT);
  EXPECT_LT(Since(start).count(), 2 * kTimeoutMs);
  // Destroying a watch whose etcd is cut off is prompt.
  start = Clock::now();
  watch->reset();
  EXPECT_LT(Since(start).count(), kTimeoutMs);

  ASSERT_TRUE(proxy.SetMode(TcpProxy::Mode::kForward));
  ASSERT_TRUE(WaitUntil([&] { return client->Get("/p/k").ok(); }, Millis(3000)));
  auto ttl = (*keepalive)->Renew();
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();

  // Reset: connections refused; an error within the timeout, then forwarding again restores.
  ASSERT_TRUE(proxy.SetMode(TcpProxy::Mode::kReset));
  EXPECT_EQ(proxy.open_connections(), 0u);
  start = Clock::now();
  auto got = client->Get("/p/k");
  EXPECT_FALSE(got.ok());
  EXPECT_EQ(got.code(), ErrorCode::ETCD_OPERATION_ERROR) << got.status().ToString();
  EXPECT_LT(Since(start).count(), 2 * kTimeoutMs);
  ASSERT_TRUE(proxy.SetMode(TcpProxy::Mode::kForward));
  ASSERT_TRUE(WaitUntil([&] { return client->Get("/p/k").ok(); }, Millis(3000)));
  EXPECT_TRUE((*keepalive)->Renew().ok());
  EXPECT_TRUE(log.errors().empty());
}

// A partition that leaves the connection open sends no error: gRPC's keepalive pings (every
// 10 s, the shortest etcd accepts with margin) find it, and the watch ends with on_error when it
// cannot be re-created. Slow (~12 s) but the standby masters' watches rely on it.
TEST(EtcdProxyTest, WatchNoticesASilentPartitionByKeepalivePings) {
  EtcdServer server(EtcdOptions{"etcd0", 50, 500});
  ASSERT_TRUE(server.Start());
  TcpProxy proxy(server.endpoint());
  std::string error;
  ASSERT_TRUE(proxy.Start(&error)) << error;
  constexpr int kTimeoutMs = 1000;
  auto client = MustConnect(proxy.endpoint(), kTimeoutMs);
  ASSERT_NE(client, nullptr);
  WatchLog log;
  auto watch = client->StartWatch("/s/", true, 0, log.Events(), log.Errors());
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  ASSERT_TRUE(proxy.SetMode(TcpProxy::Mode::kBlackhole));
  const auto start = Clock::now();
  // Ping interval + ping timeout + the re-create's timeout, with slack for a loaded machine.
  ASSERT_TRUE(log.WaitError(Millis(20'000)));
  EXPECT_GE(Since(start).count(), 10'000);
  auto errors = log.errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), ErrorCode::ETCD_OPERATION_ERROR) << errors[0].ToString();
}

}  // namespace
}  // namespace granary::it
