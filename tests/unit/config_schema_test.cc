#include "common/config_schema.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace granary {
namespace {

namespace fs = std::filesystem;

// The settings of a typical Granary process, with their defaults.
struct Config {
  std::string host = "0.0.0.0";
  uint16_t port = 50051;
  uint64_t shards = 1024;
  uint64_t segment_size = 4ULL << 30;
  int64_t lease_ttl_ms = 5000;
  double high_watermark = 0.95;
  bool standalone = false;
};

class ConfigSchemaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("granary_config_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    schema_.AddString("host", &cfg_.host, "address to listen on");
    schema_.AddPort("port", &cfg_.port, "RPC port");
    schema_.AddUint("shards", &cfg_.shards, "metadata shards", 1, 65536);
    schema_.AddSize("segment_size", &cfg_.segment_size, "DRAM segment size");
    schema_.AddDurationMs("lease_ttl", &cfg_.lease_ttl_ms, "read lease TTL");
    schema_.AddDouble("high_watermark", &cfg_.high_watermark, "eviction starts above", 0.0, 1.0);
    schema_.AddBool("standalone", &cfg_.standalone, "run master and node in one process");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string WriteYaml(const std::string& text, const std::string& file = "granary.yaml") {
    const fs::path p = dir_ / file;
    std::ofstream(p) << text;
    return p.string();
  }

  Status Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "/usr/bin/granary-test");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    return schema_.Parse(static_cast<int>(argv.size()), argv.data());
  }

  // Parse must fail with INVALID_PARAMS, naming every fragment, and leave the defaults alone.
  void ExpectError(std::vector<std::string> args, std::vector<std::string> fragments) {
    const Config before = cfg_;
    Status st = Parse(std::move(args));
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), ErrorCode::INVALID_PARAMS);
    for (const auto& f : fragments) {
      EXPECT_NE(st.message().find(f), std::string::npos)
          << "missing '" << f << "' in: " << st.message();
    }
    EXPECT_EQ(cfg_.host, before.host);
    EXPECT_EQ(cfg_.port, before.port);
    EXPECT_EQ(cfg_.shards, before.shards);
    EXPECT_EQ(cfg_.segment_size, before.segment_size);
    EXPECT_EQ(cfg_.lease_ttl_ms, before.lease_ttl_ms);
    EXPECT_EQ(cfg_.high_watermark, before.high_watermark);
    EXPECT_EQ(cfg_.standalone, before.standalone);
  }

  fs::path dir_;
  Config cfg_;
  ConfigSchema schema_{"test program"};
};

TEST_F(ConfigSchemaTest, NoArgumentsKeepsDefaults) {
  ASSERT_TRUE(Parse({}).ok());
  EXPECT_FALSE(schema_.help_requested());
  EXPECT_EQ(cfg_.port, 50051);
  EXPECT_EQ(cfg_.segment_size, 4ULL << 30);
  EXPECT_EQ(cfg_.lease_ttl_ms, 5000);
}

TEST_F(ConfigSchemaTest, FlagsOfEveryType) {
  Status st = Parse({"--host", "127.0.0.1", "--port=7000", "--shards", "64", "--segment-size",
                     "512MB", "--lease-ttl", "1.5s", "--high-watermark", "0.8", "--standalone"});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(cfg_.host, "127.0.0.1");
  EXPECT_EQ(cfg_.port, 7000);
  EXPECT_EQ(cfg_.shards, 64u);
  EXPECT_EQ(cfg_.segment_size, 512ULL << 20);
  EXPECT_EQ(cfg_.lease_ttl_ms, 1500);
  EXPECT_DOUBLE_EQ(cfg_.high_watermark, 0.8);
  EXPECT_TRUE(cfg_.standalone);
}

