#include "spindle/base/log.h"

#include <fmt/chrono.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "log_internal.h"
#include "spindle/base/log_output.h"

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

// ---- the per-place limit ----------------------------------------------------------------------

using Clock = std::chrono::steady_clock;
constexpr auto kLogInterval = std::chrono::seconds(1);

// One place in the code that logs: its lines this interval, and those left out.
struct Place {
  std::source_location where;
  LogLevel level = LogLevel::kInfo;
  Clock::time_point since{};
  unsigned written = 0;
  std::uint64_t suppressed = 0;
};

struct PlaceKey {
  const char* file;
  std::uint_least32_t line;
  bool operator==(const PlaceKey&) const = default;
};
struct PlaceHash {
  std::size_t operator()(const PlaceKey& k) const {
    return std::hash<const void*>()(k.file) ^ (std::size_t{k.line} * 0x9e3779b97f4a7c15u);
  }
};

// The places that logged (as many as the code has), made on first use and freed at exit
// (free_log_places), after the writer that reads it stopped; a line logged after that is not
// limited.
struct Places {
  std::mutex lock;
  std::unordered_map<PlaceKey, Place, PlaceHash> by_place;
};
std::atomic<Places*> g_places{nullptr};
std::atomic<bool> g_places_freed{false};
std::atomic<bool> g_closing{false};  // the exit handler began (mark_logs_closing)
std::atomic<std::uint64_t> g_suppressed{0};

// The table, or nullptr once freed.
Places* places() {
  if (Places* made = g_places.load(std::memory_order_acquire)) return made;
  if (g_places_freed.load()) return nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    detail::close_logs_at_exit();
    g_places.store(new Places(), std::memory_order_release);
  });
  return g_places.load(std::memory_order_acquire);
}

void write_line(LogLevel level, const std::source_location& where, std::string_view message);

// Says how many lines `place` left out, if any, and starts its next interval at `now`.
void report_suppressed(Place& place, Clock::time_point now) {
  if (place.suppressed != 0) {
    auto seconds = std::chrono::duration<double>(now - place.since).count();
    write_line(place.level, place.where,
               fmt::format("({} similar line(s) suppressed in the last {:.1f} s)", place.suppressed,
                           seconds));
  }
  place.since = now;
  place.written = 0;
  place.suppressed = 0;
}

// Once a second, from the error log's writer: the counts of the intervals that are over, even
// when their places logged nothing since.
void report_ended_intervals() {
  Places* all = places();
  if (all == nullptr) return;
  auto now = Clock::now();
  std::lock_guard guard(all->lock);
  for (auto& [key, place] : all->by_place) {
    if (place.suppressed != 0 && now - place.since >= kLogInterval) report_suppressed(place, now);
  }
}

// The error log's writer (nullptr once freed at exit), ticking for report_ended_intervals.
LogOutput* error_output() {
  if (g_closing.load(std::memory_order_relaxed)) return LogOutput::standard_error_if_open();
  static const bool ticking = [] {
    LogOutput::standard_error().on_tick(&report_ended_intervals);
    return true;
  }();
  (void)ticking;
  return LogOutput::standard_error_if_open();
}

void write_line(LogLevel level, const std::source_location& where, std::string_view message) {
  auto now = std::chrono::system_clock::now();
  auto seconds = std::chrono::floor<std::chrono::seconds>(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - seconds).count();
  fmt::memory_buffer line;
  fmt::format_to(std::back_inserter(line), "{:%Y-%m-%dT%H:%M:%S}.{:03}Z {} {}:{} {}\n", seconds, ms,
                 level_name(level), base_name(where.file_name()), where.line(), message);
  // One write, so that lines from different threads do not interleave; at once when stderr
  // takes it, else queued (within a bound) for the error log's writer: never waited for.
  if (LogOutput* output = error_output()) {
    output->write({line.data(), line.size()}, 1, LogOutput::kDirect);
  } else {
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, line.data(), line.size());  // at exit
  }
}

}  // namespace

void set_log_level(LogLevel level) { g_level.store(level, std::memory_order_relaxed); }

LogLevel log_level() { return g_level.load(std::memory_order_relaxed); }

std::uint64_t log_lines_suppressed() { return g_suppressed.load(std::memory_order_relaxed); }

namespace detail {

void write_log_line(LogLevel level, const std::source_location& where, std::string_view message) {
  write_line(level, where, message);
}

void mark_logs_closing() { g_closing.store(true); }

void free_log_places() {
  g_places_freed.store(true);
  delete g_places.exchange(nullptr);
}

bool log_line_allowed(LogLevel level, const std::source_location& where) {
  Places* all = places();
  if (all == nullptr) return true;
  auto now = Clock::now();
  std::lock_guard guard(all->lock);
  Place& place = all->by_place[PlaceKey{where.file_name(), where.line()}];
  if (place.written == 0 && place.suppressed == 0) {
    place.where = where;
    place.level = level;
  }
  if (now - place.since >= kLogInterval) report_suppressed(place, now);
  if (place.written < kLogBurst) {
    ++place.written;
    return true;
  }
  ++place.suppressed;
  g_suppressed.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace detail
}  // namespace spindle

fmt::format_context::iterator fmt::formatter<spindle::detail::LogText>::format(
    const spindle::detail::LogText& text, fmt::format_context& context) const {
  std::string_view shown = text.text.substr(0, spindle::kMaxLogText);
  std::string out;
  out.reserve(shown.size() + 16);
  for (char c : shown) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      fmt::format_to(std::back_inserter(out), "\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  if (text.text.size() > shown.size()) {
    fmt::format_to(std::back_inserter(out), "...({} more bytes)", text.text.size() - shown.size());
  }
  return fmt::formatter<std::string_view>::format(out, context);
}
