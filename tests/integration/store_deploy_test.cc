// Deployments, end to end: an embedded node, a standalone node, a node stopped with SIGTERM.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <csignal>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "../tools/test_pattern.h"
#include "store_fixture.h"
#include "store_objects.h"

namespace granary::it {
namespace {

// ---------------------------------------------------------------------------------------------
// Deployments: an embedded node, a standalone node, a node stopped with SIGTERM.

TEST_F(StoreTest, EmbeddedNodeContributesSegmentAndCloseUnmountsIt) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  ClientOptions embedded_options;
  embedded_options.segment_size = 32 * MiB;
  embedded_options.segment_name = UniqueName("embedded");
  embedded_options.data_host = "127.0.0.1";
  auto embedded = cluster_.MakeClient(true, embedded_options);
  ASSERT_NE(embedded, nullptr);
  const std::string segment = embedded->segment_name();
  EXPECT_EQ(segment, embedded_options.segment_name);
  EXPECT_TRUE(cluster_.WaitForSegments(
      [&](const auto& names) { return std::count(names.begin(), names.end(), segment) == 1; },
      Millis(3000)))
      << "the embedded segment is not listed";

  auto other = cluster_.MakeClient(false);
  ASSERT_NE(other, nullptr);
  ReplicateConfig config;
  config.preferred_segments = {segment};
  std::vector<uint64_t> sizes(10, 200 * KiB + 1);
  sizes[0] = 6 * MiB;
  const std::vector<Obj> objects = MakeObjects("embedded/", sizes);
  for (const auto& o : objects) {
    ASSERT_TRUE(other->Put(o.key, Span(o.value), config).ok()) << o.key;
    auto st = other->Stat(o.key);
    ASSERT_TRUE(st.ok());
    ASSERT_EQ(st->replicas.size(), 1u);
    EXPECT_EQ(st->replicas[0].segment_name, segment) << "preferred segment not used for " << o.key;
  }
  ByteChecker check;
  for (Client* c : {other.get(), embedded.get()}) {
    for (const auto& o : objects) {
      auto got = c->Get(o.key);
      ASSERT_TRUE(got.ok()) << o.key << ": " << got.status().ToString();
      check.Check("embedded " + o.key, *got, o.value);
    }
  }
  EXPECT_EQ(check.mismatches(), 0);