TEST_F(ConfigSchemaTest, BoolFlagForms) {
  cfg_.standalone = true;
  ASSERT_TRUE(Parse({"--standalone=false"}).ok());
  EXPECT_FALSE(cfg_.standalone);
  ConfigSchema other("other");
  bool flag = false;
  uint16_t port = 1;
  other.AddBool("verbose", &flag, "chatty");
  other.AddPort("port", &port, "port");
  const char* argv[] = {"prog", "--verbose", "true", "--port", "2"};
  ASSERT_TRUE(other.Parse(5, argv).ok());
  EXPECT_TRUE(flag);
  EXPECT_EQ(port, 2);
  const char* argv2[] = {"prog", "--verbose", "off"};
  ConfigSchema third("third");
  bool flag2 = true;
  third.AddBool("verbose", &flag2, "chatty");
  ASSERT_TRUE(third.Parse(3, argv2).ok());
  EXPECT_FALSE(flag2);
}

TEST_F(ConfigSchemaTest, LastRepeatedFlagWins) {
  ASSERT_TRUE(Parse({"--port", "1", "--port", "2"}).ok());
  EXPECT_EQ(cfg_.port, 2);
}

TEST_F(ConfigSchemaTest, YamlFileSetsValues) {
  const std::string path = WriteYaml(
      "host: 10.0.0.1\n"
      "port: 6000\n"
      "segment-size: 1GiB\n"  // '-' accepted for '_'
      "lease_ttl: 30\n"       // bare number: seconds
      "high_watermark: 0.5\n"
      "standalone: yes\n"
      "shards: 16\n");
  Status st = Parse({"--config", path});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(cfg_.host, "10.0.0.1");
  EXPECT_EQ(cfg_.port, 6000);
  EXPECT_EQ(cfg_.segment_size, 1ULL << 30);
  EXPECT_EQ(cfg_.lease_ttl_ms, 30000);
  EXPECT_DOUBLE_EQ(cfg_.high_watermark, 0.5);
  EXPECT_TRUE(cfg_.standalone);
  EXPECT_EQ(cfg_.shards, 16u);
}

TEST_F(ConfigSchemaTest, YamlIntegerSizeIsBytes) {
  ASSERT_TRUE(Parse({"--config", WriteYaml("segment_size: 1048576\n")}).ok());
  EXPECT_EQ(cfg_.segment_size, 1048576u);
}

TEST_F(ConfigSchemaTest, FlagsOverrideYamlRegardlessOfOrder) {
  const std::string path = WriteYaml("port: 6000\nhost: 10.0.0.1\nstandalone: true\n");
  ASSERT_TRUE(Parse({"--port", "7000", "--config", path, "--standalone=false"}).ok());
  EXPECT_EQ(cfg_.port, 7000);        // flag beats file even when given before --config
  EXPECT_EQ(cfg_.host, "10.0.0.1");  // file beats default
  EXPECT_FALSE(cfg_.standalone);
  EXPECT_EQ(cfg_.shards, 1024u);  // untouched default
}

TEST_F(ConfigSchemaTest, EmptyYamlFileIsAllDefaults) {
  ASSERT_TRUE(Parse({"--config", WriteYaml("# nothing set\n")}).ok());
  EXPECT_EQ(cfg_.port, 50051);
}

TEST_F(ConfigSchemaTest, DescribeListsEffectiveValues) {
  const std::string path = WriteYaml("port: 6000\n");
  ASSERT_TRUE(Parse({"--config", path, "--lease-ttl", "30m"}).ok());
  const std::string d = schema_.Describe();
  EXPECT_NE(d.find("config=" + path + "\n"), std::string::npos) << d;
  EXPECT_NE(d.find("host=0.0.0.0\n"), std::string::npos) << d;
  EXPECT_NE(d.find("port=6000\n"), std::string::npos) << d;
  EXPECT_NE(d.find("shards=1024\n"), std::string::npos) << d;
  EXPECT_NE(d.find("segment_size=4 GiB\n"), std::string::npos) << d;
  EXPECT_NE(d.find("lease_ttl=30m\n"), std::string::npos) << d;
  EXPECT_NE(d.find("high_watermark=0.95\n"), std::string::npos) << d;
  EXPECT_NE(d.find("standalone=false\n"), std::string::npos) << d;
  EXPECT_LT(d.find("host="), d.find("port="));  // declaration order
}

