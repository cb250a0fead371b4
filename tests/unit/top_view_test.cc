// granary top's frames (src/tools/cli/top_view.h): rates from two samples, the hit rate with no
// gets, lines within 80 columns whatever the names, draining rows, the /metrics parser.
#include "tools/cli/top_view.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace granary::top {
namespace {

Counters Figures(double memory, double disk, double miss, double puts = 0) {
  Counters c;
  c.gets_memory = memory;
  c.gets_disk = disk;
  c.gets_miss = miss;
  c.hit_bytes_memory = memory * 1024;
  c.hit_bytes_disk = disk * 1024;
  c.puts = puts;
  c.put_bytes = puts * 4096;
  c.rereplicated_bytes = 0;
  c.objects = 7;
  c.backlog_objects = 3;
  c.backlog_bytes = 3 << 20;
  c.copies_in_flight = 2;
  return c;
}

Sample At(double t, Counters c) {
  Sample s;
  s.at_s = t;
  s.clock = "01:02:03 UTC";
  s.master = "127.0.0.1:50051";
  s.counters = c;
  s.segments.push_back({"node-a", 4ull << 30, 1ull << 30, 120, false, 0, 0});
  return s;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  return all;
}

void ExpectWithin(const std::vector<std::string>& lines, size_t width) {
  for (const auto& l : lines) {
    EXPECT_LE(l.size(), width) << "line: '" << l << "'";
    for (char c : l) EXPECT_GE(static_cast<unsigned char>(c), 0x20) << "control char in: " << l;
  }
}

TEST(TopViewTest, RatesComeFromTheDifferenceOfTwoSamples) {
  const Sample before = At(10, Figures(100, 0, 10, 5));
  const Sample now = At(12, Figures(180, 10, 20, 25));  // 2 s later: 100 gets, 20 puts
  const Rates r = RatesBetween(before, now);
  ASSERT_TRUE(r.gets && r.hit && r.memory && r.disk && r.miss && r.puts);
  EXPECT_DOUBLE_EQ(*r.gets, 50);
  EXPECT_DOUBLE_EQ(*r.hit, 0.9);
  EXPECT_DOUBLE_EQ(*r.memory, 0.8);
  EXPECT_DOUBLE_EQ(*r.disk, 0.1);
  EXPECT_DOUBLE_EQ(*r.miss, 0.1);
  EXPECT_DOUBLE_EQ(*r.puts, 10);
  EXPECT_DOUBLE_EQ(*r.read_bytes, 90 * 1024 / 2.0);
  EXPECT_DOUBLE_EQ(*r.write_bytes, 20 * 4096 / 2.0);
  EXPECT_DOUBLE_EQ(*r.rereplicated_bytes, 0);

  const std::string frame = Joined(RenderFrame(&before, now, {}));
  EXPECT_NE(frame.find("gets 50.0/s  hit 90.0% (memory 80.0%, disk 10.0%, miss 10.0%)"),
            std::string::npos) << frame;
  EXPECT_NE(frame.find("puts 10.0/s  read 45 KiB/s  write 40 KiB/s"), std::string::npos) << frame;
  EXPECT_NE(frame.find("backlog 3 objects (3 MiB), copies in flight 2"), std::string::npos)
      << frame;
  // Since the master started: 190 hits of 210 gets.
  EXPECT_NE(frame.find("since start 90.5%"), std::string::npos) << frame;
}

TEST(TopViewTest, TheFirstSampleHasNoRates) {
  const std::string frame = Joined(RenderFrame(nullptr, At(1, Figures(9, 0, 1)), {}));
  EXPECT_NE(frame.find("gets -  hit - (memory -, disk -, miss -)  since start 90.0%"),
            std::string::npos) << frame;
  EXPECT_NE(frame.find("puts -  read -  write -"), std::string::npos) << frame;
}

TEST(TopViewTest, NoGetsInTheIntervalIsNoHitRateNotZero) {
  const Sample before = At(0, Figures(0, 0, 0));
  const Sample now = At(2, Figures(0, 0, 0));
  const Rates r = RatesBetween(before, now);
  ASSERT_TRUE(r.gets);
  EXPECT_DOUBLE_EQ(*r.gets, 0);
  EXPECT_FALSE(r.hit);
  EXPECT_FALSE(r.miss);
  const std::string frame = Joined(RenderFrame(&before, now, {}));
  EXPECT_NE(frame.find("gets 0.0/s  hit - (memory -, disk -, miss -)  since start -"),
            std::string::npos) << frame;
}

TEST(TopViewTest, ACounterThatWentDownCountsFromZero) {
  // The master restarted between the samples: its counters start again.
  const Rates r = RatesBetween(At(0, Figures(1000, 0, 0)), At(2, Figures(30, 0, 10)));
  ASSERT_TRUE(r.gets);
  EXPECT_DOUBLE_EQ(*r.gets, 20);
  EXPECT_DOUBLE_EQ(*r.miss, 0.25);
}

TEST(TopViewTest, NoRatesWithoutTimeOrCounters) {
  EXPECT_FALSE(RatesBetween(At(5, Figures(1, 0, 0)), At(5, Figures(2, 0, 0))).gets);
  Sample no_metrics = At(7, Figures(2, 0, 0));
  no_metrics.counters.reset();
  no_metrics.metrics_error = "http://127.0.0.1:9003/metrics: Connection";
  EXPECT_FALSE(RatesBetween(At(5, Figures(1, 0, 0)), no_metrics).gets);
  const std::string frame = Joined(RenderFrame(nullptr, no_metrics, {}));
  EXPECT_NE(frame.find("objects -"), std::string::npos) << frame;
  EXPECT_NE(frame.find("no counters: http://127.0.0.1:9003/metrics"), std::string::npos) << frame;
  EXPECT_NE(frame.find("node-a"), std::string::npos) << frame;  // segments come from gRPC
}

TEST(TopViewTest, EveryLineFitsWithLongNames) {
  Sample before = At(0, Figures(0, 0, 0));
  Sample now = At(2, Figures(123456789, 98765432, 1234567, 99999999));
  now.master = "etcd://" + std::string(120, 'm') + ":2379";
  now.role = "leader " + std::string(90, 'r') + ", term 12345";
  now.segments.clear();
  const std::string long_name = "rack-17-host-" + std::string(150, 'x') + "-node-0042";
  now.segments.push_back({long_name, 1ull << 50, 1ull << 49, 1ull << 40, true, 1ull << 40,
                          1ull << 50});
  now.segments.push_back({"node-\x1b[2J-evil", 1ull << 30, 0, 0, false, 0, 0});
  for (size_t width : {80u, 60u, 40u}) {
    ViewOptions options;
    options.width = width;
    const auto lines = RenderFrame(&before, now, options);
    ExpectWithin(lines, width);
  }
  const std::string frame = Joined(RenderFrame(&before, now, {}));
  // The long name keeps its head and its tail.
  EXPECT_NE(frame.find("rack-17-ho~x-node-0042"), std::string::npos) << frame;
  EXPECT_EQ(frame.find('\x1b'), std::string::npos);
  EXPECT_NE(frame.find("node-?[2J-evil"), std::string::npos) << frame;
  EXPECT_NE(frame.find("01:02:03 UTC"), std::string::npos) << frame;  // the clock stays

  Sample down = now;
  down.error = "RPC_FAIL (-900): " + std::string(200, 'e');
  ExpectWithin(RenderFrame(&now, down, {}), 80);
}

TEST(TopViewTest, DrainingRowsSayWhatIsLeft) {
  Sample now = At(0, Figures(0, 0, 0));
  now.segments.push_back({"node-b", 2ull << 30, 1ull << 30, 50, true, 12, 24ull << 20});
  now.segments.push_back({"node-c", 2ull << 30, 0, 0, true, 1234567, 1ull << 45});
  const auto lines = RenderFrame(nullptr, now, {});
  ExpectWithin(lines, 80);
  std::string a, b, c;
  for (const auto& l : lines) {
    if (l.rfind("node-a", 0) == 0) a = l;
    if (l.rfind("node-b", 0) == 0) b = l;
    if (l.rfind("node-c", 0) == 0) c = l;
  }
  EXPECT_NE(a.find("1 GiB"), std::string::npos) << a;
  EXPECT_NE(a.find("4 GiB"), std::string::npos) << a;
  EXPECT_NE(a.find("25.0%"), std::string::npos) << a;
  EXPECT_NE(a.find(" 120  ok"), std::string::npos) << a;
  EXPECT_NE(b.find("50.0%"), std::string::npos) << b;
  EXPECT_NE(b.find("       50  draining 12"), std::string::npos) << b;
  EXPECT_NE(c.find("draining 1234567"), std::string::npos) << c;
  const std::string frame = Joined(lines);
  EXPECT_NE(frame.find("segments 3 (2 draining, 32 TiB left to copy)"), std::string::npos)
      << frame;
  EXPECT_NE(frame.find("memory 2 GiB used of 8 GiB (25.0%)"), std::string::npos) << frame;
}

TEST(TopViewTest, RowsBeyondTheScreenAreCounted) {
  Sample now = At(0, Figures(0, 0, 0));
  for (int i = 0; i < 9; ++i) now.segments.push_back({"n" + std::to_string(i), 1, 0, 0});
  ViewOptions options;
  options.max_rows = 4;
  const std::string frame = Joined(RenderFrame(nullptr, now, options));
  EXPECT_NE(frame.find("n1 "), std::string::npos) << frame;
  EXPECT_EQ(frame.find("n3 "), std::string::npos) << frame;
  EXPECT_NE(frame.find("... and 7 more segments"), std::string::npos) << frame;
}

TEST(TopViewTest, AFailedSampleShowsTheError) {
  Sample down;
  down.master = "127.0.0.1:1";
  down.clock = "01:02:03 UTC";
  down.error = "RPC_FAIL (-900): connection refused";
  const auto lines = RenderFrame(nullptr, down, {});
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[1], "error: RPC_FAIL (-900): connection refused");
  EXPECT_FALSE(RatesBetween(down, At(2, Figures(1, 0, 0))).gets);
}

