// Results, and reading PostgreSQL's text form of values.
#include "spindle/pg/result.h"

#include <fmt/format.h>
#include <libpq-fe.h>

#include <charconv>
#include <cstdlib>

namespace spindle::pg {
namespace {

class Category : public std::error_category {
 public:
  const char* name() const noexcept override { return "spindle.pg"; }
  std::string message(int value) const override {
    switch (static_cast<Errc>(value)) {
      case Errc::kConnectFailed:
        return "could not connect to PostgreSQL";
      case Errc::kConnectionLost:
        return "connection to PostgreSQL lost";
      case Errc::kServerError:
        return "PostgreSQL refused the statement";
      case Errc::kTimedOut:
        return "PostgreSQL call timed out";
      case Errc::kCanceled:
        return "PostgreSQL call canceled";
      case Errc::kNotOnWorker:
        return "PostgreSQL call made outside the database's runtime";
      case Errc::kBadValue:
        return "value not of the type asked";
      case Errc::kClosed:
        return "database closed";
      case Errc::kUnsupported:
        return "statement not supported by the client";
    }
    return "unknown PostgreSQL client error";
  }
};

std::unexpected<Error> bad_value(std::string_view text, std::string_view type) {
  return std::unexpected(Error{make_error_code(Errc::kBadValue),
                               {},
                               fmt::format("'{}' is not {}", text.substr(0, 64), type)});
}

// Digits at text[at, at+count) as a number; -1 if any is not a digit.
int digits(std::string_view text, std::size_t at, std::size_t count) {
  if (at + count > text.size()) return -1;
  int value = 0;
  for (std::size_t i = at; i < at + count; ++i) {
    if (text[i] < '0' || text[i] > '9') return -1;
    value = value * 10 + (text[i] - '0');
  }
  return value;
}

}  // namespace

const std::error_category& pg_category() {
  static const Category category;
  return category;
}

Result::Result(pg_result* result) : result_(result, &PQclear) {}

int Result::rows() const { return result_ ? PQntuples(result_.get()) : 0; }

int Result::columns() const { return result_ ? PQnfields(result_.get()) : 0; }

std::string_view Result::column_name(int column) const {
  const char* name = result_ ? PQfname(result_.get(), column) : nullptr;
  return name ? std::string_view(name) : std::string_view();
}

std::int64_t Result::affected() const {
  if (!result_) return 0;
  std::string_view count = PQcmdTuples(result_.get());
  std::int64_t n = 0;
  std::from_chars(count.data(), count.data() + count.size(), n);
  return n;
}

std::string_view Result::command() const {
  if (!result_) return {};
  std::string_view tag = PQcmdStatus(result_.get());
  return tag.substr(0, tag.find(' '));
}

bool Result::is_null(int row, int column) const {
  return !result_ || row < 0 || column < 0 || row >= rows() || column >= columns() ||
         PQgetisnull(result_.get(), row, column) != 0;
}

std::string_view Result::text(int row, int column) const {
  if (is_null(row, column)) return {};
  return {PQgetvalue(result_.get(), row, column),
          static_cast<std::size_t>(PQgetlength(result_.get(), row, column))};
}

Expected<bool> parse_bool(std::string_view text) {
  if (text == "t" || text == "true") return true;
  if (text == "f" || text == "false") return false;
  return bad_value(text, "a boolean");
}

Expected<std::int64_t> parse_int(std::string_view text) {
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    return bad_value(text, "an integer");
  }
  return value;
}

Expected<double> parse_double(std::string_view text) {
  // PostgreSQL writes Infinity, -Infinity and NaN; from_chars reads inf and nan.
  if (text == "Infinity") return std::numeric_limits<double>::infinity();
  if (text == "-Infinity") return -std::numeric_limits<double>::infinity();
  if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    return bad_value(text, "a number");
  }
  return value;
}

Expected<std::vector<std::byte>> parse_bytea(std::string_view text) {
  // The hex form (bytea_output = hex, the default since 9.0): \x then two digits a byte.
  if (text.size() < 2 || text[0] != '\\' || text[1] != 'x' || text.size() % 2 != 0) {
    return bad_value(text, "bytea in hex form");
  }
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::vector<std::byte> bytes;
  bytes.reserve((text.size() - 2) / 2);
  for (std::size_t i = 2; i < text.size(); i += 2) {
    int hi = nibble(text[i]), lo = nibble(text[i + 1]);
    if (hi < 0 || lo < 0) return bad_value(text, "bytea in hex form");
    bytes.push_back(static_cast<std::byte>(hi * 16 + lo));
  }
  return bytes;
}

Expected<Timestamp> parse_timestamp(std::string_view text) {
  // ISO form (DateStyle ISO, the default): YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]]
  int year = digits(text, 0, 4), month = digits(text, 5, 2), day = digits(text, 8, 2);
  int hour = digits(text, 11, 2), minute = digits(text, 14, 2), second = digits(text, 17, 2);
  if (year < 0 || month < 0 || day < 0 || hour < 0 || minute < 0 || second < 0 || text[4] != '-' ||
      text[7] != '-' || text[10] != ' ' || text[13] != ':' || text[16] != ':') {
    return bad_value(text, "a timestamp");
  }
  std::chrono::year_month_day date{std::chrono::year(year), std::chrono::month(month),
                                   std::chrono::day(day)};
  if (!date.ok()) return bad_value(text, "a timestamp");
  std::size_t at = 19;
  std::int64_t micros = 0;
  if (at < text.size() && text[at] == '.') {
    int scale = 100000;
    for (++at; at < text.size() && text[at] >= '0' && text[at] <= '9'; ++at) {
      micros += (text[at] - '0') * scale;
      scale /= 10;
    }
  }
  std::int64_t offset_seconds = 0;
  if (at < text.size()) {
    if (text[at] != '+' && text[at] != '-') return bad_value(text, "a timestamp");
    int sign = text[at] == '-' ? -1 : 1;
    int parts[3] = {digits(text, at + 1, 2), 0, 0};
    std::size_t next = at + 3;
    for (int i = 1; i < 3 && next < text.size() && text[next] == ':'; ++i, next += 3) {
      parts[i] = digits(text, next + 1, 2);
    }
    if (parts[0] < 0 || parts[1] < 0 || parts[2] < 0 || next != text.size()) {
      return bad_value(text, "a timestamp");
    }
    offset_seconds = sign * (parts[0] * 3600 + parts[1] * 60 + parts[2]);
  }
  auto time = std::chrono::sys_days(date) + std::chrono::hours(hour) +
              std::chrono::minutes(minute) + std::chrono::seconds(second - offset_seconds) +
              std::chrono::microseconds(micros);
  return std::chrono::time_point_cast<std::chrono::microseconds>(time);
}

std::string format_timestamp(Timestamp time) {
  auto day = std::chrono::floor<std::chrono::days>(time);
  std::chrono::year_month_day date(day);
  std::chrono::hh_mm_ss<std::chrono::microseconds> clock(time - day);
  return fmt::format("{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}+00", static_cast<int>(date.year()),
                     static_cast<unsigned>(date.month()), static_cast<unsigned>(date.day()),
                     clock.hours().count(), clock.minutes().count(), clock.seconds().count(),
                     clock.subseconds().count());
}

}  // namespace spindle::pg
