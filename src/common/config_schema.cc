#include "common/config_schema.h"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <variant>

#include "common/units.h"

namespace granary {

namespace {

enum class Kind { kString, kUint, kPort, kSize, kDuration, kDouble, kBool };

// A parsed value waiting to be stored; staging them lets Parse() fail without touching targets.
using Value = std::variant<std::string, uint64_t, int64_t, double, bool>;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string FormatDouble(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

[[noreturn]] void Fatal(const std::string& msg) {
  std::fprintf(stderr, "ConfigSchema: %s\n", msg.c_str());
  std::abort();
}

// Where a value came from, for error messages: `flag --port` or `key "port" in F line 3`.
std::string YamlSource(const std::string& path, const std::string& key, const YAML::Node& node) {
  return "key " + Quote(key) + " in " + path + " line " + std::to_string(node.Mark().line + 1);
}

std::string NodeTypeName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "no value";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "a scalar";
  }
}

}  // namespace

struct ConfigSchema::Setting {
  std::string name;  // snake_case; also the YAML key
  std::string flag;  // "--" + name with '_' -> '-'
  std::string help;
  Kind kind = Kind::kString;
  std::variant<std::string*, uint64_t*, uint16_t*, int64_t*, double*, bool*> target;
  uint64_t umin = 0;
  uint64_t umax = 0;
  double dmin = 0;
  double dmax = 0;

  // What a valid value looks like, appended to every error about this setting.
  std::string Expected() const {
    switch (kind) {
      case Kind::kString:
        return "a string";
      case Kind::kUint:
        return "an integer in [" + std::to_string(umin) + ", " + std::to_string(umax) + "]";
      case Kind::kPort:
        return "a port number in [0, 65535]";
      case Kind::kSize:
        return "a size such as 65536, 64k, 512MB or 1.5GiB (binary units)";
      case Kind::kDuration:
        return "a duration such as 500ms, 10s, 30m or 1h (a bare number is seconds)";
      case Kind::kDouble:
        return "a number in [" + FormatDouble(dmin) + ", " + FormatDouble(dmax) + "]";
      case Kind::kBool:
        return "a boolean (true/false, yes/no, on/off, 1/0)";
    }
    return "";
  }

  const char* TypeName() const {
    switch (kind) {
      case Kind::kString:
        return "STRING";
      case Kind::kUint:
        return "UINT";
      case Kind::kPort:
        return "PORT";
      case Kind::kSize:
        return "SIZE";
      case Kind::kDuration:
        return "DURATION";
      case Kind::kDouble:
        return "NUMBER";
      case Kind::kBool:
        return "[BOOL]";
    }
    return "";
  }

  // Parses text exactly as the YAML and flag paths both must; the error names the setting.
  Result<Value> ParseText(std::string_view text, const std::string& source) const {
    auto bad = [&](const std::string& why) {
      std::string msg =
          "setting " + Quote(name) + " (" + source + "): invalid value " + Quote(text) + ": ";
      if (!why.empty()) msg += why + "; ";
      msg += "expected " + Expected();
      return Result<Value>(ErrorCode::INVALID_PARAMS, std::move(msg));
    };
    // units.h messages already quote the value and say what is expected; only add the setting.
    auto in_units = [&](const Status& st) {
      return Result<Value>(ErrorCode::INVALID_PARAMS,
                           "setting " + Quote(name) + " (" + source + "): " + st.message());
    };
    const std::string_view t = Trim(text);
    switch (kind) {
      case Kind::kString:
        return Value(std::string(text));
      case Kind::kUint:
      case Kind::kPort: {
        uint64_t v = 0;
        auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (t.empty() || ec == std::errc::invalid_argument || end != t.data() + t.size()) {
          return bad("");
        }
        const uint64_t lo = kind == Kind::kPort ? 0 : umin;
        const uint64_t hi = kind == Kind::kPort ? 65535 : umax;
        if (ec == std::errc::result_out_of_range || v < lo || v > hi) return bad("out of range");
        return Value(v);
      }
      case Kind::kSize: {
        auto r = ParseSize(text);
        if (!r.ok()) return in_units(r.status());
        return Value(*r);
      }
      case Kind::kDuration: {
        auto r = ParseDurationMs(text);
        if (!r.ok()) return in_units(r.status());
        return Value(*r);
      }
      case Kind::kDouble: {
        double v = 0;
        auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (t.empty() || ec != std::errc() || end != t.data() + t.size() || !std::isfinite(v)) {
          return bad("");
        }
        if (v < dmin || v > dmax) return bad("out of range");
        return Value(v);
      }
      case Kind::kBool: {
        const std::string l = Lower(t);
        if (l == "true" || l == "yes" || l == "on" || l == "1") return Value(true);
        if (l == "false" || l == "no" || l == "off" || l == "0") return Value(false);
        return bad("");
      }
    }
    return bad("");
  }

