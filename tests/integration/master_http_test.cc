// Integration tests of the master's HTTP side (/health, /status, /metrics) and of its
// configuration surface (flags, YAML file, --help, validation), all through the real binary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "master_fixture.h"

namespace granary::it {
namespace {

constexpr const char* kPromtool = "/usr/bin/promtool";

class MasterHttpTest : public MasterTest {};

// Runs granary-master with `args` to completion (10 s at most); its output in *log.
std::optional<ExitStatus> RunMaster(const TempDir& dir, const std::string& name,
                                    const std::vector<std::string>& args, std::string* log) {
  std::string error;
  const std::string log_path = dir.File(name + ".log");
  auto status = RunCommand(BinaryPath("granary-master"), args, log_path, Millis(10'000), &error);
  *log = ReadFile(log_path);
  if (!status) ADD_FAILURE() << error << "\n" << *log;
  return status;
}

// The value of the sample `name{labels}` in a Prometheus text body; nullopt if absent.
std::optional<double> Sample(const std::string& body, const std::string& series) {
  std::istringstream lines(body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::strtod(line.c_str() + series.size() + 1, nullptr);
  }
  return std::nullopt;
}

TEST_F(MasterHttpTest, HealthAnswers200AndUnknownPaths404) {
  ASSERT_TRUE(StartMaster());
  auto health = HttpGet(master_.http_port(), "/health");
  ASSERT_EQ(health.status, 200) << health.error;
  EXPECT_EQ(health.body, "OK\n");
  auto missing = HttpGet(master_.http_port(), "/no-such-page");
  EXPECT_EQ(missing.status, 404) << missing.error;
}

TEST_F(MasterHttpTest, StatusJsonMatchesWhatTheTestDid) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB, "10.0.0.1:1").code(), code::kOk);
  ASSERT_EQ(Client("node-b").Mount("seg-b", 2 * MiB, "10.0.0.2:1").code(), code::kOk);
  MasterClient w = Client("client-w");
  ASSERT_EQ(w.Put("x", 64 * KiB), code::kOk);
  ASSERT_EQ(w.Put("y", 64 * KiB, 0, Replicas(2)), code::kOk);
  ASSERT_EQ(w.PutStartOne("z", 64 * KiB).code(), code::kOk);  // in flight

  auto resp = HttpGet(master_.http_port(), "/status");
  ASSERT_EQ(resp.status, 200) << resp.error;
  EXPECT_NE(resp.content_type.find("application/json"), std::string::npos) << resp.content_type;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(resp.body);
  } catch (const std::exception& e) {
    FAIL() << "/status is not JSON: " << e.what() << "\n" << resp.body;
  }
  SCOPED_TRACE(resp.body);
  EXPECT_EQ(doc.at("capacity_bytes").get<uint64_t>(), 3 * MiB);
  EXPECT_EQ(doc.at("used_bytes").get<uint64_t>(), 4 * 64 * KiB) << "x, y twice, z";
  EXPECT_EQ(doc.at("objects").get<uint64_t>(), 2u);
  EXPECT_EQ(doc.at("pending_puts").get<uint64_t>(), 1u);
  EXPECT_GE(doc.at("clients").get<uint64_t>(), 2u);
  EXPECT_EQ(doc.at("view_version").get<uint64_t>(), w.ListSegments().view_version());

  const auto& segments = doc.at("segments");
  ASSERT_TRUE(segments.is_array());
  ASSERT_EQ(segments.size(), 2u);
  std::map<std::string, pb::SegmentInfo> listed;
  const pb::ListSegmentsResponse list = w.ListSegments();
  for (const auto& s : list.segments()) listed[s.name()] = s;
  uint64_t used = 0, replicas = 0;
  for (const auto& s : segments) {
    const std::string name = s.at("name").get<std::string>();
    ASSERT_TRUE(listed.count(name)) << name;
    const pb::SegmentInfo& info = listed[name];
    EXPECT_EQ(s.at("id").get<uint64_t>(), info.segment_id());
    EXPECT_EQ(s.at("node_id").get<std::string>(), name == "seg-a" ? "node-a" : "node-b");
    EXPECT_EQ(s.at("endpoint").get<std::string>(), info.endpoint());
    EXPECT_EQ(s.at("capacity_bytes").get<uint64_t>(), name == "seg-a" ? 1 * MiB : 2 * MiB);
    EXPECT_EQ(s.at("used_bytes").get<uint64_t>(), info.used_bytes());
    EXPECT_EQ(s.at("free_bytes").get<uint64_t>(), info.free_bytes());
    EXPECT_EQ(s.at("used_bytes").get<uint64_t>() + s.at("free_bytes").get<uint64_t>(),
              s.at("capacity_bytes").get<uint64_t>());
    EXPECT_EQ(s.at("largest_free_block").get<uint64_t>(), info.largest_free_block());
    EXPECT_TRUE(s.at("fragmentation").is_number());
    used += s.at("used_bytes").get<uint64_t>();
    replicas += s.at("replicas").get<uint64_t>();
  }
  EXPECT_EQ(used, 4 * 64 * KiB);
  EXPECT_EQ(replicas, 4u);

