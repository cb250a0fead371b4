#include "tools/cli/top_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/units.h"

namespace granary::top {

namespace {

std::string Printf(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == ':';
}

// Parses `{a="x",b="y"}` at text[*pos] (which is '{'), leaving *pos after the '}'.
bool ParseLabels(std::string_view text, size_t* pos,
                 std::vector<std::pair<std::string, std::string>>* labels) {
  size_t i = *pos + 1;
  while (true) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',')) ++i;
    if (i >= text.size()) return false;
    if (text[i] == '}') break;
    const size_t name_start = i;
    while (i < text.size() && IsNameChar(text[i])) ++i;
    std::string name(text.substr(name_start, i - name_start));
    if (name.empty() || i + 1 >= text.size() || text[i] != '=' || text[i + 1] != '"') return false;
    i += 2;
    std::string value;
    while (i < text.size() && text[i] != '"') {
      if (text[i] == '\\' && i + 1 < text.size()) {
        ++i;
        value += text[i] == 'n' ? '\n' : text[i];
      } else {
        value += text[i];
      }
      ++i;
    }
    if (i >= text.size()) return false;
    ++i;  // the closing quote
    labels->emplace_back(std::move(name), std::move(value));
  }
  *pos = i + 1;
  return true;
}

// The counter's increase from `before` to `now`; a counter that went down restarted from zero.
std::optional<double> Increase(const std::optional<double>& before,
                               const std::optional<double>& now) {
  if (!before || !now) return std::nullopt;
  return *now >= *before ? *now - *before : *now;
}

std::optional<double> PerSecond(std::optional<double> increase, double seconds) {
  if (!increase || seconds <= 0) return std::nullopt;
  return *increase / seconds;
}

std::optional<double> Add(const std::optional<double>& a, const std::optional<double>& b) {
  if (!a || !b) return std::nullopt;
  return *a + *b;
}

std::optional<double> Fraction(std::optional<double> part, std::optional<double> whole) {
  if (!part || !whole || *whole <= 0) return std::nullopt;
  return *part / *whole;
}

std::string Count(std::optional<double> v) {
  return v ? Printf("%.0f", std::max(0.0, *v)) : "-";
}

std::string Size(std::optional<double> bytes) {
  return bytes ? FormatSize(static_cast<uint64_t>(std::max(0.0, *bytes))) : "-";
}

// "left ... right" in `width` columns; the left side gives way when both do not fit.
std::string Spread(const std::string& left, const std::string& right, size_t width) {
  if (left.size() + 2 + right.size() > width) {
    if (right.size() + 2 >= width) return FitLine(left, width);
    return FitLine(left, width - right.size() - 2) + "  " + right;
  }
  return left + std::string(width - left.size() - right.size(), ' ') + right;
}

constexpr size_t kNameWidth = 22;
std::string StateOf(const SegmentRow& s) {
  return s.draining ? "draining " + std::to_string(s.drain_objects) : "ok";
}

std::string SegmentLine(const std::string& name, const std::string& used,
                        const std::string& capacity, const std::string& percent,
                        const std::string& objects, const std::string& state) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-*s %11s %11s %6s %8s  %s", static_cast<int>(kNameWidth),
                name.c_str(), used.c_str(), capacity.c_str(), percent.c_str(), objects.c_str(),
                state.c_str());
  return buf;
}

}  // namespace

Result<MetricsText> MetricsText::Parse(std::string_view text) {
  MetricsText out;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    Series series;
    size_t i = 0;
    while (i < line.size() && IsNameChar(line[i])) ++i;
    series.name = std::string(line.substr(0, i));
    bool ok = !series.name.empty();
    if (ok && i < line.size() && line[i] == '{') ok = ParseLabels(line, &i, &series.labels);
    if (ok) {
      while (i < line.size() && line[i] == ' ') ++i;
      const std::string value(line.substr(i, line.find(' ', i) - i));  // a timestamp may follow
      char* parsed_end = nullptr;
      series.value = std::strtod(value.c_str(), &parsed_end);
      ok = !value.empty() && parsed_end == value.c_str() + value.size();
    }
    if (!ok) {
      return Status(ErrorCode::INVALID_PARAMS,
                    "metrics line " + std::to_string(line_no) + " is not 'name{labels} value': " +
                        FitLine(line, 80));
    }
    out.series_.push_back(std::move(series));
  }
  return out;
}