TEST(TopViewTest, FitLineAndShortName) {
  EXPECT_EQ(FitLine("abcdef", 4), "abcd");
  EXPECT_EQ(FitLine("ab\tc", 10), "ab?c");
  EXPECT_EQ(FitLine("ab\xc3\xa9", 3), "ab");  // never half an é
  EXPECT_EQ(FitLine("ab\xc3\xa9", 4), "ab\xc3\xa9");
  EXPECT_EQ(ShortName("short", 22), "short");
  const std::string s = ShortName("abcdefghijklmnopqrstuvwxyz", 10);
  EXPECT_EQ(s, "abcd~vwxyz");
  EXPECT_EQ(s.size(), 10u);
}

TEST(TopViewTest, FormatsRatesAndPercents) {
  EXPECT_EQ(FormatRate(std::nullopt), "-");
  EXPECT_EQ(FormatRate(12.34), "12.3/s");
  EXPECT_EQ(FormatRate(12345), "12.3k/s");
  EXPECT_EQ(FormatRate(2.5e6), "2.5M/s");
  EXPECT_EQ(FormatPercent(0.975), "97.5%");
  EXPECT_EQ(FormatPercent(std::nullopt), "-");
  EXPECT_EQ(FormatBytesRate(1536), "1.5 KiB/s");
}

