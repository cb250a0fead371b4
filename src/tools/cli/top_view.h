// tools/cli/top_view.h - what `granary top` shows: a frame of text lines made from two samples.
//
// Promise: everything here is a pure function of its arguments (no clock, no I/O), so a frame
// can be tested from made-up samples. Rates are the difference of two samples' counters over the
// time between them; a counter that went down (the master restarted) counts from zero. A rate
// with nothing to divide (the first sample, no gets in the interval) is shown as "-", never as
// 0 or 100 %. Every line of a frame is at most ViewOptions::width bytes, and holds no control
// characters (names from the master are printed with '?' for them).
// Ownership: values only.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "granary/status.h"

namespace granary::top {

// Prometheus' text format, as a master's /metrics serves it: one series per line, "# " lines
// skipped. Only what top reads from it: sums of series by name and labels.
class MetricsText {
 public:
  // INVALID_PARAMS, naming the line, for a line that is not "name[{labels}] value".
  static Result<MetricsText> Parse(std::string_view text);
  // The sum of the series named `name` that carry every label of `match`; nullopt when there is
  // none (a master that does not export it).
  std::optional<double> Sum(std::string_view name,
                            const std::vector<std::pair<std::string, std::string>>& match = {}) const;

 private:
  struct Series {
    std::string name;
    std::vector<std::pair<std::string, std::string>> labels;
    double value = 0;
  };
  std::vector<Series> series_;
};

// The master's figures from /metrics; a field is empty when the master does not export it.
struct Counters {
  // Counters (granary_master_gets_total{outcome}, _get_hit_bytes_total{tier}, _puts_total,
  // _put_bytes_total, _rereplicated_bytes_total).
  std::optional<double> gets_memory, gets_disk, gets_miss;
  std::optional<double> hit_bytes_memory, hit_bytes_disk;
  std::optional<double> puts, put_bytes;
  std::optional<double> rereplicated_bytes;
  // Gauges.
  std::optional<double> objects, backlog_objects, backlog_bytes, copies_in_flight;
};
Counters CountersFrom(const MetricsText& metrics);

// One segment as ListSegments reports it.
struct SegmentRow {
  std::string name;
  uint64_t capacity = 0;
  uint64_t used = 0;
  uint64_t objects = 0;  // replicas it holds
  bool draining = false;
  uint64_t drain_objects = 0;  // still to copy elsewhere
  uint64_t drain_bytes = 0;
};

// What one look at the master found.
struct Sample {
  double at_s = 0;           // a monotonic clock, in seconds: only differences matter
  std::string clock;         // wall time for the header, e.g. "01:02:03 UTC"
  std::string master;        // the address asked
  std::string role;          // "" without HA; else e.g. "leader m1, term 3"
  std::string error;         // not empty: the master did not answer, nothing below is valid
  std::vector<SegmentRow> segments;
  std::optional<Counters> counters;  // empty: /metrics could not be read
  std::string metrics_error;         // why not
};

// Per second over the interval between two samples, and fractions of the gets in it.
struct Rates {
  std::optional<double> gets, puts;
  std::optional<double> hit, memory, disk, miss;  // fractions 0..1 of the interval's gets
  std::optional<double> read_bytes, write_bytes, rereplicated_bytes;
};
// Empty fields where either sample lacks the counter, or at_s did not advance.
Rates RatesBetween(const Sample& before, const Sample& now);

struct ViewOptions {
  double interval_s = 2;
  size_t width = 80;
  size_t max_rows = 0;  // segment rows at most (the rest summed up in one line); 0: all
};

// The frame for `now`; `before` is the previous sample (null for the first one).
std::vector<std::string> RenderFrame(const Sample* before, const Sample& now,
                                     const ViewOptions& options);

// Helpers the frame is made of, exposed for tests.
// `s` cut to `width` bytes (never in the middle of a UTF-8 sequence), control characters as '?'.
std::string FitLine(std::string_view s, size_t width);
// A name that fits `width`: kept whole if it does, else its head and tail around a '~'.
std::string ShortName(std::string_view name, size_t width);
// "12.3/s", "1.2k/s", "-" for none.
std::string FormatRate(std::optional<double> per_s);
// "97.5%", "-" for none.
std::string FormatPercent(std::optional<double> fraction);
// "1.5 GiB/s", "-" for none.
std::string FormatBytesRate(std::optional<double> bytes_per_s);

}  // namespace granary::top
