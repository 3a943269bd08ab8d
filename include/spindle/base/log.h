#pragma once
/// Logging: fmt-formatted lines to stderr, each stamped with its source location.
///
/// The level is the one process-wide setting (an atomic); set it once at start-up.

#include <fmt/format.h>

#include <source_location>
#include <string_view>

namespace spindle {

/// How severe a log line is; lines below the current level are dropped.
enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

/// Sets the minimum level written (default kInfo).
void set_log_level(LogLevel level);

/// Returns the minimum level written.
LogLevel log_level();

/// A format string that remembers where it was written.
struct LogFormat {
  /// The fmt format string.
  fmt::string_view text;
  /// Where the log call is.
  std::source_location where;

  template <typename S>
  LogFormat(const S& s, std::source_location loc = std::source_location::current())
      : text(s), where(loc) {}
};

namespace detail {
/// Writes one formatted line (with time, level and location) in a single write(2).
void write_log_line(LogLevel level, const std::source_location& where, std::string_view message);
}  // namespace detail

/// Writes a line at `level` if that level is enabled. Never throws.
template <typename... Args>
void log(LogLevel level, LogFormat format, const Args&... args) {
  if (level < log_level()) return;
  try {
    detail::write_log_line(level, format.where,
                           fmt::vformat(format.text, fmt::make_format_args(args...)));
  } catch (...) {
    detail::write_log_line(level, format.where, "(log line failed to format)");
  }
}

/// Logs at kDebug.
template <typename... Args>
void log_debug(LogFormat format, const Args&... args) {
  log(LogLevel::kDebug, format, args...);
}
/// Logs at kInfo.
template <typename... Args>
void log_info(LogFormat format, const Args&... args) {
  log(LogLevel::kInfo, format, args...);
}
/// Logs at kWarn.
template <typename... Args>
void log_warn(LogFormat format, const Args&... args) {
  log(LogLevel::kWarn, format, args...);
}
/// Logs at kError.
template <typename... Args>
void log_error(LogFormat format, const Args&... args) {
  log(LogLevel::kError, format, args...);
}

}  // namespace spindle
