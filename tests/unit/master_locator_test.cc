// client::MasterLocator with a fixed address (no etcd): Current() is one target forever;
// NoteTerm refuses a lower term than one seen and takes 0; Call() retries a refused call (nothing
// applied) and a busy master until the deadline, does not retry a call whose outcome is unknown,
// turns a reply from a lower term into a refusal, and ends by its deadline.
#include "client/master_locator.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "proto/rpc_util.h"

namespace granary::client {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A master that answers BatchExist and BatchPutStart with scripted whole-call errors first.
class ScriptedMaster final : public proto::Master::Service {
 public:
  grpc::Status BatchExist(grpc::ServerContext*, const proto::BatchExistRequest* req,
                          proto::BatchExistResponse* resp) override {
    const int n = calls_.fetch_add(1);
    if (n < failures_.load()) {
      std::lock_guard lock(mu_);
      return failure_;
    }
    for (int i = 0; i < req->keys_size(); ++i) resp->add_results(1);
    return grpc::Status::OK;
  }
  grpc::Status BatchPutStart(grpc::ServerContext*, const proto::BatchPutStartRequest* req,
                             proto::BatchPutStartResponse* resp) override {
    calls_.fetch_add(1);
    for (int i = 0; i < req->keys_size(); ++i) resp->add_results();
    resp->set_term(term_.load());
    return grpc::Status::OK;
  }

  // The first `n` calls end with `status`.
  void Fail(int n, grpc::Status status) {
    {
      // gRPC's handoff between a handler and the client is not seen by TSan.
      std::lock_guard lock(mu_);
      failure_ = std::move(status);
    }
    failures_ = n;
    calls_ = 0;
  }
  void set_term(uint64_t t) { term_ = t; }
  int calls() const { return calls_.load(); }

 private:
  std::atomic<int> calls_{0};
  std::atomic<int> failures_{0};
  std::mutex mu_;
  grpc::Status failure_;  // guarded by mu_
  std::atomic<uint64_t> term_{0};
};

class MasterLocatorTest : public ::testing::Test {
 protected:
  MasterLocatorTest() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&master_);
    server_ = builder.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(port_);
  }
  ~MasterLocatorTest() override { server_->Shutdown(); }

  std::shared_ptr<MasterLocator> Locator(int timeout_ms = 5000) {
    auto locator = MasterLocator::Create(address_, "", timeout_ms);
    EXPECT_TRUE(locator.ok()) << locator.status().ToString();
    return locator.ok() ? *locator : nullptr;
  }
  Status Exist(MasterLocator& locator, proto::BatchExistResponse* resp, bool idempotent = true,
               int timeout_ms = 0) {
    proto::BatchExistRequest req;
    req.add_keys("k");
    return locator.Call(&proto::Master::Stub::BatchExist, req, resp, "exist", idempotent,
                        timeout_ms);
  }

  ScriptedMaster master_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(MasterLocatorTest, AFixedAddressIsOneTargetForever) {
  auto locator = Locator();
  ASSERT_TRUE(locator);
  EXPECT_FALSE(locator->follows_etcd());
  EXPECT_EQ(locator->address(), address_);
  auto first = locator->Current();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->address, address_);
  EXPECT_EQ(first->term, 0u);
  EXPECT_TRUE(first->stub);
  locator->Stale(first->generation);  // a fixed address is not looked up again
  for (int i = 0; i < 5; ++i) {
    auto again = locator->Current(Clock::now() + 1s);
    EXPECT_EQ(again.get(), first.get());
  }
  EXPECT_EQ(locator->lookups(), 0u);
  EXPECT_FALSE(MasterLocator::Create("").ok()) << "no address";
}

TEST_F(MasterLocatorTest, NoteTermRefusesALowerTermAndTakesZero) {
  auto locator = Locator();
  ASSERT_TRUE(locator);
  EXPECT_TRUE(locator->NoteTerm(0));
  EXPECT_TRUE(locator->NoteTerm(5));
  EXPECT_TRUE(locator->NoteTerm(5)) << "the same term again";
  EXPECT_FALSE(locator->NoteTerm(4)) << "a deposed leader's";
  EXPECT_FALSE(locator->NoteTerm(1));
  EXPECT_TRUE(locator->NoteTerm(0)) << "a master without HA";
  EXPECT_TRUE(locator->NoteTerm(9));
  EXPECT_FALSE(locator->NoteTerm(5)) << "the highest seen counts";
  // Concurrent notes: the highest wins, never lowered.
  std::vector<std::thread> threads;
  for (uint64_t t = 10; t < 30; ++t) threads.emplace_back([&, t] { locator->NoteTerm(t); });
  for (auto& t : threads) t.join();
  EXPECT_FALSE(locator->NoteTerm(28));
  EXPECT_TRUE(locator->NoteTerm(29));
}