std::optional<double> MetricsText::Sum(
    std::string_view name, const std::vector<std::pair<std::string, std::string>>& match) const {
  std::optional<double> sum;
  for (const Series& s : series_) {
    if (s.name != name) continue;
    const bool all = std::all_of(match.begin(), match.end(), [&](const auto& want) {
      return std::find(s.labels.begin(), s.labels.end(), want) != s.labels.end();
    });
    if (all) sum = sum.value_or(0) + s.value;
  }
  return sum;
}

Counters CountersFrom(const MetricsText& m) {
  Counters c;
  c.gets_memory = m.Sum("granary_master_gets_total", {{"outcome", "memory_hit"}});
  c.gets_disk = m.Sum("granary_master_gets_total", {{"outcome", "disk_hit"}});
  c.gets_miss = m.Sum("granary_master_gets_total", {{"outcome", "miss"}});
  c.hit_bytes_memory = m.Sum("granary_master_get_hit_bytes_total", {{"tier", "memory"}});
  c.hit_bytes_disk = m.Sum("granary_master_get_hit_bytes_total", {{"tier", "disk"}});
  c.puts = m.Sum("granary_master_puts_total");
  c.put_bytes = m.Sum("granary_master_put_bytes_total");
  c.rereplicated_bytes = m.Sum("granary_master_rereplicated_bytes_total");
  c.objects = m.Sum("granary_master_objects");
  c.backlog_objects = m.Sum("granary_master_rereplication_backlog_objects");
  c.backlog_bytes = m.Sum("granary_master_rereplication_backlog_bytes");
  c.copies_in_flight = m.Sum("granary_master_replica_copies_in_flight");
  return c;
}

Rates RatesBetween(const Sample& before, const Sample& now) {
  Rates r;
  if (!before.counters || !now.counters || !before.error.empty() || !now.error.empty()) return r;
  const Counters& a = *before.counters;
  const Counters& b = *now.counters;
  const double dt = now.at_s - before.at_s;
  const auto memory = Increase(a.gets_memory, b.gets_memory);
  const auto disk = Increase(a.gets_disk, b.gets_disk);
  const auto miss = Increase(a.gets_miss, b.gets_miss);
  const auto gets = Add(Add(memory, disk), miss);
  r.gets = PerSecond(gets, dt);
  if (r.gets) {  // the fractions need the same interval
    r.hit = Fraction(Add(memory, disk), gets);
    r.memory = Fraction(memory, gets);
    r.disk = Fraction(disk, gets);
    r.miss = Fraction(miss, gets);
  }
  r.puts = PerSecond(Increase(a.puts, b.puts), dt);
  r.read_bytes = PerSecond(
      Add(Increase(a.hit_bytes_memory, b.hit_bytes_memory), Increase(a.hit_bytes_disk,
                                                                     b.hit_bytes_disk)),
      dt);
  r.write_bytes = PerSecond(Increase(a.put_bytes, b.put_bytes), dt);
  r.rereplicated_bytes = PerSecond(Increase(a.rereplicated_bytes, b.rereplicated_bytes), dt);
  return r;
}

std::string FitLine(std::string_view s, size_t width) {
  std::string out(s.substr(0, std::min(s.size(), width)));
  // A cut UTF-8 sequence goes whole: drop the continuation bytes and the byte that led them.
  if (out.size() < s.size() && (static_cast<unsigned char>(s[out.size()]) & 0xC0) == 0x80) {
    while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) out.pop_back();
    if (!out.empty() && (static_cast<unsigned char>(out.back()) & 0x80)) out.pop_back();
  }
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) c = '?';
  }
  return out;
}

std::string ShortName(std::string_view name, size_t width) {
  if (name.size() <= width) return FitLine(name, width);
  if (width < 4) return FitLine(name, width);
  // Node names tend to differ at the end (host-7, ...-node-12): keep more of the tail.
  const size_t tail = (width - 1) / 2 + (width - 1) % 2;
  const size_t head = width - 1 - tail;
  std::string head_part = FitLine(name.substr(0, head), head);
  std::string_view rest = name.substr(name.size() - tail);
  while (!rest.empty() && (static_cast<unsigned char>(rest.front()) & 0xC0) == 0x80) {
    rest.remove_prefix(1);  // never start in the middle of a UTF-8 sequence
  }
  return head_part + "~" + FitLine(rest, tail);
}

