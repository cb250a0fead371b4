// The node's HTTP endpoint end to end (issue 22): a real granary-node started with --http-port
// serves /metrics, /health and /status; the data-plane counters move with real puts and gets
// over TCP, promtool accepts the page, and a bad --http-port is refused with a clear message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../tools/test_pattern.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

constexpr const char* kPromtool = "/usr/bin/promtool";

// The value of the sample `series` (name and labels, exactly as rendered); nullopt if absent.
std::optional<double> Sample(const std::string& body, const std::string& series) {
  std::istringstream lines(body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) == 0) {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return std::nullopt;
}

// promtool (the Prometheus project's own checker) accepts the page: format and naming.
void ExpectPromtoolAccepts(const TempDir& dir, const std::string& page) {
  ASSERT_EQ(::access(kPromtool, X_OK), 0)
      << kPromtool << " is missing: install prometheus (Debian package) to run this test";
  const std::string file = dir.WriteFile("node-metrics.txt", page);
  std::string error;
  const std::string promtool_log = dir.File("promtool.log");
  auto checked =
      RunCommand(kPromtool, {"check", "metrics"}, promtool_log, Millis(20'000), &error, file);
  ASSERT_TRUE(checked.has_value()) << error;
  EXPECT_TRUE(checked->Succeeded()) << "promtool check metrics " << checked->ToString() << ":\n"
                                    << ReadFile(promtool_log);
}

double SampleOr0(const std::string& body, const std::string& series) {
  return Sample(body, series).value_or(0.0);
}

TEST(NodeHttpTest, MetricsHealthAndStatusFollowRealTraffic) {
  StoreCluster cluster;
  ASSERT_TRUE(cluster.Start(0, 0));
  TempDir dir("granary-it-nodehttp");
  const uint16_t http_port = PickFreePort();
  const uint64_t segment_size = 32 * MiB;
  NodeProcess node(UniqueName("nodehttp"), segment_size, dir.path());
  ASSERT_TRUE(node.Start(cluster.master_address(), {"--http-port", std::to_string(http_port)}));
  ASSERT_TRUE(cluster.WaitForSegments(
      [&](const auto& names) { return std::count(names.begin(), names.end(), node.name()) == 1; },
      Millis(5000)));
  // The master lists the segment once the mount is applied; the node learns it from the answer.
  ASSERT_TRUE(WaitUntil([&] { return HttpGet(http_port, "/health").status == 200; },
                        Millis(5000)))
      << node.Log();
  EXPECT_EQ(HttpGet(http_port, "/health").body, "ok\n");
  EXPECT_EQ(HttpGet(http_port, "/no-such-page").status, 404);

  const HttpResult before = HttpGet(http_port, "/metrics");
  ASSERT_EQ(before.status, 200) << before.error;

  // Real traffic over TCP: the client maps no shared memory, so every byte crosses the node's
  // data server.
  auto client = cluster.MakeClient(/*use_shared_memory=*/false);
  ASSERT_NE(client, nullptr);
  constexpr int kObjects = 3;
  const uint64_t object_bytes = 256 * KiB;
  for (int i = 0; i < kObjects; ++i) {
    const auto value = testdata::Pattern("nodehttp" + std::to_string(i), object_bytes);
    Status put = client->Put("nodehttp" + std::to_string(i), ByteSpan(value.data(), value.size()));
    ASSERT_TRUE(put.ok()) << put.ToString() << "\n" << node.Log();
  }
  for (int i = 0; i < kObjects; ++i) {
    auto got = client->Get("nodehttp" + std::to_string(i));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->size(), object_bytes);
  }

  // A READ is counted once its last byte is sent, which the client may see a moment earlier.
  HttpResult after;
  ASSERT_TRUE(WaitUntil(
      [&] {
        after = HttpGet(http_port, "/metrics");
        return SampleOr0(after.body, "granary_node_request_seconds_count{op=\"read\"}") -
                   SampleOr0(before.body, "granary_node_request_seconds_count{op=\"read\"}") >=
               kObjects;
      },
      Millis(5000)))
      << after.body;
  ASSERT_EQ(after.status, 200) << after.error;
  EXPECT_NE(after.content_type.find("text/plain"), std::string::npos) << after.content_type;
  const std::string& body = after.body;
  SCOPED_TRACE(body);
  auto moved = [&](const std::string& series) {
    return SampleOr0(body, series) - SampleOr0(before.body, series);
  };
  EXPECT_GE(moved("granary_node_requests_total{op=\"write\"}"), kObjects);
  EXPECT_GE(moved("granary_node_requests_total{op=\"read\"}"), kObjects);
  EXPECT_GE(moved("granary_node_bytes_total{op=\"write\"}"), kObjects * object_bytes);
  EXPECT_GE(moved("granary_node_bytes_total{op=\"read\"}"), kObjects * object_bytes);
  EXPECT_GE(moved("granary_node_request_seconds_count{op=\"read\"}"), kObjects);
  EXPECT_GE(moved("granary_node_request_seconds_count{op=\"write\"}"), kObjects);
  EXPECT_GE(SampleOr0(body, "granary_node_connections_total"), 1.0);
  ASSERT_TRUE(Sample(body, "granary_node_connections").has_value());
  ASSERT_TRUE(Sample(body, "granary_node_request_errors_total{reason=\"bad_frame\"}").has_value());
  EXPECT_EQ(SampleOr0(body, "granary_node_segment_capacity_bytes"),
            static_cast<double>(segment_size));
  EXPECT_EQ(SampleOr0(body, "granary_node_up"), 1.0);
  EXPECT_FALSE(Sample(body, "granary_node_disk_used_bytes").has_value()) << "no disk tier";

  ExpectPromtoolAccepts(dir, body);

  const HttpResult status = HttpGet(http_port, "/status");
  ASSERT_EQ(status.status, 200) << status.error;
  EXPECT_NE(status.content_type.find("application/json"), std::string::npos);
  const auto doc = nlohmann::json::parse(status.body, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << status.body;
  EXPECT_FALSE(doc.value("node_id", std::string()).empty()) << status.body;
  EXPECT_EQ(doc.value("master", std::string()), cluster.master_address());
  EXPECT_TRUE(doc.value("mounted", false));
  EXPECT_NE(node.Log().find(doc.value("endpoint", std::string("?"))), std::string::npos)
      << "the endpoint in the ready line";
  ASSERT_TRUE(doc.contains("segment")) << status.body;
  EXPECT_EQ(doc["segment"].value("name", std::string()), node.name());
  EXPECT_EQ(doc["segment"].value("size_bytes", uint64_t{0}), segment_size);
  EXPECT_GE(doc["data_plane"].value("requests", uint64_t{0}), 2u * kObjects);
  EXPECT_TRUE(doc.contains("disk") && doc["disk"].is_null());

  // Stopping: the endpoint goes away with the node (SIGTERM unmounts, then exits).
  ASSERT_TRUE(node.Kill(SIGTERM));
  auto exited = node.Wait(Millis(10'000));
  ASSERT_TRUE(exited.has_value());
  EXPECT_TRUE(exited->Succeeded()) << exited->ToString() << "\n" << node.Log();
  EXPECT_NE(HttpGet(http_port, "/health", Millis(1000)).status, 200);
}

TEST(NodeHttpTest, DiskTierFiguresAppearWithADiskTier) {
  StoreCluster cluster;
  ASSERT_TRUE(cluster.Start(0, 0));
  TempDir dir("granary-it-nodehttp-disk");
  const uint16_t http_port = PickFreePort();
  NodeProcess node(UniqueName("nodehttpd"), 16 * MiB, dir.path());
  std::filesystem::create_directories(dir.File("disk"));
  ASSERT_TRUE(node.Start(cluster.master_address(),
                         {"--http-port", std::to_string(http_port), "--disk-dir",
                          dir.File("disk"), "--disk-size", "64MiB"}));
  const HttpResult page = HttpGet(http_port, "/metrics");
  ASSERT_EQ(page.status, 200) << page.error << "\n" << node.Log();
  SCOPED_TRACE(page.body);
  EXPECT_EQ(SampleOr0(page.body, "granary_node_disk_capacity_bytes"),
            static_cast<double>(64 * MiB));
  for (const char* series :
       {"granary_node_disk_used_bytes", "granary_node_disk_objects",
        "granary_node_offloaded_objects_total", "granary_node_offloaded_bytes_total",
        "granary_node_promoted_objects_total", "granary_node_disk_evicted_objects_total"}) {
    EXPECT_TRUE(Sample(page.body, series).has_value()) << series;
  }
  ExpectPromtoolAccepts(dir, page.body);  // the disk tier's and staging's series too
  const auto doc = nlohmann::json::parse(HttpGet(http_port, "/status").body, nullptr, false);
  ASSERT_FALSE(doc.is_discarded());
  ASSERT_TRUE(doc.contains("disk") && doc["disk"].is_object());
  EXPECT_EQ(doc["disk"].value("capacity_bytes", uint64_t{0}), 64 * MiB);
}

TEST(NodeHttpTest, BadHttpPortIsRefusedClearly) {
  TempDir dir("granary-it-nodehttp-bad");
  for (const char* bad : {"abc", "70000", "65536", "80x"}) {
    SCOPED_TRACE(bad);
    std::string error;
    const std::string log = dir.File("bad.log");
    auto status = RunCommand(BinaryPath("granary-node"),
                             {"--master", "127.0.0.1:1", "--segment-size", "1MiB", "--http-port",
                              bad},
                             log, Millis(10'000), &error);
    ASSERT_TRUE(status.has_value()) << error;
    EXPECT_TRUE(status->exited && status->code == 2) << status->ToString();
    const std::string out = ReadFile(log);
    EXPECT_NE(out.find("--http-port"), std::string::npos) << out;
    EXPECT_NE(out.find(bad), std::string::npos) << out;
  }
}

TEST(NodeHttpTest, HttpPortTakenFailsTheStart) {
  StoreCluster cluster;
  ASSERT_TRUE(cluster.Start(0, 0));
  TempDir dir("granary-it-nodehttp-taken");
  std::string error;
  const std::string log = dir.File("taken.log");
  // The master's own HTTP port is taken by definition.
  auto status = RunCommand(BinaryPath("granary-node"),
                           {"--master", cluster.master_address(), "--segment-size", "1MiB",
                            "--prefault=false", "--http-port",
                            std::to_string(cluster.master().http_port())},
                           log, Millis(10'000), &error);
  ASSERT_TRUE(status.has_value()) << error;
  EXPECT_FALSE(status->Succeeded()) << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("HTTP server cannot listen"), std::string::npos) << ReadFile(log);
}

}  // namespace
}  // namespace granary::it
