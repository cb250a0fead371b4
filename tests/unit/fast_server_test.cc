// The master's fast port in process: a connection over the cap is refused before anything is
// read, and the client takes that as "not sent" (so it may use gRPC) instead of a failed call.
#include "master/fast_server.h"

#include <gtest/gtest.h>

#include "client/fast_channel.h"
#include "master/evictor.h"
#include "master/master_service.h"
#include "master/master_state.h"

namespace granary::master {
namespace {

class FastServerTest : public ::testing::Test {
 protected:
  FastServerTest()
      : state_(MasterPolicy{}, WallClock::Instance()), evictor_(&state_),
        service_(&state_, &evictor_, &metrics_) {}

  MasterState state_;
  Evictor evictor_;
  MetricsRegistry metrics_;
  MasterService service_;
};

TEST_F(FastServerTest, OverTheCapIsRefusedBeforeAnyRequestIsRead) {
  FastServer::Options options;
  options.max_connections = 1;
  FastServer server(&service_, &metrics_, options);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());

  proto::BatchExistRequest req;
  req.add_keys("k");
  proto::BatchExistResponse resp;
  client::FastChannel first("127.0.0.1", server.port(), 5000);
  bool sent = false;
  ASSERT_TRUE(first.Call(fast::Method::kExist, req, &resp, true, &sent).ok());
  EXPECT_TRUE(sent);
  ASSERT_EQ(resp.results_size(), 1);
  EXPECT_EQ(resp.results(0), 0);

  // `first` keeps its connection pooled: a second channel is one too many.
  client::FastChannel second("127.0.0.1", server.port(), 5000);
  proto::BatchPutStartRequest put;
  put.set_client_id("c");
  put.add_keys("k");
  put.add_sizes(1);
  proto::BatchPutStartResponse started;
  Status s = second.Call(fast::Method::kPutStart, put, &started, false, &sent);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(sent) << "a refused connection never carried the request";
  EXPECT_EQ(state_.pending_count(), 0u) << "nothing was applied";

  // The first connection still serves.
  ASSERT_TRUE(first.Call(fast::Method::kExist, req, &resp, true, &sent).ok());
  server.Stop();
}

}  // namespace
}  // namespace granary::master
