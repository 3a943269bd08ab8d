#pragma once
/// Error helpers shared by every layer: errno to std::error_code, and the Result alias.

#include <cerrno>
#include <expected>
#include <system_error>
#include <type_traits>

namespace spindle {

/// spindle's own error conditions (those std::errc has no name for).
enum class Errc {
  /// The peer closed the stream before the expected number of bytes arrived.
  kEndOfStream = 1,
};

/// The category of spindle::Errc codes ("spindle").
const std::error_category& spindle_category();

/// Makes a spindle::Errc into a std::error_code.
inline std::error_code make_error_code(Errc e) { return {static_cast<int>(e), spindle_category()}; }

/// The result type of fallible io/net/fiber calls.
template <typename T>
using Result = std::expected<T, std::error_code>;

/// Maps an errno value to a std::error_code in the generic (std::errc) category.
inline std::error_code errno_code(int err) { return {err, std::generic_category()}; }

/// The current errno as a std::error_code.
inline std::error_code last_errno() { return errno_code(errno); }

/// Makes a std::errc into a std::error_code.
inline std::error_code make_error(std::errc e) { return std::make_error_code(e); }

/// An unexpected<error_code> from a std::errc, for `return fail(std::errc::timed_out);`.
inline std::unexpected<std::error_code> fail(std::errc e) {
  return std::unexpected(std::make_error_code(e));
}

/// An unexpected<error_code> from an error_code.
inline std::unexpected<std::error_code> fail(std::error_code ec) { return std::unexpected(ec); }

/// An unexpected<error_code> from the current errno.
inline std::unexpected<std::error_code> fail_errno() { return std::unexpected(last_errno()); }

}  // namespace spindle

template <>
struct std::is_error_code_enum<spindle::Errc> : std::true_type {};
