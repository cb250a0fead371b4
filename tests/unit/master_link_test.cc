// MasterLink against an in-process master (its gRPC service and fast port on loopback): a busy
// fast port costs one call a trip over gRPC, not the channel; a master without a fast port is
// not asked again every second; a slow lookup does not stall other callers.
#include "client/master_link.h"

#include "client/read_releaser.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "master/policy/evictor.h"
#include "master/service/fast_server.h"
#include "master/service/master_service.h"
#include "master/state/master_state.h"
#include "proto/rpc_util.h"

namespace granary::client {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

class MasterLinkTest : public ::testing::Test {
 protected:
  MasterLinkTest()
      : state_(master::MasterPolicy{}, WallClock::Instance()), evictor_(&state_),
        service_(&state_, &evictor_, &metrics_) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &grpc_port_);
    builder.RegisterService(&service_);
    grpc_ = builder.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(grpc_port_);
    stub_ = proto::Master::NewStub(rpc::MakeChannel(address_));
  }
  ~MasterLinkTest() override { grpc_->Shutdown(); }

  // The value of one series of the in-process master's metrics (0 if absent).
  double Metric(const std::string& series) {
    const std::string text = metrics_.RenderPrometheus();
    size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return 0;
    return std::stod(text.substr(at + series.size() + 2));
  }

  master::MasterState state_;
  master::Evictor evictor_;
  MetricsRegistry metrics_;
  master::MasterService service_;
  int grpc_port_ = 0;
  std::unique_ptr<grpc::Server> grpc_;
  std::string address_;
  std::unique_ptr<proto::Master::Stub> stub_;
};

proto::BatchExistRequest ExistOf(const std::string& key) {
  proto::BatchExistRequest req;
  req.add_keys(key);
  return req;
}

TEST_F(MasterLinkTest, ABusyFastPortSendsTheCallOverGrpcAndKeepsTheChannel) {
  master::FastServer::Options options;
  options.max_connections = 1;
  master::FastServer fast(&service_, &metrics_, options);
  ASSERT_TRUE(fast.Start("127.0.0.1", 0).ok());
  service_.set_fast_port(fast.port());
  // Another client holds the only connection the master allows (pooled after its call).
  FastChannel occupant("127.0.0.1", fast.port(), 5000);
  proto::BatchExistResponse resp;
  bool sent = false;
  ASSERT_TRUE(occupant.Call(fast::Method::kExist, ExistOf("k"), &resp, true, &sent).ok());

  MasterLink link(MasterLocator::Create(address_).value(), 5000);
  ASSERT_EQ(link.FastPort(), fast.port());
  Status s = link.Exist(ExistOf("k"), &resp);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(resp.results_size(), 1);
  EXPECT_EQ(Metric("granary_master_rpc_total{method=\"BatchExist\"}"), 2)
      << "one call over the fast port (the occupant's), this one over gRPC";
  EXPECT_EQ(link.FastPort(), fast.port()) << "a busy master is not a broken channel";
  fast.Stop();
}

TEST_F(MasterLinkTest, AMasterWithoutAFastPortIsNotAskedEverySecond) {
  service_.set_fast_port(0);  // --fast-path false
  MasterLink link(MasterLocator::Create(address_).value(), 5000);
  proto::BatchExistResponse resp;
  const auto end = steady_clock::now() + milliseconds(1500);
  int calls = 0;
  while (steady_clock::now() < end) {  // bounded: 1.5 s
    ASSERT_TRUE(link.Exist(ExistOf("k"), &resp).ok());
    ++calls;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_GE(calls, 5);
  EXPECT_EQ(Metric("granary_master_rpc_total{method=\"ListSegments\"}"), 1)
      << "the answer 'no fast port' was not kept";
}

// Keys piled up in the releaser past the master's batch limit (65,536) are all released: it
// sends them in batches the master takes, not in one call the master refuses whole.
TEST_F(MasterLinkTest, ReadReleaserReleasesMoreKeysThanOneBatchMayHold) {
  ASSERT_TRUE(state_.Mount({"node", {"seg", 64 << 20, "127.0.0.1:1", "shm-seg", "h", 1, true}})
                  .status.ok());
  constexpr size_t kKeys = master::kMaxBatchKeys + 4000;
  std::vector<std::string> keys;
  for (size_t i = 0; i < kKeys; ++i) keys.push_back("released/" + std::to_string(i));
  for (size_t first = 0; first < kKeys; first += 50'000) {
    const std::vector<std::string> part(keys.begin() + first,
                                        keys.begin() + std::min(kKeys, first + 50'000));
    auto started = state_.PutStart({"w", part, std::vector<uint64_t>(part.size(), 64), {}, false});
    std::vector<uint64_t> gens;
    for (const auto& s : started) {
      ASSERT_TRUE(s.status.ok()) << s.status.ToString();
      gens.push_back(s.put_gen);
    }
    state_.PutEnd({"w", part, std::vector<uint64_t>(part.size(), 1), gens});
    for (const auto& r : state_.GetReplicaList({"reader", part})) ASSERT_TRUE(r.status.ok());
  }
  ASSERT_EQ(state_.Stat(keys.front())->read_locks, 1u);
  {
    MasterLink link(MasterLocator::Create(address_).value(), 10'000, MasterLink::Path::kGrpc);
    ReadReleaser releaser(&link, "reader");
    releaser.Add(keys);  // all at once: more than the master takes in one call
    releaser.Flush();
  }
  size_t locked = 0;
  for (const auto& key : keys) locked += state_.Stat(key)->read_locks > 0;
  EXPECT_EQ(locked, 0u) << "read locks left to their TTL";
}

// A master that accepts TCP and never answers: the link's lookup of the fast port hangs until
// its deadline. Meanwhile another caller must not wait behind it.
TEST(MasterLinkLookupTest, ASlowLookupDoesNotStallOtherCallers) {
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 16), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  constexpr int kTimeoutMs = 1500;
  MasterLink link(MasterLocator::Create(address).value(), kTimeoutMs);

  std::atomic<bool> first_done{false};
  steady_clock::time_point first_end;
  const auto t0 = steady_clock::now();
  std::thread first([&] {
    proto::PingResponse resp;
    (void)link.Ping(proto::PingRequest(), &resp);  // looks the fast port up, then gRPC: both hang
    first_end = steady_clock::now();
    first_done = true;
  });
  std::this_thread::sleep_for(milliseconds(300));
  const auto t1 = steady_clock::now();
  const uint16_t port = link.FastPort();
  const auto second_took = std::chrono::duration_cast<milliseconds>(steady_clock::now() - t1);
  const bool first_still_running = !first_done.load();
  first.join();
  ASSERT_GE(std::chrono::duration_cast<milliseconds>(first_end - t0).count(), kTimeoutMs - 100)
      << "the fake master answered: this test proves nothing";
  EXPECT_TRUE(first_still_running);
  EXPECT_EQ(port, 0);
  EXPECT_LT(second_took.count(), 300) << "a caller waited behind another's lookup";
  ::close(listener);
}

}  // namespace
}  // namespace granary::client