TEST_F(ConfigSchemaTest, DescribeShowsBytesWhenUnitFormIsInexact) {
  ASSERT_TRUE(Parse({"--segment-size", "1428745175"}).ok());
  EXPECT_NE(schema_.Describe().find("segment_size=1428745175 (1.33 GiB)\n"), std::string::npos);
}

TEST_F(ConfigSchemaTest, HelpPrintsEverySettingWithDefaultAndChangesNothing) {
  testing::internal::CaptureStdout();
  Status st = Parse({"--port", "1", "--help"});
  const std::string out = testing::internal::GetCapturedStdout();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(schema_.help_requested());
  EXPECT_EQ(cfg_.port, 50051);
  for (const char* f : {"--config", "--host", "--port", "--shards", "--segment-size", "--lease-ttl",
                        "--high-watermark", "--standalone", "test program"}) {
    EXPECT_NE(out.find(f), std::string::npos) << f << " missing from:\n" << out;
  }
  EXPECT_NE(out.find("[default: 4 GiB]"), std::string::npos) << out;
  EXPECT_NE(out.find("[default: 5s]"), std::string::npos) << out;
  EXPECT_NE(out.find("[default: 50051]"), std::string::npos) << out;
}

TEST_F(ConfigSchemaTest, ShortHelpFlag) {
  testing::internal::CaptureStdout();
  ASSERT_TRUE(Parse({"-h"}).ok());
  EXPECT_NE(testing::internal::GetCapturedStdout().find("--segment-size"), std::string::npos);
  EXPECT_TRUE(schema_.help_requested());
}

// --- every error names the setting, the bad value and what is expected ---

TEST_F(ConfigSchemaTest, UnknownFlag) { ExpectError({"--bogus", "1"}, {"--bogus", "--help"}); }

TEST_F(ConfigSchemaTest, UnderscoreFlagIsUnknown) {
  ExpectError({"--segment_size", "1G"}, {"--segment_size"});
}

TEST_F(ConfigSchemaTest, PositionalArgumentRejected) { ExpectError({"stray"}, {"stray"}); }

TEST_F(ConfigSchemaTest, FlagMissingValue) { ExpectError({"--port"}, {"--port"}); }

TEST_F(ConfigSchemaTest, FlagBadPort) {
  ExpectError({"--port", "70000"}, {"\"port\"", "--port", "\"70000\"", "out of range", "65535"});
  ExpectError({"--port", "http"}, {"\"port\"", "\"http\"", "[0, 65535]"});
  ExpectError({"--port=-1"}, {"\"port\"", "\"-1\""});
}

TEST_F(ConfigSchemaTest, FlagUintOutOfRange) {
  ExpectError({"--shards", "0"}, {"\"shards\"", "\"0\"", "out of range", "[1, 65536]"});
  ExpectError({"--shards", "99999999999999999999999"}, {"\"shards\"", "out of range"});
  ExpectError({"--shards", "12abc"}, {"\"shards\"", "\"12abc\"", "integer"});
}

TEST_F(ConfigSchemaTest, FlagBadSizeUsesSizeParser) {
  ExpectError({"--segment-size", "4 gallons"},
              {"\"segment_size\"", "--segment-size", "\"4 gallons\"", "unknown unit", "GiB"});
  ExpectError({"--segment-size=-1G"}, {"\"segment_size\"", "negative"});
}

TEST_F(ConfigSchemaTest, FlagBadDuration) {
  ExpectError({"--lease-ttl", "250us"}, {"\"lease_ttl\"", "\"250us\"", "millisecond"});
  ExpectError({"--lease-ttl", "forever"}, {"\"lease_ttl\"", "duration"});
}

TEST_F(ConfigSchemaTest, FlagBadDouble) {
  ExpectError({"--high-watermark", "1.5"},
              {"\"high_watermark\"", "\"1.5\"", "out of range", "[0, 1]"});
  ExpectError({"--high-watermark", "nan"}, {"\"high_watermark\"", "\"nan\""});
  ExpectError({"--high-watermark", "0.5x"}, {"\"high_watermark\"", "\"0.5x\""});
}