  void Store(const Value& v) const {
    switch (kind) {
      case Kind::kString:
        *std::get<std::string*>(target) = std::get<std::string>(v);
        break;
      case Kind::kUint:
      case Kind::kSize:
        *std::get<uint64_t*>(target) = std::get<uint64_t>(v);
        break;
      case Kind::kPort:
        *std::get<uint16_t*>(target) = static_cast<uint16_t>(std::get<uint64_t>(v));
        break;
      case Kind::kDuration:
        *std::get<int64_t*>(target) = std::get<int64_t>(v);
        break;
      case Kind::kDouble:
        *std::get<double*>(target) = std::get<double>(v);
        break;
      case Kind::kBool:
        *std::get<bool*>(target) = std::get<bool>(v);
        break;
    }
  }

  // The target's current value in the form the parsers read back.
  std::string Format() const {
    switch (kind) {
      case Kind::kString:
        return *std::get<std::string*>(target);
      case Kind::kUint:
        return std::to_string(*std::get<uint64_t*>(target));
      case Kind::kPort:
        return std::to_string(*std::get<uint16_t*>(target));
      case Kind::kSize: {
        const uint64_t bytes = *std::get<uint64_t*>(target);
        std::string human = FormatSize(bytes);
        auto back = ParseSize(human);
        if (back.ok() && *back == bytes) return human;
        return std::to_string(bytes) + " (" + human + ")";
      }
      case Kind::kDuration:
        return FormatDurationMs(*std::get<int64_t*>(target));
      case Kind::kDouble:
        return FormatDouble(*std::get<double*>(target));
      case Kind::kBool:
        return *std::get<bool*>(target) ? "true" : "false";
    }
    return "";
  }
};

ConfigSchema::ConfigSchema(std::string program_description)
    : description_(std::move(program_description)) {}

ConfigSchema::~ConfigSchema() = default;

void ConfigSchema::Add(Setting s) {
  bool valid = !s.name.empty() && std::islower(static_cast<unsigned char>(s.name[0]));
  for (char c : s.name) {
    valid = valid && (std::islower(static_cast<unsigned char>(c)) ||
                      std::isdigit(static_cast<unsigned char>(c)) || c == '_');
  }
  if (!valid) Fatal("setting name " + Quote(s.name) + " is not snake_case ([a-z][a-z0-9_]*)");
  if (s.name == "config" || s.name == "help")
    Fatal("setting name " + Quote(s.name) + " is reserved");
  if (Find(s.name) != nullptr) Fatal("setting " + Quote(s.name) + " declared twice");
  s.flag = "--" + s.name;
  for (char& c : s.flag) {
    if (c == '_') c = '-';
  }
  settings_.push_back(std::move(s));
}

