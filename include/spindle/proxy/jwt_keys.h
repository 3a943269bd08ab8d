#pragma once
/// The keys of a JWKS document (RFC 7517), made into OpenSSL keys once, when the configuration is
/// read: HS256 (HMAC-SHA256), RS256 (RSA PKCS#1 v1.5 with SHA-256) and ES256 (ECDSA P-256 with
/// SHA-256). The configuration's readers parse them; a token's check (jwt.h) asks them whether a
/// signature is theirs. No I/O.

#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

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

  /// How many keys the document holds.
  std::size_t size() const { return keys_.size(); }

  /// What the keys say of a signature.
  enum class Signature { kVerified, kBad, kUnknownKid };

  /// Whether `signature` (as the token carries it: r||s for ES256) is that of `signed_part` by a
  /// key of algorithm `alg`, and of id `kid` unless it is empty (then any key of `alg`).
  Signature check(std::string_view signed_part, std::string_view signature, std::string_view alg,
                  std::string_view kid) const;

  struct Key;

 private:
  JwtKeys() = default;
  std::vector<std::unique_ptr<Key>> keys_;
};

}  // namespace spindle::proxy
