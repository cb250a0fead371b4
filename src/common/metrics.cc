#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

namespace granary {

namespace {

[[noreturn]] void Fatal(const std::string& msg) {
  std::fprintf(stderr, "MetricsRegistry: %s\n", msg.c_str());
  std::abort();
}

bool ValidMetricName(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool ValidLabelName(std::string_view n) {
  if (n.empty() || n.substr(0, 2) == "__") return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// Empty string when the label set is usable on a series of this kind, else why not.
std::string CheckLabels(const Labels& labels, bool histogram) {
  std::set<std::string_view> names;
  for (const auto& [name, value] : labels) {
    if (!ValidLabelName(name)) return "invalid label name \"" + name + "\"";
    if (histogram && name == "le") return "label \"le\" is reserved for histogram buckets";
    if (!names.insert(name).second) return "label \"" + name + "\" given twice";
  }
  return "";
}

// Prometheus floats: Go's spelling of the specials, otherwise the shortest exact decimal.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, ec == std::errc() ? end : buf);
}

void AppendEscaped(std::string* out, std::string_view s, bool quote) {
  for (char c : s) {
    if (c == '\\') {
      *out += "\\\\";
    } else if (c == '\n') {
      *out += "\\n";
    } else if (quote && c == '"') {
      *out += "\\\"";
    } else {
      *out += c;
    }
  }
}

// `a="x",b="y"` (no braces), so histogram buckets can append their le label.
std::string LabelText(const Labels& labels) {
  std::string out;
  for (const auto& [name, value] : labels) {
    if (!out.empty()) out += ',';
    out += name;
    out += "=\"";
    AppendEscaped(&out, value, /*quote=*/true);
    out += '"';
  }
  return out;
}

void AppendSample(std::string* out, std::string_view name, std::string_view labels,
                  std::string_view value) {
  *out += name;
  if (!labels.empty()) {
    *out += '{';
    *out += labels;
    *out += '}';
  }
  *out += ' ';
  *out += value;
  *out += '\n';
}

std::vector<double> CheckedBounds(std::vector<double> bounds) {
  if (!bounds.empty() && std::isinf(bounds.back()) && bounds.back() > 0) bounds.pop_back();
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) Fatal("histogram bounds must be finite");
    if (i > 0 && !(bounds[i - 1] < bounds[i])) Fatal("histogram bounds must be strictly ascending");
  }
  return bounds;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(CheckedBounds(std::move(bounds))),
      buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  // First bound >= v: Prometheus buckets are "less than or equal" (le).
  const size_t i =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

uint64_t Histogram::Count() const {
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) total += buckets_[i].load(std::memory_order_relaxed);
  return total;
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

std::vector<double> ExponentialBounds(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

using GaugeCallback = std::function<std::vector<std::pair<Labels, double>>()>;

struct MetricsRegistry::Family {
  struct Series {
    Labels labels;
    std::string label_text;  // rendered once: labels never change after creation
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  std::string name;
  std::string help;
  Type type = Type::kGauge;
  std::vector<std::unique_ptr<Series>> series;  // unique_ptr: addresses survive vector growth
  std::vector<std::shared_ptr<const GaugeCallback>> callbacks;

  Series* Find(const Labels& labels) const {
    for (const auto& s : series) {
      if (s->labels == labels) return s.get();
    }
    return nullptr;
  }
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry::Family* MetricsRegistry::GetFamily(const std::string& name,
                                                    const std::string& help, Type type) {
  if (!ValidMetricName(name)) Fatal("invalid metric name \"" + name + "\"");
  if (type == Type::kCounter && (name.size() < 6 || name.substr(name.size() - 6) != "_total")) {
    Fatal("counter \"" + name + "\" must be named *_total");
  }
  for (const auto& f : families_) {
    if (f->name == name) {
      if (f->type != type) Fatal("metric \"" + name + "\" registered with two types");
      return f.get();
    }
    // A histogram's derived series names must not collide with another family in the scrape.
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if ((f->type == Type::kHistogram && name == f->name + suffix) ||
          (type == Type::kHistogram && f->name == name + suffix)) {
        Fatal("metric \"" + name + "\" collides with histogram series of \"" + f->name + "\"");
      }
    }
  }
  auto f = std::make_unique<Family>();
  f->name = name;
  f->help = help;
  f->type = type;
  families_.push_back(std::move(f));
  return families_.back().get();
}

Counter* MetricsRegistry::AddCounter(std::string name, std::string help, Labels labels) {
  if (std::string why = CheckLabels(labels, false); !why.empty()) Fatal(name + ": " + why);
  std::lock_guard<std::mutex> lock(mu_);
  Family* f = GetFamily(name, help, Type::kCounter);
  if (Family::Series* s = f->Find(labels)) return s->counter.get();
  auto s = std::make_unique<Family::Series>();
  s->label_text = LabelText(labels);
  s->labels = std::move(labels);
  s->counter = std::make_unique<Counter>();
  f->series.push_back(std::move(s));
  return f->series.back()->counter.get();
}

Gauge* MetricsRegistry::AddGauge(std::string name, std::string help, Labels labels) {
  if (std::string why = CheckLabels(labels, false); !why.empty()) Fatal(name + ": " + why);
  std::lock_guard<std::mutex> lock(mu_);
  Family* f = GetFamily(name, help, Type::kGauge);
  if (Family::Series* s = f->Find(labels)) return s->gauge.get();
  auto s = std::make_unique<Family::Series>();
  s->label_text = LabelText(labels);
  s->labels = std::move(labels);
  s->gauge = std::make_unique<Gauge>();
  f->series.push_back(std::move(s));
  return f->series.back()->gauge.get();
}

Histogram* MetricsRegistry::AddHistogram(std::string name, std::string help,
                                         std::vector<double> bounds, Labels labels) {
  if (std::string why = CheckLabels(labels, true); !why.empty()) Fatal(name + ": " + why);
  auto h = std::make_unique<Histogram>(std::move(bounds));
  std::lock_guard<std::mutex> lock(mu_);
  Family* f = GetFamily(name, help, Type::kHistogram);
  if (Family::Series* s = f->Find(labels)) {
    if (s->histogram->bounds() != h->bounds()) {
      Fatal("histogram \"" + name + "\" re-registered with different bounds");
    }
    return s->histogram.get();
  }
  auto s = std::make_unique<Family::Series>();
  s->label_text = LabelText(labels);
  s->labels = std::move(labels);
  s->histogram = std::move(h);
  f->series.push_back(std::move(s));
  return f->series.back()->histogram.get();
}

void MetricsRegistry::AddGaugeCallback(std::string name, std::string help, GaugeCallback fn) {
  auto shared = std::make_shared<const GaugeCallback>(std::move(fn));
  std::lock_guard<std::mutex> lock(mu_);
  GetFamily(name, help, Type::kGauge)->callbacks.push_back(std::move(shared));
}

void MetricsRegistry::AddCounterCallback(std::string name, std::string help, GaugeCallback fn) {
  auto shared = std::make_shared<const GaugeCallback>(std::move(fn));
  std::lock_guard<std::mutex> lock(mu_);
  GetFamily(name, help, Type::kCounter)->callbacks.push_back(std::move(shared));
}

std::string MetricsRegistry::RenderPrometheus() const {
  // Copy the structure under the lock, then read values and run callbacks without it: callbacks
  // take their owners' locks, and those owners may be registering metrics at the same moment.
  struct View {
    const Family* family;  // name, help and type never change; series are read via `series`
    std::vector<const Family::Series*> series;
    std::vector<std::shared_ptr<const GaugeCallback>> callbacks;
  };
  std::vector<View> views;
  {
    std::lock_guard<std::mutex> lock(mu_);
    views.reserve(families_.size());
    for (const auto& f : families_) {
      View v{f.get(), {}, f->callbacks};
      for (const auto& s : f->series) v.series.push_back(s.get());
      views.push_back(std::move(v));
    }
  }

  std::string out;
  for (const View& v : views) {
    const Family& f = *v.family;
    out += "# HELP ";
    out += f.name;
    out += ' ';
    AppendEscaped(&out, f.help, /*quote=*/false);
    out += "\n# TYPE ";
    out += f.name;
    out += f.type == Type::kCounter ? " counter\n"
           : f.type == Type::kGauge ? " gauge\n"
                                    : " histogram\n";
    std::set<std::string> seen;  // label sets already written in this family
    for (const Family::Series* s : v.series) {
      seen.insert(s->label_text);
      if (s->counter) {
        AppendSample(&out, f.name, s->label_text, std::to_string(s->counter->Value()));
      } else if (s->gauge) {
        AppendSample(&out, f.name, s->label_text, FormatValue(s->gauge->Value()));
      } else if (s->histogram) {
        const Histogram& h = *s->histogram;
        const std::vector<uint64_t> counts = h.BucketCounts();
        const std::string bucket = f.name + "_bucket";
        const std::string sep = s->label_text.empty() ? "" : ",";
        uint64_t cumulative = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
          cumulative += counts[i];
          const std::string le = i < h.bounds().size() ? FormatValue(h.bounds()[i]) : "+Inf";
          AppendSample(&out, bucket, s->label_text + sep + "le=\"" + le + "\"",
                       std::to_string(cumulative));
        }
        AppendSample(&out, f.name + "_sum", s->label_text, FormatValue(h.Sum()));
        AppendSample(&out, f.name + "_count", s->label_text, std::to_string(cumulative));
      }
    }
    for (const auto& cb : v.callbacks) {
      std::vector<std::pair<Labels, double>> samples;
      try {
        samples = (*cb)();
      } catch (...) {
        continue;  // one broken owner must not take the whole scrape down
      }
      for (const auto& [labels, value] : samples) {
        if (!CheckLabels(labels, false).empty()) continue;
        std::string text = LabelText(labels);
        if (!seen.insert(text).second) continue;
        AppendSample(&out, f.name, text, FormatValue(value));
      }
    }
  }
  return out;
}

}  // namespace granary