  // The document follows the state: end the put, remove an object.
  ASSERT_EQ(w.PutEndOne("z", 1), code::kOk);
  ASSERT_EQ(w.RemoveOne("x"), code::kOk);
  auto after = nlohmann::json::parse(HttpGet(master_.http_port(), "/status").body, nullptr, false);
  ASSERT_FALSE(after.is_discarded());
  EXPECT_EQ(after.value("objects", uint64_t{99}), 2u);
  EXPECT_EQ(after.value("pending_puts", uint64_t{99}), 0u);
  EXPECT_EQ(after.value("used_bytes", uint64_t{0}), 3 * 64 * KiB);
}

TEST_F(MasterHttpTest, MetricsPassPromtoolAndDescribeEachSegment) {
  ASSERT_TRUE(StartMaster());
  MasterClient node = Client("node-a");
  ASSERT_EQ(node.Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient w = Client("client-w");
  for (int i = 0; i < 4; ++i) ASSERT_EQ(w.Put("m" + std::to_string(i), 64 * KiB), code::kOk);
  ASSERT_EQ(w.RemoveOne("m1"), code::kOk);  // a hole: some fragmentation
  ASSERT_EQ(w.GetOne("nope").code(), code::kObjectNotFound);

  auto resp = HttpGet(master_.http_port(), "/metrics");
  ASSERT_EQ(resp.status, 200) << resp.error;
  EXPECT_NE(resp.content_type.find("text/plain"), std::string::npos) << resp.content_type;

  ASSERT_EQ(::access(kPromtool, X_OK), 0)
      << kPromtool << " is missing: install prometheus (Debian package) to run this test";
  const std::string file = master_.dir().WriteFile("metrics.txt", resp.body);
  std::string error;
  const std::string promtool_log = master_.dir().File("promtool.log");
  auto checked =
      RunCommand(kPromtool, {"check", "metrics"}, promtool_log, Millis(20'000), &error, file);
  ASSERT_TRUE(checked.has_value()) << error;
  EXPECT_TRUE(checked->Succeeded()) << "promtool check metrics " << checked->ToString() << ":\n"
                                    << ReadFile(promtool_log) << "\n--- body ---\n"
                                    << resp.body;

  pb::SegmentInfo seg;
  ASSERT_TRUE(node.FindSegment("seg-a", &seg));
  auto free = Sample(resp.body, "granary_segment_free_bytes{segment=\"seg-a\"}");
  ASSERT_TRUE(free.has_value()) << resp.body;
  EXPECT_EQ(*free, static_cast<double>(seg.free_bytes()));
  auto largest = Sample(resp.body, "granary_segment_largest_free_block_bytes{segment=\"seg-a\"}");
  ASSERT_TRUE(largest.has_value()) << resp.body;
  EXPECT_EQ(*largest, static_cast<double>(seg.largest_free_block()));
  auto frag = Sample(resp.body, "granary_segment_fragmentation_ratio{segment=\"seg-a\"}");
  ASSERT_TRUE(frag.has_value()) << resp.body;
  const double expected_frag =
      1.0 - static_cast<double>(seg.largest_free_block()) / static_cast<double>(seg.free_bytes());
  EXPECT_NEAR(*frag, expected_frag, 1e-9);
  EXPECT_GT(*frag, 0.0) << "a 64 KiB hole before the tail is fragmentation";
  EXPECT_LT(*frag, 1.0);
  auto objects = Sample(resp.body, "granary_master_objects");
  ASSERT_TRUE(objects.has_value());
  EXPECT_EQ(*objects, 3.0);
  auto puts = Sample(resp.body, "granary_master_rpc_total{method=\"BatchPutStart\"}");
  ASSERT_TRUE(puts.has_value()) << resp.body;
  EXPECT_GE(*puts, 4.0);
}

TEST_F(MasterHttpTest, UnknownFlagExitsNonZeroNamingIt) {
  TempDir dir;
  std::string log;
  auto status = RunMaster(dir, "unknown-flag",
                          {"--port", std::to_string(PickFreePort()), "--http-port",
                           std::to_string(PickFreePort()), "--bogus-setting", "1"},
                          &log);
  ASSERT_TRUE(status.has_value());
  EXPECT_FALSE(status->Succeeded()) << status->ToString();
  EXPECT_TRUE(status->exited) << "crashed instead of exiting: " << status->ToString();
  EXPECT_NE(log.find("bogus-setting"), std::string::npos) << log;
}

TEST_F(MasterHttpTest, InvalidValueExitsNonZeroNamingTheSetting) {
  TempDir dir;
  std::string log;
  auto status = RunMaster(dir, "bad-value",
                          {"--port", std::to_string(PickFreePort()), "--http-port",
                           std::to_string(PickFreePort()), "--lease-ttl", "abc"},
                          &log);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->exited && status->code != 0) << status->ToString();
  EXPECT_NE(log.find("lease_ttl"), std::string::npos) << log;
  EXPECT_NE(log.find("abc"), std::string::npos) << log;

  auto out_of_range = RunMaster(dir, "bad-watermark", {"--eviction-high-watermark", "1.5"}, &log);
  ASSERT_TRUE(out_of_range.has_value());
  EXPECT_TRUE(out_of_range->exited && out_of_range->code != 0) << out_of_range->ToString();
  EXPECT_NE(log.find("eviction_high_watermark"), std::string::npos) << log;
}

TEST_F(MasterHttpTest, UnknownYamlKeyExitsNonZeroNamingIt) {
  TempDir dir;
  const std::string config = dir.WriteFile("master.yaml", "lease_ttl: 5s\nbogus_key: 7\n");
  std::string log;
  auto status = RunMaster(dir, "unknown-key",
                          {"--port", std::to_string(PickFreePort()), "--http-port",
                           std::to_string(PickFreePort()), "--config", config},
                          &log);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->exited && status->code != 0) << status->ToString();
  EXPECT_NE(log.find("bogus_key"), std::string::npos) << log;

  const std::string bad_value = dir.WriteFile("bad-value.yaml", "client_ttl: forever\n");
  status = RunMaster(dir, "bad-yaml-value", {"--config", bad_value}, &log);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->exited && status->code != 0) << status->ToString();
  EXPECT_NE(log.find("client_ttl"), std::string::npos) << log;
}

