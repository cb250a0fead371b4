// common/metrics.h - counters, gauges and histograms rendered in the Prometheus text format 0.0.4.
//
// Promise: series of one name with different labels share one HELP/TYPE block; label values and
// help are escaped. Declaring a metric wrongly (bad name, a counter not ending in _total, one name
// with two types) is a programming error and aborts at the Add* call, so it shows on the first run
// rather than as a scrape that Prometheus rejects.
//
// Ownership: a MetricsRegistry owns every metric it hands out; the pointers stay valid for the
// registry's life, so hot paths keep a Counter* and never look names up again.
// Thread safety: updates (Inc, Set, Add, Observe) are lock-free relaxed atomics, callable from any
// thread. Add* and RenderPrometheus take the registry mutex and may also be called from any thread;
// a render sees each value atomically but not all values at one instant (a sample, not a snapshot).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace granary {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Content-Type of RenderPrometheus() output, for the /metrics handler.
inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Monotonic count (requests, bytes, errors). Never decreases, so rates survive restarts of scrapes.
class Counter {
 public:
  void Inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down (bytes in use, connections open).
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double d) { value_.fetch_add(d, std::memory_order_relaxed); }  // CAS loop, no lock
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Distribution over fixed upper bounds (given ascending at creation; +Inf is implied).
// Each bucket counts only its own observations; Render makes them cumulative and derives _count
// from the same numbers, so _count always equals the +Inf bucket even during concurrent Observe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);  // NaN is ignored: it would poison _sum forever
  uint64_t Count() const;
  double Sum() const { return sum_.load(std::memory_order_relaxed); }
  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket (non-cumulative) counts; the last entry is the +Inf overflow bucket.
  std::vector<uint64_t> BucketCounts() const;

 private:
  const std::vector<double> bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1 entries
  std::atomic<double> sum_{0.0};
};

// count bounds start, start*factor, start*factor^2, ... (e.g. latency buckets 0.0001 s x 2 x 20).
std::vector<double> ExponentialBounds(double start, double factor, int count);

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // name matches [a-zA-Z_:][a-zA-Z0-9_:]*; label names [a-zA-Z_][a-zA-Z0-9_]*, not "__*", not
  // repeated, and not "le" on histograms. Label values are free text (escaped on render).
  // Adding the same name and labels again returns the existing metric (help is kept from the
  // first call), so two components may share a series without coordinating.
  Counter* AddCounter(std::string name, std::string help, Labels labels = {});  // name *_total
  Gauge* AddGauge(std::string name, std::string help, Labels labels = {});
  Histogram* AddHistogram(std::string name, std::string help, std::vector<double> bounds,
                          Labels labels = {});

  // A gauge family whose series are produced by fn at each render (values owned by someone
  // else, e.g. per-segment usage). fn runs on the rendering thread without the registry mutex
  // held, so it may take its owner's locks; it must stay callable for the registry's life.
  // A name may have several callbacks and static gauges; a label set seen twice in one render
  // keeps its first value. Series with invalid label names are dropped.
  void AddGaugeCallback(std::string name, std::string help,
                        std::function<std::vector<std::pair<Labels, double>>()> fn);
  // The same for a counter family (name *_total) whose counts someone else keeps (e.g. a
  // component's own atomics): fn must return values that never decrease for a label set.
  void AddCounterCallback(std::string name, std::string help,
                          std::function<std::vector<std::pair<Labels, double>>()> fn);

  std::string RenderPrometheus() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family;  // one metric name: help, type, its series and callbacks
  // Finds or creates the family under mu_; aborts on a bad name or a clash of types.
  Family* GetFamily(const std::string& name, const std::string& help, Type type);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Family>> families_;  // in registration order, which Render keeps
};

}  // namespace granary
