#pragma once
/// base64url decoding (RFC 4648 §5), for HTTP2-Settings and JSON Web Tokens.

#include <optional>
#include <string>
#include <string_view>

namespace spindle {

/// How strictly base64url_decode reads.
enum class Base64Mode {
  /// Either alphabet (+/ or -_), padding allowed (what a peer may send in HTTP2-Settings).
  kLenient,
  /// The URL alphabet only, no padding, unused trailing bits zero: one text per value (what
  /// JWS requires, so that a signature has a single encoding).
  kStrict,
};

/// The bytes `in` encodes, or nullopt if it is not base64url (in the chosen mode).
std::optional<std::string> base64url_decode(std::string_view in,
                                            Base64Mode mode = Base64Mode::kLenient);

}  // namespace spindle