TEST_F(MasterHttpTest, InconsistentTimeoutsAreRefused) {
  TempDir dir;
  std::string log;
  auto status = RunMaster(dir, "timeouts",
                          {"--put-discard-timeout", "10s", "--put-release-timeout", "1s"}, &log);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->exited && status->code != 0) << status->ToString();
  EXPECT_NE(log.find("put_release_timeout"), std::string::npos) << log;
}

TEST_F(MasterHttpTest, HelpExitsZeroAndListsTheFlags) {
  TempDir dir;
  std::string log;
  auto status = RunMaster(dir, "help", {"--help"}, &log);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->Succeeded()) << status->ToString() << "\n" << log;
  for (const char* flag : {"--port", "--http-port", "--config", "--lease-ttl", "--client-ttl"}) {
    EXPECT_NE(log.find(flag), std::string::npos) << flag << " missing from --help:\n" << log;
  }
}

TEST_F(MasterHttpTest, FlagsOverrideTheYamlFileWhichOverridesDefaults) {
  const uint16_t yaml_http_port = PickFreePort();
  // http_port is set by both (the fixture passes --http-port); lease_ttl by the file only.
  const std::string config = master_.dir().WriteFile(
      "master.yaml", "http_port: " + std::to_string(yaml_http_port) + "\nlease-ttl: 700ms\n");
  ASSERT_TRUE(StartMaster({"--config", config}));
  ASSERT_NE(master_.http_port(), yaml_http_port);
  EXPECT_EQ(HttpGet(master_.http_port(), "/health").status, 200) << "the flag's port";
  auto yaml_port = HttpGet(yaml_http_port, "/health", Millis(1000));
  EXPECT_EQ(yaml_port.status, 0) << "the file's port answered although a flag overrode it";

  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient w = Client("client-w");
  ASSERT_EQ(w.Put("k", 64), code::kOk);
  auto got = w.Get({"k"});
  EXPECT_EQ(got.lease_ttl_ms(), 700u) << "the file's lease_ttl was not applied";
}

TEST_F(MasterHttpTest, APortAlreadyInUseMakesASecondMasterFail) {
  ASSERT_TRUE(StartMaster());
  TempDir dir;
  std::string log;
  auto grpc_taken = RunMaster(dir, "grpc-taken",
                              {"--host", "127.0.0.1", "--port", std::to_string(master_.grpc_port()),
                               "--http-port", std::to_string(PickFreePort())},
                              &log);
  ASSERT_TRUE(grpc_taken.has_value());
  EXPECT_TRUE(grpc_taken->exited && grpc_taken->code != 0) << grpc_taken->ToString() << "\n" << log;

  auto http_taken = RunMaster(dir, "http-taken",
                              {"--host", "127.0.0.1", "--port", std::to_string(PickFreePort()),
                               "--http-port", std::to_string(master_.http_port())},
                              &log);
  ASSERT_TRUE(http_taken.has_value());
  EXPECT_TRUE(http_taken->exited && http_taken->code != 0) << http_taken->ToString() << "\n" << log;
  // The first master is unharmed.
  ExpectServing();
}

}  // namespace
}  // namespace granary::it
