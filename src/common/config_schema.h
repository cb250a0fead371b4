// common/config_schema.h - one table of settings read from a YAML file and from command-line flags.
//
// Promise: each setting is declared once (name, target variable, help, type and range) and is then
// settable as YAML key `name` (or with '-' for '_') in the file given by --config, and as flag
// `--name` ('_' -> '-'). Precedence: the value already in *target (the default), then the file,
// then the flags. Both sources go through the same text parsers (units.h for sizes and durations),
// so a value valid in one is valid in the other. Parse() is all-or-nothing: on any error no target
// changes.
//
// Ownership: the schema stores raw pointers to the caller's targets, which must outlive it (they
// are usually fields of the process's config struct next to it in main()).
// Thread safety: none; build and parse on one thread at start-up, before other threads read them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "granary/status.h"

namespace granary {

class ConfigSchema {
 public:
  explicit ConfigSchema(std::string program_description);
  ~ConfigSchema();
  ConfigSchema(const ConfigSchema&) = delete;
  ConfigSchema& operator=(const ConfigSchema&) = delete;

  // name is snake_case ([a-z0-9_]); declaring the same name twice, or "config"/"help", aborts:
  // both are programming errors that would otherwise make one setting silently shadow another.
  void AddString(std::string name, std::string* target, std::string help);
  // Decimal integer in [min, max].
  void AddUint(std::string name, uint64_t* target, std::string help, uint64_t min, uint64_t max);
  // Decimal integer in [0, 65535]; 0 usually means "pick a free port".
  void AddPort(std::string name, uint16_t* target, std::string help);
  // ParseSize: "4GiB", "512MB", "1048576" (YAML integers are bytes).
  void AddSize(std::string name, uint64_t* target, std::string help);
  // ParseDurationMs: "10s", "500ms", "30m"; a bare number is seconds.
  void AddDurationMs(std::string name, int64_t* target, std::string help);
  // Finite decimal number in [min, max].
  void AddDouble(std::string name, double* target, std::string help, double min, double max);
  // true/false, yes/no, on/off, 1/0 (any case). Flag forms: --name, --name=false, --name true.
  void AddBool(std::string name, bool* target, std::string help);

  // Reads argv (argv[0] is the program name) and the YAML file named by --config FILE, if any.
  // Returns OK, or INVALID_PARAMS naming the setting, the bad value and what is expected (unknown
  // flag, unknown YAML key, wrong type, out of range, unreadable or malformed YAML file).
  // --help / -h prints every setting with its default to stdout, changes nothing and returns OK
  // with help_requested() true; the caller should then exit(0). Call once.
  Status Parse(int argc, const char* const* argv);
  bool help_requested() const { return help_requested_; }

  // The effective configuration, one "name=value" line per setting in declaration order (first
  // "config=FILE" when a file was read), for the start-up log. Sizes and durations are printed in
  // their units ("4 GiB", "10s"); a size that does not print exactly also shows its byte count.
  std::string Describe() const;

 private:
  struct Setting;  // defined in the .cc: type, target and range of one setting
  void Add(Setting setting);
  const Setting* Find(const std::string& name) const;

  std::string description_;
  std::vector<Setting> settings_;
  std::string config_path_;  // as given by --config; empty when none
  bool help_requested_ = false;
};

}  // namespace granary