std::string FormatRate(std::optional<double> per_s) {
  if (!per_s) return "-";
  const double v = std::max(0.0, *per_s);
  if (v < 1000) return Printf("%.1f/s", v);
  if (v < 1e6) return Printf("%.1fk/s", v / 1e3);
  return Printf("%.1fM/s", v / 1e6);
}

std::string FormatPercent(std::optional<double> fraction) {
  return fraction ? Printf("%.1f%%", 100.0 * *fraction) : "-";
}

std::string FormatBytesRate(std::optional<double> bytes_per_s) {
  return bytes_per_s ? Size(bytes_per_s) + "/s" : "-";
}

std::vector<std::string> RenderFrame(const Sample* before, const Sample& now,
                                     const ViewOptions& options) {
  const size_t width = options.width;
  std::vector<std::string> lines;
  std::string title = "granary top - master " + now.master;
  if (!now.role.empty()) title += " (" + now.role + ")";
  lines.push_back(Spread(FitLine(title, width), FitLine(now.clock, width), width));
  if (!now.error.empty()) {
    lines.push_back("error: " + now.error);
    lines.push_back(Printf("(asking again every %.1f s)", options.interval_s));
    for (auto& l : lines) l = FitLine(l, width);
    return lines;
  }
  const Counters none;
  const Counters& c = now.counters ? *now.counters : none;
  const Rates r = before ? RatesBetween(*before, now) : Rates();

  uint64_t capacity = 0, used = 0, drain_bytes = 0;
  size_t draining = 0;
  for (const auto& s : now.segments) {
    capacity += s.capacity;
    used += s.used;
    draining += s.draining;
    if (s.draining) drain_bytes += s.drain_bytes;
  }
  std::string counts = "objects " + Count(c.objects) + "  segments " +
                       std::to_string(now.segments.size());
  if (draining) {
    counts += " (" + std::to_string(draining) + " draining, " + FormatSize(drain_bytes) +
              " left to copy)";
  }
  lines.push_back(counts);
  std::string memory = "memory " + FormatSize(used) + " used of " + FormatSize(capacity);
  if (capacity) memory += " (" + FormatPercent(static_cast<double>(used) / capacity) + ")";
  lines.push_back(memory);

  const auto all_gets = Add(Add(c.gets_memory, c.gets_disk), c.gets_miss);
  lines.push_back("gets " + FormatRate(r.gets) + "  hit " + FormatPercent(r.hit) + " (memory " +
                  FormatPercent(r.memory) + ", disk " + FormatPercent(r.disk) + ", miss " +
                  FormatPercent(r.miss) + ")  since start " +
                  FormatPercent(Fraction(Add(c.gets_memory, c.gets_disk), all_gets)));
  lines.push_back("puts " + FormatRate(r.puts) + "  read " + FormatBytesRate(r.read_bytes) +
                  "  write " + FormatBytesRate(r.write_bytes));
  lines.push_back("re-replication: backlog " + Count(c.backlog_objects) + " objects (" +
                  Size(c.backlog_bytes) + "), copies in flight " + Count(c.copies_in_flight) +
                  ", " + FormatBytesRate(r.rereplicated_bytes));
  if (!now.counters) lines.push_back("no counters: " + now.metrics_error);
  lines.push_back("");
  lines.push_back(SegmentLine("SEGMENT", "USED", "CAPACITY", "USE%", "OBJECTS", "STATE"));
  size_t shown = now.segments.size();
  if (options.max_rows && shown > options.max_rows) shown = options.max_rows - 1;
  for (size_t i = 0; i < shown; ++i) {
    const SegmentRow& s = now.segments[i];
    const std::optional<double> pct =
        s.capacity ? std::optional<double>(static_cast<double>(s.used) / s.capacity) : std::nullopt;
    lines.push_back(SegmentLine(ShortName(s.name, kNameWidth), FormatSize(s.used),
                                FormatSize(s.capacity), FormatPercent(pct),
                                std::to_string(s.objects), StateOf(s)));
  }
  if (shown < now.segments.size()) {
    lines.push_back("... and " + std::to_string(now.segments.size() - shown) + " more segments");
  }
  if (now.segments.empty()) lines.push_back("(no segment mounted)");
  for (auto& l : lines) l = FitLine(l, width);
  return lines;
}

}  // namespace granary::top