const ConfigSchema::Setting* ConfigSchema::Find(const std::string& name) const {
  for (const Setting& s : settings_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

void ConfigSchema::AddString(std::string name, std::string* target, std::string help) {
  Setting s;
  s.name = std::move(name);
  s.help = std::move(help);
  s.kind = Kind::kString;
  s.target = target;
  Add(std::move(s));
}

void ConfigSchema::AddUint(std::string name, uint64_t* target, std::string help, uint64_t min,
                           uint64_t max) {
  Setting s;
  s.name = std::move(name);
  s.help = std::move(help);
  s.kind = Kind::kUint;
  s.target = target;
  s.umin = min;
  s.umax = max;
  Add(std::move(s));
}

void ConfigSchema::AddPort(std::string name, uint16_t* target, std::string help) {
  Setting s;
  s.name = std::move(name);
  s.help = std::move(help);
  s.kind = Kind::kPort;
  s.target = target;
  Add(std::move(s));
}

void ConfigSchema::AddSize(std::string name, uint64_t* target, std::string help) {
  Setting s;
  s.name = std::move(name);
  s.help = std::move(help);
  s.kind = Kind::kSize;
  s.target = target;
  Add(std::move(s));
}

void ConfigSchema::AddDurationMs(std::string name, int64_t* target, std::string help) {
  Setting s;
  s.name = std::move(name);
  s.help = std::move(help);
  s.kind = Kind::kDuration;
  s.target = target;
  Add(std::move(s));
}

void ConfigSchema::AddDouble(std::string name, double* target, std::string help, double min,
                             double max) {
  Setting s;
  s.name = std::move(name);
  s.help = std::move(help);
  s.kind = Kind::kDouble;
  s.target = target;
  s.dmin = min;
  s.dmax = max;
  Add(std::move(s));
}

void ConfigSchema::AddBool(std::string name, bool* target, std::string help) {
  Setting s;
  s.name = std::move(name);
  s.help = std::move(help);
  s.kind = Kind::kBool;
  s.target = target;
  Add(std::move(s));
}

Status ConfigSchema::Parse(int argc, const char* const* argv) {
  std::string program = "granary";
  if (argc > 0 && argv[0] != nullptr) program = std::filesystem::path(argv[0]).filename().string();
  CLI::App app(description_, program);
  app.footer(
      "Every setting can also be a key of the YAML file given by --config (snake_case, '-' "
      "accepted); flags override the file.");

  // Flags are taken as plain strings and parsed below by the same code as YAML values.
  std::string config_path;
  app.add_option("--config", config_path, "YAML file of settings (top-level mapping)")
      ->type_name("FILE");
  std::vector<std::string> flag_text(settings_.size());
  std::vector<CLI::Option*> options(settings_.size());
  for (size_t i = 0; i < settings_.size(); ++i) {
    const Setting& s = settings_[i];
    // The default is the target's value now, before the file or flags touch it.
    std::string desc = s.help + " [default: " + s.Format() + "]";
    options[i] = app.add_option(s.flag, flag_text[i], desc)
                     ->type_name(s.TypeName())
                     ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    if (s.kind == Kind::kBool) options[i]->expected(0, 1);  // bare --name means true
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help() << std::flush;
    help_requested_ = true;
    return Status::Ok();
  } catch (const CLI::Error& e) {
    return Status(ErrorCode::INVALID_PARAMS, std::string("command line: ") + e.what() +
                                                 " (run with --help for the list of settings)");
  }

  std::vector<std::optional<Value>> staged(settings_.size());
  if (!config_path.empty()) {
    const std::string where = "config file " + config_path;
    std::error_code ec;
    if (std::filesystem::is_directory(config_path, ec)) {
      return Status(ErrorCode::INVALID_PARAMS, where + ": is a directory, expected a YAML file");
    }
    std::ifstream in(config_path);
    if (!in.is_open()) {
      return Status(ErrorCode::INVALID_PARAMS,
                    where + ": cannot open: " + std::string(std::strerror(errno)));
    }
    std::stringstream buf;
    buf << in.rdbuf();
    if (in.bad()) return Status(ErrorCode::INVALID_PARAMS, where + ": read error");
    YAML::Node root;
    try {
      root = YAML::Load(buf.str());
    } catch (const YAML::Exception& e) {
      return Status(ErrorCode::INVALID_PARAMS, where + ": malformed YAML: " + e.what());
    }
    if (!root.IsNull() && !root.IsMap()) {
      return Status(
          ErrorCode::INVALID_PARAMS,
          where + ": expected a top-level mapping of setting: value, got " + NodeTypeName(root));
    }
    std::set<std::string> seen;
    if (root.IsMap()) {
      for (const auto& kv : root) {
        const YAML::Node& key = kv.first;
        const YAML::Node& value = kv.second;
        const std::string line = " line " + std::to_string(key.Mark().line + 1);
        if (!key.IsScalar()) {
          return Status(ErrorCode::INVALID_PARAMS, where + line + ": keys must be setting names");
        }
        std::string name = key.Scalar();
        for (char& c : name) {
          if (c == '-') c = '_';
        }
        const Setting* s = Find(name);
        if (s == nullptr) {
          std::string known;
          for (const Setting& k : settings_) known += (known.empty() ? "" : ", ") + k.name;
          return Status(ErrorCode::INVALID_PARAMS, where + line + ": unknown setting " +
                                                       Quote(key.Scalar()) +
                                                       " (known settings: " + known + ")");
        }
        if (!seen.insert(name).second) {
          return Status(ErrorCode::INVALID_PARAMS,
                        where + line + ": setting " + Quote(name) + " is set twice");
        }
        const std::string source = YamlSource(config_path, key.Scalar(), key);
        if (!value.IsScalar()) {
          return Status(ErrorCode::INVALID_PARAMS, "setting " + Quote(name) + " (" + source +
                                                       "): expected " + s->Expected() + ", got " +
                                                       NodeTypeName(value));
        }
        auto parsed = s->ParseText(value.Scalar(), source);
        if (!parsed.ok()) return parsed.status();
        staged[static_cast<size_t>(s - settings_.data())] = std::move(*parsed);
      }
    }
  }

  for (size_t i = 0; i < settings_.size(); ++i) {
    if (options[i]->count() == 0) continue;
    const Setting& s = settings_[i];
    std::string text = flag_text[i];
    if (s.kind == Kind::kBool && text.empty()) text = "true";
    auto parsed = s.ParseText(text, "flag " + s.flag);
    if (!parsed.ok()) return parsed.status();
    staged[i] = std::move(*parsed);
  }

  for (size_t i = 0; i < settings_.size(); ++i) {
    if (staged[i].has_value()) settings_[i].Store(*staged[i]);
  }
  config_path_ = config_path;
  return Status::Ok();
}

std::string ConfigSchema::Describe() const {
  std::string out;
  if (!config_path_.empty()) out += "config=" + config_path_ + "\n";
  for (const Setting& s : settings_) out += s.name + "=" + s.Format() + "\n";
  return out;
}

}  // namespace granary
