#include "common/metrics.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace granary {
namespace {

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(MetricsTest, CounterRender) {
  MetricsRegistry r;
  Counter* c = r.AddCounter("granary_puts_total", "Objects put.");
  c->Inc();
  c->Inc(4);
  EXPECT_EQ(c->Value(), 5u);
  EXPECT_EQ(r.RenderPrometheus(),
            "# HELP granary_puts_total Objects put.\n"
            "# TYPE granary_puts_total counter\n"
            "granary_puts_total 5\n");
}

TEST(MetricsTest, SeriesOfOneNameShareOneHelpAndTypeBlock) {
  MetricsRegistry r;
  Gauge* a = r.AddGauge("granary_segment_bytes", "Bytes in use.", {{"segment", "a"}});
  r.AddCounter("granary_gets_total", "Gets.")->Inc(2);
  Gauge* b =
      r.AddGauge("granary_segment_bytes", "Bytes in use.", {{"segment", "b"}, {"node", "n1"}});
  a->Set(1.5);
  b->Set(1024);
  b->Add(-24);
  EXPECT_DOUBLE_EQ(b->Value(), 1000);
  EXPECT_EQ(r.RenderPrometheus(),
            "# HELP granary_segment_bytes Bytes in use.\n"
            "# TYPE granary_segment_bytes gauge\n"
            "granary_segment_bytes{segment=\"a\"} 1.5\n"
            "granary_segment_bytes{segment=\"b\",node=\"n1\"} 1000\n"
            "# HELP granary_gets_total Gets.\n"
            "# TYPE granary_gets_total counter\n"
            "granary_gets_total 2\n");
}

TEST(MetricsTest, SameNameAndLabelsReturnsSameMetric) {
  MetricsRegistry r;
  Counter* a = r.AddCounter("x_total", "x", {{"k", "v"}});
  Counter* b = r.AddCounter("x_total", "x", {{"k", "v"}});
  Counter* c = r.AddCounter("x_total", "x", {{"k", "w"}});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  Histogram* h1 = r.AddHistogram("h", "h", {1, 2});
  EXPECT_EQ(h1, r.AddHistogram("h", "h", {1, 2}));
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  MetricsRegistry r;
  r.AddGauge("g", "line one\nback\\slash \"quoted\"", {{"key", "a\\b\"c\nd"}})->Set(1);
  EXPECT_EQ(r.RenderPrometheus(),
            "# HELP g line one\\nback\\\\slash \"quoted\"\n"
            "# TYPE g gauge\n"
            "g{key=\"a\\\\b\\\"c\\nd\"} 1\n");
}

TEST(MetricsTest, SpecialFloatValues) {
  MetricsRegistry r;
  r.AddGauge("g", "g", {{"v", "nan"}})->Set(std::numeric_limits<double>::quiet_NaN());
  r.AddGauge("g", "g", {{"v", "inf"}})->Set(std::numeric_limits<double>::infinity());
  r.AddGauge("g", "g", {{"v", "ninf"}})->Set(-std::numeric_limits<double>::infinity());
  r.AddGauge("g", "g", {{"v", "small"}})->Set(1e-7);
  const std::string out = r.RenderPrometheus();
  EXPECT_TRUE(Contains(out, "g{v=\"nan\"} NaN\n")) << out;
  EXPECT_TRUE(Contains(out, "g{v=\"inf\"} +Inf\n")) << out;
  EXPECT_TRUE(Contains(out, "g{v=\"ninf\"} -Inf\n")) << out;
  EXPECT_TRUE(Contains(out, "g{v=\"small\"} 1e-07\n")) << out;
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithInfSumCount) {
  MetricsRegistry r;
  Histogram* h =
      r.AddHistogram("granary_get_seconds", "Get latency.", {0.001, 0.01, 0.1}, {{"op", "get"}});
  h->Observe(0.0005);
  h->Observe(0.001);  // le is inclusive
  h->Observe(0.05);
  h->Observe(3);
  h->Observe(std::nan(""));  // ignored
  EXPECT_EQ(h->Count(), 4u);
  EXPECT_DOUBLE_EQ(h->Sum(), 3.0515);
  EXPECT_EQ(h->BucketCounts(), (std::vector<uint64_t>{2, 0, 1, 1}));
  EXPECT_EQ(r.RenderPrometheus(),
            "# HELP granary_get_seconds Get latency.\n"
            "# TYPE granary_get_seconds histogram\n"
            "granary_get_seconds_bucket{op=\"get\",le=\"0.001\"} 2\n"
            "granary_get_seconds_bucket{op=\"get\",le=\"0.01\"} 2\n"
            "granary_get_seconds_bucket{op=\"get\",le=\"0.1\"} 3\n"
            "granary_get_seconds_bucket{op=\"get\",le=\"+Inf\"} 4\n"
            "granary_get_seconds_sum{op=\"get\"} 3.0515\n"
            "granary_get_seconds_count{op=\"get\"} 4\n");
}

TEST(MetricsTest, HistogramWithoutLabelsAndExplicitInf) {
  MetricsRegistry r;
  Histogram* h = r.AddHistogram("h", "h", {1, std::numeric_limits<double>::infinity()});
  EXPECT_EQ(h->bounds(), std::vector<double>{1});
  h->Observe(2);
  EXPECT_EQ(r.RenderPrometheus(),
            "# HELP h h\n# TYPE h histogram\n"
            "h_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 1\nh_sum 2\nh_count 1\n");
}

TEST(MetricsTest, ExponentialBounds) {
  EXPECT_EQ(ExponentialBounds(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
}

TEST(MetricsTest, GaugeCallbackEvaluatedAtEachRender) {
  MetricsRegistry r;
  double used = 10;
  r.AddGauge("granary_segment_used_bytes", "Used.", {{"segment", "static"}})->Set(1);
  r.AddGaugeCallback("granary_segment_used_bytes", "Used.", [&used] {
    return std::vector<std::pair<Labels, double>>{
        {{{"segment", "s1"}}, used},
        {{{"segment", "s2"}}, used * 2},
        {{{"segment", "s1"}}, 99},       // duplicate label set: dropped
        {{{"__bad", "x"}}, 1},           // invalid label name: dropped
        {{{"segment", "static"}}, 77}};  // clashes with the static series: dropped
  });
  std::string out = r.RenderPrometheus();
  EXPECT_EQ(out,
            "# HELP granary_segment_used_bytes Used.\n"
            "# TYPE granary_segment_used_bytes gauge\n"
            "granary_segment_used_bytes{segment=\"static\"} 1\n"
            "granary_segment_used_bytes{segment=\"s1\"} 10\n"
            "granary_segment_used_bytes{segment=\"s2\"} 20\n");
  used = 50;
  out = r.RenderPrometheus();
  EXPECT_TRUE(Contains(out, "granary_segment_used_bytes{segment=\"s1\"} 50\n")) << out;
}

TEST(MetricsTest, CounterCallbackRendersAsACounterBesideStaticSeries) {
  MetricsRegistry r;
  uint64_t kept_elsewhere = 3;
  r.AddCounter("granary_node_things_total", "Things.", {{"how", "static"}})->Inc(2);
  r.AddCounterCallback("granary_node_things_total", "Things.", [&kept_elsewhere] {
    return std::vector<std::pair<Labels, double>>{
        {{{"how", "owned"}}, static_cast<double>(kept_elsewhere)}};
  });
  EXPECT_EQ(r.RenderPrometheus(),
            "# HELP granary_node_things_total Things.\n"
            "# TYPE granary_node_things_total counter\n"
            "granary_node_things_total{how=\"static\"} 2\n"
            "granary_node_things_total{how=\"owned\"} 3\n");
  kept_elsewhere = 8;
  EXPECT_TRUE(Contains(r.RenderPrometheus(), "granary_node_things_total{how=\"owned\"} 8\n"));
}

TEST(MetricsTest, ThrowingCallbackDoesNotBreakScrape) {
  MetricsRegistry r;
  r.AddGaugeCallback("a", "a", []() -> std::vector<std::pair<Labels, double>> {
    throw std::runtime_error("owner gone");
  });
  r.AddCounter("b_total", "b")->Inc();
  EXPECT_TRUE(Contains(r.RenderPrometheus(), "b_total 1\n"));
}

TEST(MetricsTest, CallbackMayRegisterMetricsWithoutDeadlock) {
  MetricsRegistry r;
  r.AddGaugeCallback("a", "a", [&r] {
    r.AddCounter("late_total", "registered from inside a render");
    return std::vector<std::pair<Labels, double>>{{{}, 1}};
  });
  EXPECT_TRUE(Contains(r.RenderPrometheus(), "a 1\n"));
  EXPECT_TRUE(Contains(r.RenderPrometheus(), "late_total 0\n"));
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  MetricsRegistry r;
  Counter* c = r.AddCounter("ops_total", "ops");
  Gauge* g = r.AddGauge("level", "level");
  Histogram* h = r.AddHistogram("lat", "lat", {0.5});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c->Inc();
        g->Add(1);
        h->Observe(i % 2 == 0 ? 0.25 : 1.0);
      }
    });
  }
  // Render concurrently; every render must be well formed and _count must equal the +Inf bucket.
  for (int i = 0; i < 20; ++i) {
    const std::string out = r.RenderPrometheus();
    const auto inf = out.find("lat_bucket{le=\"+Inf\"} ");
    const auto cnt = out.find("lat_count ");
    ASSERT_NE(inf, std::string::npos);
    ASSERT_NE(cnt, std::string::npos);
    EXPECT_EQ(std::stoull(out.substr(inf + 22)), std::stoull(out.substr(cnt + 10)));
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->Value(), 40000u);
  EXPECT_DOUBLE_EQ(g->Value(), 40000);
  EXPECT_EQ(h->Count(), 40000u);
  EXPECT_EQ(h->BucketCounts(), (std::vector<uint64_t>{20000, 20000}));
}

