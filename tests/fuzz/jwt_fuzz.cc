// libFuzzer driver for JWT checking and JWKS reading. The first byte picks what the rest is:
//   0: a token, checked against fixed keys (an HS256 secret and an ES256 key);
//   1: a JWKS document, read;
//   2: a header and a payload (JSON, split at the first newline), signed here with the HS256
//      key and then checked: when the header names that key (alg HS256, no kid or kid "h")
//      the signature is good, so a refusal must come from what the token says, never "bad
//      signature" (which would mean the check reads the bytes it verifies differently from
//      how they were signed). A header naming another algorithm or key is refused for its
//      signature, rightly.
// Beyond "no crash, no sanitizer report": only std::runtime_error comes out of JWKS reading.
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fuzz_checks.h"
#include "spindle/proxy/jwt.h"

using namespace spindle::proxy;

namespace {

// 32 bytes of "A", and P-256's base point as a public key.
constexpr std::string_view kJwks = R"({"keys": [
  {"kty": "oct", "kid": "h", "k": "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE"},
  {"kty": "EC", "kid": "e", "crv": "P-256",
   "x": "axfR8uEsQkf4vOblY6RA8ncDfYEt6zOg9KE5RdiYwpY",
   "y": "T-NC4v4af5uO5-tKfA-eFivOM1drMV7Oy7ZAaDe_UfU"}]})";

std::string b64url(std::string_view in) {
  static constexpr char kDigits[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  unsigned bits = 0;
  int count = 0;
  for (unsigned char c : in) {
    bits = (bits << 8) | c;
    count += 8;
    while (count >= 6) {
      count -= 6;
      out += kDigits[(bits >> count) & 63];
    }
  }
  if (count > 0) out += kDigits[(bits << (6 - count)) & 63];
  return out;
}

const JwtConfig& config() {
  static const JwtConfig c = [] {
    JwtConfig made;
    made.keys = JwtKeys::parse(kJwks);
    made.kept_claims = {"sub", "role"};
    made.audiences = {"api"};
    return made;
  }();
  return c;
}

// True if `header` (JSON, read as verify_jwt reads it) names the HS256 key this driver signs
// with: alg HS256, and no kid (or an empty one, or not a string: verify_jwt ignores those) or
// the key's own.
bool names_our_key(std::string_view header) {
  auto json = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return false;
  auto alg = json.find("alg");
  if (alg == json.end() || !alg->is_string() || alg->get<std::string>() != "HS256") return false;
  auto kid = json.find("kid");
  return kid == json.end() || !kid->is_string() || kid->get<std::string>().empty() ||
         kid->get<std::string>() == "h";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      (void)verify_jwt(rest, config(), 1'700'000'000);
      break;
    case 1:
      try {
        (void)JwtKeys::parse(rest);
      } catch (const std::runtime_error&) {
      }
      break;
    default: {
      auto newline = rest.find('\n');
      if (newline == std::string_view::npos) return 0;
      std::string signed_part =
          b64url(rest.substr(0, newline)) + "." + b64url(rest.substr(newline + 1));
      unsigned char mac[EVP_MAX_MD_SIZE];
      unsigned length = 0;
      std::string key(32, 'A');
      HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(signed_part.data()), signed_part.size(), mac,
           &length);
      std::string token =
          signed_part + "." + b64url(std::string_view(reinterpret_cast<char*>(mac), length));
      auto result = verify_jwt(token, config(), 1'700'000'000);
      check(result || result.error() != "bad signature" || !names_our_key(rest.substr(0, newline)));
      break;
    }
  }
  return 0;
}
