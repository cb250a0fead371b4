// common/logging.h - one logger for every Granary process, on spdlog.
//
// Promise: InitLogging() may be called once at start; until then spdlog's default logger is used.
// The macros are thread-safe.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "granary/status.h"

namespace granary {

// level: trace, debug, info, warn, error, off. Unknown levels give INVALID_PARAMS.
Status InitLogging(std::string_view process_name, std::string_view level);

}  // namespace granary

#define GLOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define GLOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define GLOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define GLOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
