// The node's data-server flags end to end (issue 12): a real granary-node started with
// --data-max-connections and --data-request-timeout refuses the connection past its cap and drops
// a peer stalled mid-header at the request deadline, and a real client is served afterwards.
#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "../tools/test_pattern.h"
#include "../unit/dataplane/raw_conn.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

using SteadyClock = std::chrono::steady_clock;
using granary::testing::RawConn;

// The data port from the node's ready line ("data plane 127.0.0.1:PORT"); 0 if absent.
uint16_t DataPort(const std::string& log) {
  std::smatch m;
  static const std::regex kPlane("data plane [^ ,]+:([0-9]+)");
  return std::regex_search(log, m, kPlane) ? static_cast<uint16_t>(std::stoi(m[1])) : 0;
}

bool Readable(RawConn& conn, int timeout_ms) {
  pollfd pfd{conn.fd(), POLLIN, 0};
  return poll(&pfd, 1, timeout_ms) == 1;
}

TEST(DataServerFlagsTest, CapAndRequestDeadlineFlagsAreHonoured) {
  StoreCluster cluster;
  ASSERT_TRUE(cluster.Start(0, 0));
  TempDir dir("granary-it-dsflags");
  NodeProcess node(UniqueName("dsflags"), 32 * MiB, dir.path());
  ASSERT_TRUE(node.Start(cluster.master_address(),
                         {"--data-max-connections", "3", "--data-request-timeout", "1s"}));
  const uint16_t port = DataPort(node.Log());
  ASSERT_NE(port, 0) << node.Log();

  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(std::make_unique<RawConn>(port));
    ASSERT_TRUE(idle.back()->connected());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // all three accepted
  RawConn fourth(port);
  EXPECT_TRUE(fourth.ClosedByPeer()) << "the connection past --data-max-connections was served";
  for (auto& conn : idle) EXPECT_FALSE(Readable(*conn, 0)) << "an idle connection was dropped";

  // One of the three stops mid-header: dropped at the 1 s request deadline, not at the idle
  // timeout (60 s).
  const auto start = SteadyClock::now();
  ASSERT_TRUE(idle[0]->Send("GNRY", 4));
  EXPECT_TRUE(Readable(*idle[0], 5000));
  EXPECT_TRUE(idle[0]->ClosedByPeer());
  const double waited = std::chrono::duration<double>(SteadyClock::now() - start).count();
  EXPECT_GE(waited, 0.9);
  EXPECT_LT(waited, 1.8) << "dropped late: at twice the deadline?";

  idle.clear();  // frees the slots for the client's connections
  ASSERT_TRUE(cluster.WaitForSegments(
      [&](const auto& names) { return std::count(names.begin(), names.end(), node.name()) == 1; },
      Millis(5000)));
  auto client = cluster.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const auto value = testdata::Pattern("dsflags", 300 * KiB);
  Status put = client->Put("dsflags", ByteSpan(value.data(), value.size()));
  ASSERT_TRUE(put.ok()) << put.ToString() << "\n" << node.Log();
  auto got = client->Get("dsflags");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_LT(testdata::FirstDifference(*got, value), 0);
}

}  // namespace
}  // namespace granary::it
