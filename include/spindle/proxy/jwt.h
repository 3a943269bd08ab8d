#pragma once
/// JSON Web Tokens (RFC 7519) in JWS compact form (RFC 7515), checked against the keys of a
/// JWKS document (RFC 7517): HS256 (HMAC-SHA256), RS256 (RSA PKCS#1 v1.5 with SHA-256) and ES256
/// (ECDSA P-256 with SHA-256), by OpenSSL. No I/O: the keys are read when the configuration is
/// loaded, and a token is checked from its text and the time.

#include <cstdint>
#include <expected>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spindle/proxy/config.h"

namespace spindle::proxy {

/// The keys of a JWKS document.
class JwtKeys {
 public:
  /// Reads `json` ({"keys": [...]}): kty "oct" (k: the HMAC secret, at least 32 bytes), "RSA"
  /// (n, e: at least 2048 bits) and "EC" (crv P-256, x, y: a point on the curve); kid, alg and
  /// use (must be "sig") when given. Throws std::runtime_error naming the key and what is wrong.
  static std::shared_ptr<const JwtKeys> parse(std::string_view json);
  ~JwtKeys();
  JwtKeys(const JwtKeys&) = delete;
  JwtKeys& operator=(const JwtKeys&) = delete;

  std::size_t size() const { return keys_.size(); }

  struct Key;

 private:
  JwtKeys() = default;
  friend std::expected<std::vector<std::pair<std::string, std::string>>, std::string> verify_jwt(
      std::string_view, const JwtConfig&, std::int64_t);
  std::vector<std::unique_ptr<Key>> keys_;
};

/// The claims of a checked token, by name: a string as it is, any other value as its JSON text.
using JwtClaims = std::vector<std::pair<std::string, std::string>>;

/// Checks compact JWS `token` with `config`'s keys at `now` (seconds since the epoch): the
/// algorithm (one of config.algorithms, and the key's), the signature, then exp and nbf (with
/// config.leeway), iss and aud when configured. Returns the claims named in config.kept_claims,
/// or why the token is refused (words for error_description; no secret in them).
std::expected<JwtClaims, std::string> verify_jwt(std::string_view token, const JwtConfig& config,
                                                 std::int64_t now);

}  // namespace spindle::proxy
