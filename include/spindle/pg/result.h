#pragma once
/// What goes to PostgreSQL and what comes back: typed parameters, results and rows, and the
/// errors (a std::error_code, plus the server's SQLSTATE and message when it sent one).

#include <chrono>
#include <cmath>
#include <cstdint>
#include <expected>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

struct pg_result;  // libpq's PGresult

namespace spindle::pg {

/// Why a call failed (category "spindle.pg").
enum class Errc {
  kConnectFailed = 1,  ///< the connection could not be made (message: libpq's)
  kConnectionLost,     ///< the connection broke while the call was on it
  kServerError,        ///< the server refused the statement (see Error::sqlstate)
  kTimedOut,           ///< the call's deadline passed (see Error::not_sent)
  kCanceled,           ///< the calling fiber was asked to stop
  kNotOnWorker,        ///< called outside a fiber of the Database's runtime
  kBadValue,           ///< a parameter libpq cannot carry, or a column read as a type it is not
  kClosed,             ///< the Database was closed
  kUnsupported,        ///< a statement the client does not carry: COPY FROM STDIN / TO STDOUT
};

const std::error_category& pg_category();
inline std::error_code make_error_code(Errc e) { return {static_cast<int>(e), pg_category()}; }

/// A failed call: what kind (code), and for server errors the SQLSTATE ("23505") and the
/// server's message; for the others, a message saying what happened.
struct Error {
  std::error_code code;
  std::string sqlstate;
  std::string message;
  /// True when the statement never left the client (refused before sending, no connection
  /// free or opened by the deadline, ...): it did not run, and running it again cannot run it
  /// twice. False after it was sent: a kTimedOut, kCanceled, kConnectionLost or kClosed
  /// statement may have run, or may still run: its outcome is unknown (docs/database.md).
  bool not_sent = false;
};

template <typename T>
using Expected = std::expected<T, Error>;

/// Raw bytes (bytea): sent in binary, read back from PostgreSQL's hex form.
struct Bytes {
  std::string_view data;
};

/// A point in time (timestamptz, or timestamp read as UTC). Sessions run with TimeZone UTC.
using Timestamp = std::chrono::sys_time<std::chrono::microseconds>;

/// One parameter ($1, $2, ...): NULL, a boolean, an integer, a float, text, bytes or a time.
/// Text and bytes are views: they must live until the call that takes them returns (the call
/// copies them into the connection's output before it does).
using Param =
    std::variant<std::nullptr_t, bool, std::int64_t, double, std::string_view, Bytes, Timestamp>;

/// Makes a Param of any integer, floating point, string-like or other accepted value.
template <typename T>
Param param(const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value;
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<std::int64_t>(value);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<double>(value);
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    return std::string_view(value);
  } else {
    return Param(value);
  }
}

/// The rows a statement returned (or the rows it changed). Columns are read by index, as text
/// or as a type; values are the server's text form (results are asked for in text).
class Result {
 public:
  Result() = default;
  explicit Result(pg_result* result);

  /// Rows returned.
  int rows() const;
  /// Columns per row.
  int columns() const;
  /// A column's name.
  std::string_view column_name(int column) const;
  /// Rows the statement changed (UPDATE, INSERT, DELETE), 0 for others.
  std::int64_t affected() const;
  /// The command tag's verb ("SELECT", "UPDATE", "COMMIT"; "ROLLBACK" for a COMMIT that found
  /// the transaction failed).
  std::string_view command() const;

  bool is_null(int row, int column) const;
  /// The value as PostgreSQL wrote it ("" for NULL).
  std::string_view text(int row, int column) const;
  /// The value as `T`: bool, an integer type, double, std::string, std::vector<std::byte>
  /// (bytea), Timestamp; or std::optional of one of them (nullopt for NULL). A NULL read as
  /// a plain T, or text that is not a T, is Errc::kBadValue.
  template <typename T>
  Expected<T> get(int row, int column) const;

 private:
  std::shared_ptr<pg_result> result_;
};

/// Reads the text form of one value as T (what Result::get uses).
Expected<bool> parse_bool(std::string_view text);
Expected<std::int64_t> parse_int(std::string_view text);
Expected<double> parse_double(std::string_view text);
Expected<std::vector<std::byte>> parse_bytea(std::string_view text);
Expected<Timestamp> parse_timestamp(std::string_view text);
/// The text form of a time as a parameter ("2026-11-25 06:01:18.111000+00").
std::string format_timestamp(Timestamp time);

template <typename T>
inline constexpr bool kIsOptional = false;
template <typename T>
inline constexpr bool kIsOptional<std::optional<T>> = true;

template <typename T>
Expected<T> Result::get(int row, int column) const {
  if constexpr (kIsOptional<T>) {
    if (is_null(row, column)) return T{};
    auto value = get<typename T::value_type>(row, column);
    if (!value) return std::unexpected(value.error());
    return T{std::move(*value)};
  } else {
    if (is_null(row, column)) {
      return std::unexpected(Error{make_error_code(Errc::kBadValue), {}, "the value is NULL"});
    }
    std::string_view t = text(row, column);
    if constexpr (std::is_same_v<T, bool>) {
      return parse_bool(t);
    } else if constexpr (std::is_integral_v<T>) {
      auto v = parse_int(t);
      if (!v) return std::unexpected(v.error());
      if (!std::in_range<T>(*v)) {
        return std::unexpected(Error{make_error_code(Errc::kBadValue), {}, "out of range"});
      }
      return static_cast<T>(*v);
    } else if constexpr (std::is_floating_point_v<T>) {
      auto v = parse_double(t);
      if (!v) return std::unexpected(v.error());
      // A finite value past T's range converts with undefined behaviour: an error, as for
      // integers (infinities and NaN stay what they are).
      if (std::isfinite(*v) &&
          (*v > std::numeric_limits<T>::max() || *v < std::numeric_limits<T>::lowest())) {
        return std::unexpected(Error{make_error_code(Errc::kBadValue), {}, "out of range"});
      }
      return static_cast<T>(*v);
    } else if constexpr (std::is_same_v<T, std::string>) {
      return std::string(t);
    } else if constexpr (std::is_same_v<T, std::vector<std::byte>>) {
      return parse_bytea(t);
    } else if constexpr (std::is_same_v<T, Timestamp>) {
      return parse_timestamp(t);
    } else {
      static_assert(sizeof(T) == 0, "Result::get: no reading for this type");
    }
  }
}

}  // namespace spindle::pg

template <>
struct std::is_error_code_enum<spindle::pg::Errc> : std::true_type {};
