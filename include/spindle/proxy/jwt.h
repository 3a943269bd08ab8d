#pragma once
/// JSON Web Tokens (RFC 7519) in JWS compact form (RFC 7515), checked against the keys of a
/// JWKS document (jwt_keys.h). No I/O: the keys are read when the configuration is loaded, and a
/// token is checked from its text and the time.

#include <cstdint>
#include <expected>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spindle/proxy/config.h"
#include "spindle/proxy/jwt_keys.h"

namespace spindle::proxy {

/// The claims of a checked token, by name: a string as it is, any other value as its JSON text.
using JwtClaims = std::vector<std::pair<std::string, std::string>>;

/// Checks compact JWS `token` with `config`'s keys at `now` (seconds since the epoch): the
/// algorithm (one of config.algorithms, and the key's), the signature, then exp and nbf (with
/// config.leeway), iss and aud when configured. Returns the claims named in config.kept_claims,
/// or why the token is refused (words for error_description; no secret in them).
std::expected<JwtClaims, std::string> verify_jwt(std::string_view token, const JwtConfig& config,
                                                 std::int64_t now);

}  // namespace spindle::proxy
