#pragma once
/// Request-target normalisation: the one path that routing, static files and the gateway all
/// see, and the one the gateway sends upstream. Applied once by the server's drivers (HTTP/1
/// and HTTP/2) before the router runs; pure (no I/O), in place, no allocation.
///
/// The rules (RFC 3986 §6.2.2 and §5.2.4), on the path only (the query is left as sent):
///   1. percent-encoded unreserved characters are decoded ("%41" -> "A", "%2e" -> "."), other
///      escapes are kept with upper-case hex ("%3f" -> "%3F"); a '%' not followed by two hex
///      digits is 400;
///   2. an encoded NUL ("%00") is 400; an encoded '/' or '\' ("%2F", "%5C") and a raw '\' are
///      400 by default (EscapedSlashes::kReject), or kept as they are (kKeep);
///   3. dot segments are removed ("/a/./b/../c" -> "/a/c"; never above the root);
///   4. with merge_slashes (the default), runs of '/' become one.
/// A '#' (a fragment never belongs in a request) is 400. The asterisk ("*") and authority
/// ("host:port", CONNECT) forms are left alone; the absolute form has its path normalised.

#include <cstddef>
#include <expected>
#include <string_view>

namespace spindle::http {

/// How request paths are normalised (ServerOptions::paths).
struct PathRules {
  /// What becomes of "%2F" and "%5C" (an encoded '/' or '\') and of a raw '\'.
  enum class EscapedSlashes {
    kReject,  ///< 400: the request is refused (the safe default, as Envoy's REJECT_REQUEST)
    kKeep,    ///< kept as sent: not a segment separator here. Unsafe in front of an upstream
              ///< that decodes them into separators itself (it would see another path).
  };
  EscapedSlashes escaped_slashes = EscapedSlashes::kReject;
  /// Runs of '/' become one ("//admin" routes and goes upstream as "/admin").
  bool merge_slashes = true;
};

/// Why a target cannot be normalised: answered with 400 and this reason.
struct TargetError {
  std::string_view reason;
};

/// Normalises the request target in `target[0, size)` in place (it never grows); returns its
/// new size, or why it is refused.
[[nodiscard]] std::expected<std::size_t, TargetError> normalize_target(char* target,
                                                                       std::size_t size,
                                                                       const PathRules& rules);

/// True if `path` (the path part of a target, without query) is already what
/// normalize_target would make of it: the common case, which costs one scan.
bool path_is_normal(std::string_view path, const PathRules& rules);

}  // namespace spindle::http
