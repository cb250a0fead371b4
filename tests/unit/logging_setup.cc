// spdlog's registry is built by its first user. libspdlog is not built with ThreadSanitizer, so
// when that first user is a test's background thread (a standby follower, a stream server), TSan
// takes the registry's construction and a read from another thread for a race. Built here, at
// load time on the main thread, before any test starts a thread, it comes before every use.
#include <spdlog/spdlog.h>

namespace {
[[maybe_unused]] const spdlog::logger* const kDefaultLogger = spdlog::default_logger_raw();
}  // namespace
