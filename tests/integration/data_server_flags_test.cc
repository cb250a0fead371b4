// The node's data-server flags end to end (issue 12): a real granary-node started with
// --data-max-connections and --data-request-timeout refuses the connection past its cap and drops
// a peer stalled mid-header at the request deadline, and a real client is served afterwards.
#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "../tools/test_pattern.h"
#include "common/tsan.h"
#include "../unit/dataplane/process_limits.h"
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

// The master lists `node`'s segment (bounded wait).
bool Mounted(StoreCluster& cluster, NodeProcess& node) {
  return cluster.WaitForSegments(
      [&](const auto& names) { return std::count(names.begin(), names.end(), node.name()) == 1; },
      Millis(5000));
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
  ASSERT_TRUE(Mounted(cluster, node));
  auto client = cluster.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const auto value = testdata::Pattern("dsflags", 300 * KiB);
  Status put = client->Put("dsflags", ByteSpan(value.data(), value.size()));
  ASSERT_TRUE(put.ok()) << put.ToString() << "\n" << node.Log();
  auto got = client->Get("dsflags");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_LT(testdata::FirstDifference(*got, value), 0);
}

// Resident bytes of process `pid` (VmRSS), 0 if unreadable.
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// A probe took a node from 5 MiB to 816 MiB resident with 1,000 connections that each sent a
// 40-byte DISK_READ header announcing a 1 MiB body (the node allocated it before any byte came).
// Now a body is held as its bytes arrive, and all partial bodies together within a bound (64 MiB):
// bodies sent half-way are shed past it. The node's RSS stays bounded, and a real client is
// served throughout.
TEST(DataServerFlagsTest, AnnouncedOrHalfSentBodiesCannotExhaustANodesMemory) {
  ASSERT_TRUE(granary::testing::EnsureDescriptors(4096));
  StoreCluster cluster;
  ASSERT_TRUE(cluster.Start(0, 0));
  TempDir dir("granary-it-dsbodies");
  NodeProcess node(UniqueName("dsbodies"), 16 * MiB, dir.path());
  ASSERT_TRUE(node.Start(cluster.master_address()));
  const uint16_t port = DataPort(node.Log());
  ASSERT_NE(port, 0) << node.Log();
  ASSERT_TRUE(Mounted(cluster, node));
  auto client = cluster.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const auto value = testdata::Pattern("dsbodies", 256 * KiB);
  ASSERT_TRUE(client->Put("dsbodies", ByteSpan(value.data(), value.size())).ok());
  const uint64_t before = ResidentBytes(node.process().pid());
  ASSERT_GT(before, 0u);

  auto disk_read = [](uint64_t id) {
    transfer::RequestHeader h;
    h.opcode = transfer::Opcode::kDiskRead;
    h.request_id = id;
    h.length = transfer::kMaxDiskReadBody;
    return h;
  };
  std::vector<std::unique_ptr<RawConn>> conns;
  for (uint64_t i = 0; i < 1000; ++i) {
    conns.push_back(std::make_unique<RawConn>(port));
    ASSERT_TRUE(conns.back()->connected());
    ASSERT_TRUE(conns.back()->SendHeader(disk_read(i)));
  }
  // 150 of them send half their body: 75 MiB if it were all held.
  std::vector<uint8_t> half(transfer::kMaxDiskReadBody / 2, 0x5A);
  for (size_t i = 0; i < 150; ++i) (void)conns[i]->Send(half.data(), half.size());
  // The node reads them all: 128 fit the bound, the rest are shed (closed).
  std::vector<bool> closed(150, false);
  int shed = 0;
  const auto deadline = SteadyClock::now() + std::chrono::seconds(10);
  while (shed < 22 && SteadyClock::now() < deadline) {  // bounded by the deadline
    for (size_t i = 0; i < 150; ++i) {
      if (!closed[i] && Readable(*conns[i], 0) && conns[i]->ClosedByPeer()) {
        closed[i] = true;
        ++shed;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(shed, 0) << "150 half bodies of 512 KiB fit a 64 MiB bound?";
  EXPECT_LE(shed, 150 - 120) << "bodies shed well within the bound";
  const uint64_t during = ResidentBytes(node.process().pid());
  std::printf("node resident: %llu MiB before, %llu MiB with 1000 announced bodies, %d shed\n",
              static_cast<unsigned long long>(before / MiB),
              static_cast<unsigned long long>(during / MiB), shed);
#ifndef GRANARY_TSAN  // under TSan, resident memory counts its shadow too
  EXPECT_LT(during, before + 80 * MiB) << "partial request bodies held beyond their bound";
#endif

  auto got = client->Get("dsbodies");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_LT(testdata::FirstDifference(*got, value), 0);
  const auto again = testdata::Pattern("dsbodies2", 256 * KiB);
  Status put = client->Put("dsbodies2", ByteSpan(again.data(), again.size()));
  EXPECT_TRUE(put.ok()) << put.ToString();
  EXPECT_TRUE(node.process().Running());
}

}  // namespace
}  // namespace granary::it
