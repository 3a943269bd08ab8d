#include "spindle/base/log.h"

#include <fmt/chrono.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>

namespace spindle {
namespace {

std::atomic<LogLevel> g_level{LogLevel::kInfo};

constexpr std::string_view level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      return "off";
  }
  return "?";
}

std::string_view base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

void set_log_level(LogLevel level) { g_level.store(level, std::memory_order_relaxed); }

LogLevel log_level() { return g_level.load(std::memory_order_relaxed); }

namespace detail {

void write_log_line(LogLevel level, const std::source_location& where, std::string_view message) {
  auto now = std::chrono::system_clock::now();
  auto seconds = std::chrono::floor<std::chrono::seconds>(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - seconds).count();
  fmt::memory_buffer line;
  fmt::format_to(std::back_inserter(line), "{:%Y-%m-%dT%H:%M:%S}.{:03}Z {} {}:{} {}\n", seconds, ms,
                 level_name(level), base_name(where.file_name()), where.line(), message);
  // One write so that lines from different threads do not interleave.
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace detail
}  // namespace spindle
