#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <string>

namespace granary {

Status InitLogging(std::string_view process_name, std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    return Status(ErrorCode::INVALID_PARAMS,
                  "unknown log level '" + std::string(level) +
                      "' (expected trace, debug, info, warn, error or off)");
  }
  auto logger = spdlog::stderr_color_mt(std::string(process_name));
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%n] %v");
  spdlog::set_level(parsed);
  return Status::Ok();
}

}  // namespace granary
