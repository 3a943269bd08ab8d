#pragma once
/// Logging: fmt-formatted lines to stderr, each stamped with its source location.
///
/// The level is the one process-wide setting (an atomic); set it once at start-up.
///
/// What the error log costs is bounded whatever stderr does: lines go through
/// LogOutput::standard_error() (written at once when it takes them, else queued within a
/// bound by its thread; never waited for); each text argument is written at most
/// kMaxLogText bytes with its control characters escaped (a client's URL or header value
/// cannot make a line huge, nor forge another line); and each place in the code writes at most
/// kLogBurst lines a second: beyond, its lines are counted, then said in one line ("N similar
/// lines suppressed") once the second is over.

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <string_view>
#include <type_traits>

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

/// Most bytes of one text argument written in a log line (then how many more there were).
inline constexpr std::size_t kMaxLogText = 512;
/// Most lines one place in the code writes per second; the rest are counted (and said).
inline constexpr unsigned kLogBurst = 20;

/// Lines left out by the per-place limit so far.
std::uint64_t log_lines_suppressed();

namespace detail {
/// Writes one formatted line (with time, level and location) in a single write(2).
void write_log_line(LogLevel level, const std::source_location& where, std::string_view message);
/// True if the place `where` may write one more line now (kLogBurst a second); otherwise the
/// line is counted, and said with the others once the second is over.
bool log_line_allowed(LogLevel level, const std::source_location& where);

/// A text argument of a log line: bounded to kMaxLogText bytes, control characters escaped.
struct LogText {
  std::string_view text;
};
/// `arg` as a log line formats it: text as LogText, anything else as it is.
template <typename T>
decltype(auto) log_arg(const T& arg) {
  if constexpr (std::is_convertible_v<const T&, const char*>) {
    const char* text = arg;
    return LogText{text != nullptr ? std::string_view(text) : std::string_view("(null)")};
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    return LogText{std::string_view(arg)};
  } else {
    return (arg);
  }
}
}  // namespace detail

/// Writes a line at `level` if that level is enabled (and its place in the code has not
/// written kLogBurst lines this second). Never throws, never waits for the output.
template <typename... Args>
void log(LogLevel level, LogFormat format, const Args&... args) {
  if (level < log_level()) return;
  if (!detail::log_line_allowed(level, format.where)) return;
  try {
    detail::write_log_line(level, format.where,
                           fmt::format(fmt::runtime(format.text), detail::log_arg(args)...));
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

/// Formats a log line's text argument: at most spindle::kMaxLogText bytes, then "...(N more
/// bytes)"; bytes below 0x20 and 0x7f as \xHH.
template <>
struct fmt::formatter<spindle::detail::LogText> : fmt::formatter<std::string_view> {
  fmt::format_context::iterator format(const spindle::detail::LogText& text,
                                       fmt::format_context& context) const;
};