TEST(TopViewTest, ParsesTheMastersMetrics) {
  auto m = MetricsText::Parse(
      "# HELP granary_master_gets_total keys answered\n"
      "# TYPE granary_master_gets_total counter\n"
      "granary_master_gets_total{outcome=\"memory_hit\"} 40\n"
      "granary_master_gets_total{outcome=\"disk_hit\"} 2\n"
      "granary_master_gets_total{outcome=\"miss\"} 8 1700000000000\n"
      "granary_master_get_hit_bytes_total{tier=\"memory\",x=\"a \\\"q\\\" }\"} 4096\n"
      "granary_master_objects 12\n"
      "granary_master_rereplication_backlog_bytes 1.5e3\r\n"
      "\n");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->Sum("granary_master_gets_total"), 50);
  EXPECT_EQ(m->Sum("granary_master_gets_total", {{"outcome", "miss"}}), 8);
  EXPECT_EQ(m->Sum("granary_master_get_hit_bytes_total", {{"x", "a \"q\" }"}}), 4096);
  EXPECT_FALSE(m->Sum("granary_master_gets_total", {{"outcome", "other"}}));
  EXPECT_FALSE(m->Sum("granary_master_puts_total"));
  const Counters c = CountersFrom(*m);
  EXPECT_EQ(c.gets_memory, 40);
  EXPECT_EQ(c.gets_disk, 2);
  EXPECT_EQ(c.hit_bytes_memory, 4096);
  EXPECT_FALSE(c.hit_bytes_disk);
  EXPECT_EQ(c.objects, 12);
  EXPECT_EQ(c.backlog_bytes, 1500);
  EXPECT_FALSE(c.puts);  // a master without the counter: "-", not 0

  auto bad = MetricsText::Parse("granary_master_objects 1\ngranary_master_objects{x=\"y} 2\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(MetricsText::Parse("granary_master_objects twelve\n").ok());
}

}  // namespace
}  // namespace granary::top