TEST_F(ConfigSchemaTest, FlagBadBool) {
  ExpectError({"--standalone", "maybe"}, {"\"standalone\"", "\"maybe\"", "true/false"});
}

TEST_F(ConfigSchemaTest, YamlUnknownKey) {
  const std::string path = WriteYaml("port: 1\nprot: 2\n");
  ExpectError({"--config", path}, {path, "line 2", "unknown setting \"prot\"", "port"});
}

TEST_F(ConfigSchemaTest, YamlWrongTypes) {
  ExpectError({"--config", WriteYaml("port: [1, 2]\n")}, {"\"port\"", "a list", "port number"});
  ExpectError({"--config", WriteYaml("host:\n  a: b\n")}, {"\"host\"", "a mapping"});
  ExpectError({"--config", WriteYaml("shards:\n")}, {"\"shards\"", "no value"});
  ExpectError({"--config", WriteYaml("standalone: perhaps\n")},
              {"\"standalone\"", "\"perhaps\"", "boolean"});
  ExpectError({"--config", WriteYaml("shards: 3.5\n")}, {"\"shards\"", "\"3.5\"", "integer"});
}

TEST_F(ConfigSchemaTest, YamlOutOfRangeNamesFileAndLine) {
  const std::string path = WriteYaml("host: a\n\nhigh_watermark: 2\n");
  ExpectError({"--config", path},
              {"\"high_watermark\"", path, "line 3", "\"2\"", "out of range", "[0, 1]"});
}

TEST_F(ConfigSchemaTest, YamlBadSizeAndDuration) {
  ExpectError({"--config", WriteYaml("segment_size: -5\n")}, {"\"segment_size\"", "negative"});
  ExpectError({"--config", WriteYaml("lease_ttl: 1.5ms\n")}, {"\"lease_ttl\"", "\"1.5ms\""});
}

TEST_F(ConfigSchemaTest, YamlSameSettingTwice) {
  ExpectError({"--config", WriteYaml("segment_size: 1G\nsegment-size: 2G\n")},
              {"\"segment_size\"", "twice"});
}

TEST_F(ConfigSchemaTest, YamlNotAMapping) {
  ExpectError({"--config", WriteYaml("- port\n- host\n")}, {"top-level mapping", "a list"});
  ExpectError({"--config", WriteYaml("just a string\n")}, {"top-level mapping"});
}

TEST_F(ConfigSchemaTest, MalformedYaml) {
  const std::string path = WriteYaml("port: [1, 2\nhost: x\n");
  ExpectError({"--config", path}, {path, "malformed YAML"});
}

TEST_F(ConfigSchemaTest, UnreadableConfigFile) {
  const std::string missing = (dir_ / "missing.yaml").string();
  ExpectError({"--config", missing}, {missing, "cannot open"});
  ExpectError({"--config", dir_.string()}, {dir_.string(), "directory"});
}

TEST_F(ConfigSchemaTest, BadFlagStillFailsWhenYamlIsGood) {
  const std::string path = WriteYaml("port: 6000\n");
  ExpectError({"--config", path, "--shards", "0"}, {"\"shards\"", "flag --shards"});
  EXPECT_EQ(cfg_.port, 50051);  // nothing from the file applied either
}

TEST(ConfigSchemaDeathTest, DuplicateOrBadNamesAbort) {
  uint64_t a = 0;
  EXPECT_DEATH(
      {
        ConfigSchema s("x");
        s.AddUint("size", &a, "", 0, 1);
        s.AddSize("size", &a, "");
      },
      "declared twice");
  EXPECT_DEATH(
      {
        ConfigSchema s("x");
        s.AddSize("Bad-Name", &a, "");
      },
      "snake_case");
  EXPECT_DEATH(
      {
        ConfigSchema s("x");
        s.AddSize("config", &a, "");
      },
      "reserved");
}

}  // namespace
}  // namespace granary