// A fixed address names one master: a refusal (it is a standby) is the answer, at once; there is
// no other master to ask (the next leader is only found through etcd).
TEST_F(MasterLocatorTest, ARefusalFromAFixedAddressIsReturnedAtOnce) {
  auto locator = Locator();
  ASSERT_TRUE(locator);
  master_.Fail(1, rpc::ToGrpc(Status(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, "not the leader")));
  proto::BatchExistResponse resp;
  Status s = Exist(*locator, &resp, /*idempotent=*/false);  // refused: nothing was applied
  EXPECT_EQ(s.code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE) << s.ToString();
  EXPECT_EQ(master_.calls(), 1);
  s = Exist(*locator, &resp, false);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(resp.results_size(), 1) << "the reply is the successful call's alone";
  EXPECT_EQ(resp.results(0), 1);
}

TEST_F(MasterLocatorTest, ABusyMasterIsRetried) {
  auto locator = Locator();
  ASSERT_TRUE(locator);
  master_.Fail(2, rpc::ToGrpc(Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, "no standby")));
  proto::BatchExistResponse resp;
  Status s = Exist(*locator, &resp, false);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(master_.calls(), 3);
}

// The master applied the call but could not confirm its replication: a call that must not run
// twice gets that answer; one that may gets one more try.
TEST_F(MasterLocatorTest, ACallThatMayHaveBeenAppliedIsRetriedOnlyIfIdempotent) {
  auto locator = Locator();
  ASSERT_TRUE(locator);
  master_.Fail(1, rpc::ToGrpc(Status(ErrorCode::RPC_TIMEOUT, "outcome unknown")));
  proto::BatchExistResponse resp;
  Status s = Exist(*locator, &resp, /*idempotent=*/false);
  EXPECT_EQ(s.code(), ErrorCode::RPC_TIMEOUT) << s.ToString();
  EXPECT_NE(s.message().find("outcome unknown"), std::string::npos);
  EXPECT_EQ(master_.calls(), 1);
  master_.Fail(1, rpc::ToGrpc(Status(ErrorCode::RPC_TIMEOUT, "outcome unknown")));  // counts anew
  s = Exist(*locator, &resp, /*idempotent=*/true);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(master_.calls(), 2);
}

TEST_F(MasterLocatorTest, BusyRefusalsEndAtTheDeadline) {
  auto locator = Locator();
  ASSERT_TRUE(locator);
  master_.Fail(1 << 30, rpc::ToGrpc(Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, "no standby")));
  proto::BatchExistResponse resp;
  const auto start = Clock::now();
  Status s = Exist(*locator, &resp, true, /*timeout_ms=*/300);
  const auto took = Clock::now() - start;
  // The refusal, or the last attempt cut by the deadline.
  EXPECT_TRUE(s.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS ||
              s.code() == ErrorCode::RPC_TIMEOUT)
      << s.ToString();
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 2s);
  EXPECT_GE(master_.calls(), 2);
}

TEST_F(MasterLocatorTest, AReplyFromALowerTermIsNotUsed) {
  auto locator = Locator(400);
  ASSERT_TRUE(locator);
  ASSERT_TRUE(locator->NoteTerm(10));
  master_.set_term(7);
  proto::BatchPutStartRequest req;
  req.set_client_id("c");
  req.add_keys("k");
  req.add_sizes(1);
  proto::BatchPutStartResponse resp;
  const auto start = Clock::now();
  Status s = locator->Call(&proto::Master::Stub::BatchPutStart, req, &resp, "put start", false);
  EXPECT_FALSE(s.ok()) << "a deposed leader's reply was used";
  // It applied the put: the outcome is unknown, and a put may not run twice.
  EXPECT_EQ(s.code(), ErrorCode::RPC_FAIL) << s.ToString();
  EXPECT_EQ(master_.calls(), 1) << "a non-idempotent call answered by a deposed leader was retried";
  EXPECT_LT(Clock::now() - start, 3s);
  master_.set_term(10);
  s = locator->Call(&proto::Master::Stub::BatchPutStart, req, &resp, "put start", false);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(resp.term(), 10u);
}

// A master that is not there: an idempotent call gets one more try on a fixed address, then the
// error; every call ends by its deadline.
TEST(MasterLocatorUnreachable, AnUnreachableMasterEndsTheCallByItsDeadline) {
  int port = 0;
  {
    grpc::ServerBuilder builder;  // a port that was free a moment ago
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    ScriptedMaster m;
    builder.RegisterService(&m);
    auto server = builder.BuildAndStart();
    server->Shutdown();
  }
  auto locator = MasterLocator::Create("127.0.0.1:" + std::to_string(port), "", 1500);
  ASSERT_TRUE(locator.ok());
  proto::BatchExistRequest req;
  req.add_keys("k");
  proto::BatchExistResponse resp;
  const auto start = Clock::now();
  Status s = (*locator)->Call(&proto::Master::Stub::BatchExist, req, &resp, "exist", true);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == ErrorCode::RPC_FAIL || s.code() == ErrorCode::RPC_TIMEOUT)
      << s.ToString();
  EXPECT_LT(Clock::now() - start, 4s);
}

}  // namespace
}  // namespace granary::client
