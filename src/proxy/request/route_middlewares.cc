// The route middlewares that look at a request before it goes on: basic_auth, jwt, cors and
// traffic_split (route_middlewares.h).
#include "route_middlewares.h"

#include <crypt.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "spindle/http/rules.h"
#include "spindle/proxy/cors.h"
#include "spindle/proxy/jwt.h"

namespace spindle::proxy {

bool PasswordCheck::matches(std::string_view user, std::string_view password,
                            const std::string& hash) {
  std::string key = digest(fmt::format("{}\n{}\n{}", user, password, hash));
  {
    std::lock_guard guard(lock_);
    if (good_.contains(key)) return true;
  }
  bool ok = false;
  if (hash.starts_with("{SHA}")) {
    unsigned char sha[SHA_DIGEST_LENGTH];
    SHA1(reinterpret_cast<const unsigned char*>(password.data()), password.size(), sha);
    unsigned char encoded[64];
    int n = EVP_EncodeBlock(encoded, sha, sizeof sha);
    ok = std::string_view(reinterpret_cast<char*>(encoded), static_cast<std::size_t>(n)) ==
         std::string_view(hash).substr(5);
  } else {
    ok = pool_.run([password = std::string(password), hash] {
      crypt_data data{};
      const char* out = ::crypt_r(password.c_str(), hash.c_str(), &data);
      return out != nullptr && hash == out;
    });
  }
  if (ok) {
    std::lock_guard guard(lock_);
    if (good_.size() > 10'000) good_.clear();
    good_.insert(std::move(key));
  }
  return ok;
}

std::string PasswordCheck::digest(const std::string& text) {
  unsigned char sha[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), sha);
  return std::string(reinterpret_cast<char*>(sha), sizeof sha);
}

namespace detail {
namespace {

// `text` as an RFC 9110 quoted-string: '"' and '\\' escaped.
std::string quoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + '"';
}

// "a, b, c".
std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

// Whether `cors` lets pages from `origin` in.
bool cors_allows(const CorsConfig& cors, std::string_view origin) {
  return cors.any_origin || std::ranges::any_of(cors.origins, [&](const std::string& pattern) {
           return origin_matches(pattern, origin);
         });
}

// Marks an answer of a route with `cors` as one that depends on the request's Origin, whatever
// the Origin was (allowed, refused or none) and whoever answered: a cache keeps one copy per
// Origin, and never serves the copy without CORS fields to an origin that is allowed.
void vary_on_origin(http::HeaderMap& headers) {
  if (headers.has_token(http::token::kVary, "origin") || headers.has_token(http::token::kVary, "*"))
    return;
  headers.add_view("Vary", http::token::kVary, "Origin");
}

// The origin a CORS answer names: "*" when any will do and no credentials go along.
std::string_view cors_origin(const CorsConfig& cors, std::string_view origin) {
  return cors.any_origin && !cors.credentials ? std::string_view("*") : origin;
}

// The token in a request's `fields` for `jwt`: from its cookie, or Authorization: Bearer.
std::string_view bearer_token(const http::HeaderMap& fields, const JwtConfig& jwt) {
  if (!jwt.cookie.empty()) return find_cookie(fields, jwt.cookie).first;
  std::string_view authorization = fields.get(http::token::kAuthorization).value_or("");
  if (authorization.size() < 7 || !http::iequals(authorization.substr(0, 7), "bearer ")) return {};
  std::string_view token = authorization.substr(7);
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  return token;
}

}  // namespace

std::string claim_attribute(std::string_view claim) { return fmt::format("_claim:{}", claim); }

std::string auth_attribute(std::string_view field) { return fmt::format("_auth:{}", field); }

std::optional<std::string> authenticated_user(const http::HeaderMap& fields,
                                              const BasicAuthConfig& auth, PasswordCheck& check) {
  std::string_view value = fields.get(http::token::kAuthorization).value_or("");
  if (value.size() < 6 || !http::iequals(value.substr(0, 6), "basic ")) return std::nullopt;
  std::string_view encoded = value.substr(6);
  while (!encoded.empty() && encoded.front() == ' ') encoded.remove_prefix(1);
  if (encoded.empty() || encoded.size() > 1024 || encoded.size() % 4 != 0) return std::nullopt;
  std::string decoded(encoded.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(decoded.data()),
                          reinterpret_cast<const unsigned char*>(encoded.data()),
                          static_cast<int>(encoded.size()));
  if (n < 0) return std::nullopt;
  std::size_t padding = encoded.ends_with("==") ? 2 : encoded.ends_with('=') ? 1 : 0;
  decoded.resize(static_cast<std::size_t>(n) - padding);
  auto colon = decoded.find(':');
  if (colon == std::string::npos) return std::nullopt;
  std::string user = decoded.substr(0, colon);
  auto it = auth.users.find(user);
  if (it == auth.users.end()) return std::nullopt;
  if (!check.matches(user, std::string_view(decoded).substr(colon + 1), it->second)) {
    return std::nullopt;
  }
  return user;
}

namespace {

// The value of hex digit `c`, or -1.
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// True if the cookie name `raw` (a pair's text before '=') is `name` as frameworks read it:
// trimmed of spaces and tabs (Werkzeug, Go, Express), percent-escapes decoded (PHP).
bool cookie_named(std::string_view raw, std::string_view name) {
  raw = http::trim_ows(raw);
  if (raw == name) return true;
  if (raw.find('%') == std::string_view::npos) return false;
  std::string decoded;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const int high = i + 2 < raw.size() && raw[i] == '%' ? hex_value(raw[i + 1]) : -1;
    const int low = high < 0 ? -1 : hex_value(raw[i + 2]);
    if (low < 0) {
      decoded += raw[i];
      continue;
    }
    decoded += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return decoded == name;
}

}  // namespace

FoundCookie find_cookie(const http::HeaderMap& fields, std::string_view name) {
  FoundCookie found;
  for (const http::Field& f : fields) {
    if (f.token != &http::token::kCookie) continue;
    for (std::string_view rest = f.value; !rest.empty();) {
      std::string_view pair = rest.substr(0, rest.find(';'));
      rest = pair.size() < rest.size() ? rest.substr(pair.size() + 1) : std::string_view{};
      const std::size_t equals = pair.find('=');
      if (equals == std::string_view::npos || !cookie_named(pair.substr(0, equals), name)) continue;
      if (found.count++ == 0) found.first = http::trim_ows(pair.substr(equals + 1));
      std::string_view exact = pair.substr(0, equals);
      while (exact.starts_with(' ') || exact.starts_with('\t')) exact.remove_prefix(1);
      found.misspelt = found.misspelt || exact != name;
    }
  }
  return found;
}

std::string_view cookie_value(const http::Request& request, std::string_view name) {
  return find_cookie(request.headers(), name).first;
}

std::string_view split_pick(const http::Request& request, const TrafficSplitConfig& split,
                            std::string& set_cookie) {
  if (!split.cookie.empty()) {
    // A service whose weight went to 0 (a canary rolled back) is left by everyone, cookie or
    // not: its clients are picked again, and told by a new cookie.
    std::string_view named = cookie_value(request, split.cookie);
    for (const auto& share : split.shares) {
      if (share.service == named && share.weight > 0) return share.service;
    }
  }
  thread_local std::mt19937_64 random{std::random_device{}()};
  std::uint64_t total = 0;
  for (const auto& share : split.shares) total += share.weight;
  std::uint64_t ticket = random() % total;
  const TrafficSplitConfig::Share* picked = &split.shares.back();
  for (const auto& share : split.shares) {
    if (ticket < share.weight) {
      picked = &share;
      break;
    }
    ticket -= share.weight;
  }
  if (!split.cookie.empty()) {
    set_cookie =
        fmt::format("{}={}; Path=/; HttpOnly; SameSite=Lax", split.cookie, picked->service);
  }
  return picked->service;
}

bool is_preflight(const http::Request& request) {
  return request.method() == "OPTIONS" && !request.header(http::token::kOrigin).empty() &&
         !request.header(http::token::kAccessControlRequestMethod).empty();
}

http::Response answer_preflight(const http::Request& request, const CorsConfig& cors) {
  std::string_view origin = request.header(http::token::kOrigin);
  std::string_view method = request.header(http::token::kAccessControlRequestMethod);
  std::string_view asked = request.header(http::token::kAccessControlRequestHeaders);
  bool ok =
      cors_allows(cors, origin) && std::ranges::find(cors.methods, method) != cors.methods.end();
  // Every field it asks for must be allowed (names compared without regard to case).
  if (ok && !cors.any_header) {
    http::for_each_list_item(asked, [&](std::string_view name) {
      ok = std::ranges::any_of(cors.headers,
                               [&](const std::string& h) { return http::iequals(h, name); });
      return ok;
    });
  }
  if (!ok) return http::Response::error(403, "cross-origin request not allowed");
  http::Response response(204);
  response.headers.set("Access-Control-Allow-Origin", cors_origin(cors, origin));
  response.headers.set("Access-Control-Allow-Methods", joined(cors.methods));
  if (!asked.empty()) {
    response.headers.set("Access-Control-Allow-Headers",
                         cors.any_header ? std::string(asked) : joined(cors.headers));
  }
  response.headers.set("Access-Control-Max-Age", std::to_string(cors.max_age.count()));
  if (cors.credentials) response.headers.set("Access-Control-Allow-Credentials", "true");
  return response;
}

void add_cors_fields(const http::Request& request, const RouteConfig& route,
                     http::Response& response) {
  auto is_cors = [](const MiddlewareConfig& m) { return m.kind == MiddlewareConfig::Kind::kCors; };
  if (std::ranges::none_of(route.middlewares, is_cors)) return;
  vary_on_origin(response.headers);
  std::string_view origin = request.header(http::token::kOrigin);
  if (origin.empty() || is_preflight(request)) return;
  for (const MiddlewareConfig& m : route.middlewares) {
    if (!is_cors(m) || !cors_allows(m.cors, origin)) continue;
    response.headers.set("Access-Control-Allow-Origin", cors_origin(m.cors, origin));
    if (m.cors.credentials) response.headers.set("Access-Control-Allow-Credentials", "true");
    if (!m.cors.expose.empty()) {
      response.headers.set("Access-Control-Expose-Headers", joined(m.cors.expose));
    }
    return;
  }
}

std::optional<http::Response> check_jwt(http::Request& request, const http::HeaderMap& fields,
                                        const JwtConfig& jwt) {
  // Two cookies of the name: the gateway would verify one, the service behind it may read the
  // other (frameworks read the first; Django the last). One spelt otherwise: some read it as
  // the token, others as another cookie.
  if (!jwt.cookie.empty()) {
    if (FoundCookie found = find_cookie(fields, jwt.cookie); found.count > 1 || found.misspelt) {
      return http::Response::error(400,
                                   "more than one cookie of the token's name, or one misspelt");
    }
  }
  std::string_view token = bearer_token(fields, jwt);
  std::string challenge = fmt::format("Bearer realm={}", quoted(jwt.realm));
  if (token.empty()) {
    http::Response answer = http::Response::error(401, "a bearer token is required");
    answer.headers.set("WWW-Authenticate", challenge);
    return answer;
  }
  auto now = std::chrono::duration_cast<std::chrono::seconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  auto claims = verify_jwt(token, jwt, now);
  if (!claims) {
    http::Response answer = http::Response::error(401, "invalid token: " + claims.error());
    answer.headers.set("WWW-Authenticate",
                       fmt::format("{}, error=\"invalid_token\", error_description={}", challenge,
                                   quoted(claims.error())));
    return answer;
  }
  for (const auto& [name, value] : *claims) {
    request.set_attribute(claim_attribute(name), value);
    if (name == "sub") request.set_attribute("user", value);
  }
  return std::nullopt;
}

}  // namespace detail
}  // namespace spindle::proxy