TEST(MetricsDeathTest, MisdeclaredMetricsAbort) {
  EXPECT_DEATH(MetricsRegistry().AddCounter("granary_puts", "no suffix"), "_total");
  EXPECT_DEATH(MetricsRegistry().AddCounterCallback("granary_puts", "no suffix", [] {
    return std::vector<std::pair<Labels, double>>{};
  }), "_total");
  EXPECT_DEATH(MetricsRegistry().AddGauge("1bad", "x"), "invalid metric name");
  EXPECT_DEATH(MetricsRegistry().AddGauge("g", "x", {{"bad-label", "v"}}), "invalid label name");
  EXPECT_DEATH(MetricsRegistry().AddGauge("g", "x", {{"a", "1"}, {"a", "2"}}), "twice");
  EXPECT_DEATH(MetricsRegistry().AddHistogram("h", "x", {1}, {{"le", "1"}}), "reserved");
  EXPECT_DEATH(MetricsRegistry().AddHistogram("h", "x", {2, 1}), "ascending");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddGauge("m", "x");
        r.AddHistogram("m", "x", {1});
      },
      "two types");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddHistogram("m", "x", {1});
        r.AddGauge("m_count", "x");
      },
      "collides");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddHistogram("m", "x", {1});
        r.AddHistogram("m", "x", {2});
      },
      "different bounds");
}

