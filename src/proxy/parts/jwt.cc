// JWT checking: a token taken apart, its algorithm and signature checked with the configured
// keys (jwt_keys.h), then its time and audience claims.

#include "spindle/proxy/jwt.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "spindle/base/base64.h"

namespace spindle::proxy {
namespace {

using Json = nlohmann::json;

// A compact JWS taken apart: the signed part's two JSON objects, and the signature's bytes.
struct Token {
  std::string_view signed_part;
  Json header;
  Json payload;
  std::string signature;
};

// `token` as header.payload.signature, each base64url, the first two JSON objects.
std::expected<Token, std::string> take_apart(std::string_view token) {
  auto first = token.find('.');
  auto second = first == std::string_view::npos ? first : token.find('.', first + 1);
  if (second == std::string_view::npos || token.find('.', second + 1) != std::string_view::npos) {
    return std::unexpected("malformed token");
  }
  auto header_text = base64url_decode(token.substr(0, first), Base64Mode::kStrict);
  auto payload_text =
      base64url_decode(token.substr(first + 1, second - first - 1), Base64Mode::kStrict);
  auto signature = base64url_decode(token.substr(second + 1), Base64Mode::kStrict);
  if (!header_text || !payload_text || !signature) return std::unexpected("malformed token");
  Token out{token.substr(0, second), Json::parse(*header_text, nullptr, false),
            Json::parse(*payload_text, nullptr, false), std::move(*signature)};
  if (!out.header.is_object() || !out.payload.is_object())
    return std::unexpected("malformed token");
  return out;
}

// The signature, with a key of the header's algorithm (one `config` accepts) and of its kid
// when it names one; "" if it holds.
std::string check_signature(const Token& token, const JwtConfig& config) {
  auto alg_it = token.header.find("alg");
  if (alg_it == token.header.end() || !alg_it->is_string()) return "malformed token";
  std::string alg = alg_it->get<std::string>();
  if (std::ranges::find(config.algorithms, alg) == config.algorithms.end()) {
    // (Not named: the reason goes into WWW-Authenticate, and the token's text is the client's.)
    return "algorithm not accepted";
  }
  if (token.header.contains("crit")) return "unsupported critical header";
  std::string kid;
  if (auto it = token.header.find("kid"); it != token.header.end() && it->is_string())
    kid = it->get<std::string>();
  switch (config.keys->check(token.signed_part, token.signature, alg, kid)) {
    case JwtKeys::Signature::kVerified:
      return "";
    case JwtKeys::Signature::kUnknownKid:
      return "unknown key id";
    case JwtKeys::Signature::kBad:
      break;
  }
  return "bad signature";
}

// exp and nbf at `now`, with config.leeway; "" if the token is valid now.
std::string check_time(const Json& payload, const JwtConfig& config, std::int64_t now) {
  auto number = [&](const char* name) -> std::expected<std::optional<double>, std::string> {
    auto it = payload.find(name);
    if (it == payload.end()) return std::nullopt;
    if (!it->is_number()) return std::unexpected(fmt::format("{} is not a number", name));
    return it->get<double>();
  };
  auto leeway = static_cast<double>(config.leeway.count());
  auto exp = number("exp");
  if (!exp) return exp.error();
  if (*exp && static_cast<double>(now) >= **exp + leeway) return "token expired";
  auto nbf = number("nbf");
  if (!nbf) return nbf.error();
  if (*nbf && static_cast<double>(now) + leeway < **nbf) return "token not valid yet";
  return "";
}

// iss and aud, when configured; "" if the token is for us.
std::string check_audience(const Json& payload, const JwtConfig& config) {
  if (!config.issuer.empty()) {
    auto it = payload.find("iss");
    if (it == payload.end() || !it->is_string() || it->get<std::string>() != config.issuer) {
      return "wrong issuer";
    }
  }
  if (config.audiences.empty()) return "";
  auto names = [&](const Json& v) {
    return v.is_string() &&
           std::ranges::find(config.audiences, v.get<std::string>()) != config.audiences.end();
  };
  auto it = payload.find("aud");
  bool ours =
      it != payload.end() && (it->is_array() ? std::ranges::any_of(*it, names) : names(*it));
  return ours ? "" : "wrong audience";
}

// A claim's value as a request field or a rate-limit key shows it.
std::string claim_text(const Json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

}  // namespace

std::expected<JwtClaims, std::string> verify_jwt(std::string_view text, const JwtConfig& config,
                                                 std::int64_t now) {
  auto token = take_apart(text);
  if (!token) return std::unexpected(token.error());
  std::string refused = check_signature(*token, config);
  if (refused.empty()) refused = check_time(token->payload, config, now);
  if (refused.empty()) refused = check_audience(token->payload, config);
  if (!refused.empty()) return std::unexpected(refused);
  JwtClaims claims;
  for (const std::string& name : config.kept_claims) {
    if (auto it = token->payload.find(name); it != token->payload.end())
      claims.emplace_back(name, claim_text(*it));
  }
  return claims;
}

}  // namespace spindle::proxy