  embedded->Close();
  auto names = cluster_.ListSegmentNames();
  ASSERT_TRUE(names.has_value());
  EXPECT_EQ(std::count(names->begin(), names->end(), segment), 0)
      << "Close() did not unmount the embedded segment";
  struct stat st {};
  EXPECT_NE(::stat(("/dev/shm/granary-" + segment).c_str(), &st), 0)
      << "Close() left /dev/shm/granary-" << segment << " behind";
  for (const auto& o : objects) {
    EXPECT_EQ(other->Get(o.key).code(), ErrorCode::OBJECT_NOT_FOUND) << o.key;
  }
  // The store works on without it.
  const Bytes value = testdata::Pattern("after-close", 10 * KiB);
  ASSERT_TRUE(other->Put("after-close", Span(value)).ok());
  auto got = other->Get("after-close");
  ASSERT_TRUE(got.ok());
  EXPECT_LT(testdata::FirstDifference(*got, value), 0);
}

TEST(StandaloneNodeTest, ClientPutsAndGetsAgainstStandaloneNode) {
  TempDir dir("granary-it-standalone");
  const uint16_t master_port = PickFreePort();
  uint16_t http_port;
  do {
    http_port = PickFreePort();
  } while (http_port == master_port);
  const std::string name = UniqueName("standalone");
  ChildProcess node;
  std::string error;
  ASSERT_TRUE(node.Start(BinaryPath("granary-node"),
                         {"--standalone", "--host", "127.0.0.1", "--master-port",
                          std::to_string(master_port), "--http-port", std::to_string(http_port),
                          "--segment-size", "64MB", "--port", "0", "--name", name},
                         dir.File("node.log"), &error))
      << error;
  ASSERT_TRUE(WaitForLog(node, "granary-node ready", Millis(10'000))) << node.LogContents();
  EXPECT_EQ(HttpGet(http_port, "/health").status, 200);

  for (bool shm : {false, true}) {
    ClientOptions options;
    options.master_address = "127.0.0.1:" + std::to_string(master_port);
    options.use_shared_memory = shm;
    options.rpc_timeout_ms = 5000;
    options.io_timeout_ms = 10'000;
    auto connected = Client::Connect(options);
    ASSERT_TRUE(connected.ok()) << connected.status().ToString();
    Client& client = **connected;
    auto segments = client.ListSegments();
    ASSERT_TRUE(segments.ok()) << segments.status().ToString();
    ASSERT_EQ(segments->size(), 1u);
    EXPECT_EQ((*segments)[0].name, name);
    EXPECT_EQ((*segments)[0].size, 64 * MiB);
    std::vector<uint64_t> sizes = {1 * KiB, 100 * KiB + 1, 5 * MiB};
    const std::vector<Obj> objects = MakeObjects(shm ? "sa-shm/" : "sa-tcp/", sizes);
    for (const auto& o : objects) {
      ASSERT_TRUE(client.Put(o.key, Span(o.value)).ok()) << o.key;
      auto got = client.Get(o.key);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_LT(testdata::FirstDifference(*got, o.value), 0) << o.key;
    }
    EXPECT_EQ(client.Get("sa/missing").code(), ErrorCode::OBJECT_NOT_FOUND);
  }
  ASSERT_TRUE(node.Kill(SIGTERM));
  auto exited = node.Wait(Millis(10'000));
  ASSERT_TRUE(exited.has_value()) << "standalone node ignored SIGTERM";
  EXPECT_TRUE(exited->Succeeded()) << exited->ToString() << "\n" << node.LogContents();
  struct stat st {};
  EXPECT_NE(::stat(("/dev/shm/granary-" + name).c_str(), &st), 0) << "segment left in /dev/shm";
}

TEST_F(StoreTest, NodeSigtermUnmountsPromptlyAndRemovesShm) {
  ASSERT_TRUE(cluster_.Start(2, 64 * MiB));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  NodeProcess& node = cluster_.node(0);
  const std::string name = node.name();
  struct stat st {};
  ASSERT_EQ(::stat(node.ShmPath().c_str(), &st), 0) << node.ShmPath() << " missing while running";

  ReplicateConfig config;
  config.preferred_segments = {name};
  const Bytes value = testdata::Pattern("on-stopped-node", 64 * KiB);
  ASSERT_TRUE(client->Put("on-stopped-node", Span(value), config).ok());

  const auto signalled = SteadyClock::now();
  ASSERT_TRUE(node.Kill(SIGTERM));
  auto exited = node.Wait(Millis(5000));
  ASSERT_TRUE(exited.has_value()) << "granary-node did not exit within 5 s of SIGTERM";
  EXPECT_TRUE(exited->Succeeded()) << exited->ToString() << "\n" << node.Log();
  // Unmounted on the way out, not expired: listed no more right away, well within the 2 s TTL.
  auto names = cluster_.ListSegmentNames();
  const auto checked = std::chrono::duration_cast<Millis>(SteadyClock::now() - signalled);
  ASSERT_TRUE(names.has_value());
  EXPECT_EQ(std::count(names->begin(), names->end(), name), 0)
      << "segment still listed " << checked.count() << " ms after SIGTERM";
  EXPECT_LT(checked.count(), 1500) << "too slow to tell unmount from expiry";
  EXPECT_EQ(std::count(names->begin(), names->end(), cluster_.node(1).name()), 1);
  EXPECT_NE(::stat(node.ShmPath().c_str(), &st), 0) << node.ShmPath() << " left behind";
  EXPECT_EQ(client->Get("on-stopped-node").code(), ErrorCode::OBJECT_NOT_FOUND);
}

}  // namespace
}  // namespace granary::it