// The real Prometheus parser is the judge of the format: promtool must accept a full render.
TEST(MetricsTest, PromtoolAcceptsRender) {
  const char* promtool = "/usr/bin/promtool";
  ASSERT_EQ(::access(promtool, X_OK), 0)
      << promtool << " is missing (install the prometheus package)";

  MetricsRegistry r;
  r.AddCounter("granary_puts_total", "Objects put.")->Inc(7);
  r.AddCounter("granary_errors_total", "Errors by code.", {{"code", "OBJECT_NOT_FOUND"}})->Inc();
  r.AddCounter("granary_errors_total", "Errors by code.", {{"code", "INVALID_KEY"}})->Inc(3);
  r.AddGauge("granary_connections", "Open connections.", {{"transport", "tcp"}})->Set(12);
  r.AddGauge("granary_connections", "Open connections.", {{"transport", "shm"}})->Set(3);
  r.AddGauge("granary_odd_label_values", "Escaping.", {{"path", "C:\\tmp\n\"x\""}})->Set(-0.5);
  r.AddGaugeCallback("granary_segment_used_bytes", "Bytes used per segment.", [] {
    return std::vector<std::pair<Labels, double>>{{{{"segment", "n1/0"}}, 1 << 20},
                                                  {{{"segment", "n2/0"}}, 0}};
  });
  Histogram* h = r.AddHistogram("granary_get_latency_seconds", "Get latency.",
                                ExponentialBounds(0.0001, 4, 6), {{"path", "shm"}});
  for (double v : {0.00005, 0.0003, 0.002, 0.5, 10.0}) h->Observe(v);
  r.AddHistogram("granary_put_latency_seconds", "Put latency.", {0.001, 0.01})->Observe(0.004);

  const std::string text = r.RenderPrometheus();
  const std::filesystem::path file = std::filesystem::temp_directory_path() /
                                     ("granary_metrics_" + std::to_string(::getpid()) + ".prom");
  std::ofstream(file) << text;
  const std::string cmd = std::string(promtool) + " check metrics < " + file.string() + " > " +
                          file.string() + ".out 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream out_file(file.string() + ".out");
  const std::string promtool_out((std::istreambuf_iterator<char>(out_file)),
                                 std::istreambuf_iterator<char>());
  std::filesystem::remove(file);
  std::filesystem::remove(file.string() + ".out");
  ASSERT_NE(rc, -1);
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 0) << "promtool said:\n" << promtool_out << "\non:\n" << text;
}

}  // namespace
}  // namespace granary
