// The proxy: forwards a request that matched a route to a target of its service, streaming
// both bodies, retrying only when it is safe, and answering 502 / 503 / 504 itself when the
// upstream cannot.
#include <crypt.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <re2/re2.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <optional>
#include <random>
#include <unordered_set>

#include "client_identity.h"
#include "spindle/base/log.h"
#include "spindle/fiber/block_cache.h"
#include "spindle/fiber/buffer_pool.h"
#include "spindle/fiber/worker.h"
#include "spindle/http/rules.h"
#include "spindle/http/websocket.h"
#include "spindle/proxy/gateway.h"
#include "spindle/proxy/jwt.h"
#include "spindle/sync/blocking_pool.h"

namespace spindle::proxy {
namespace {

using http::ExchangeErrc;

// Request bodies up to this size are read whole before they are sent, and kept for a retry.
constexpr std::uint64_t kReplayLimit = 64 * 1024;
// What one read or write of a streamed body moves.
constexpr std::size_t kPiece = 64 * 1024;
// The part of a response body read before its head is sent.
constexpr std::size_t kFirstPiece = 16 * 1024;
// How long a request with `Expect: 100-continue` waits for the upstream's 100 before its body
// goes anyway (curl waits as long).
constexpr std::chrono::seconds kContinueWait{1};

// Random bits for ids (request ids, trace and span ids): splitmix64 over a per-thread seed
// from std::random_device. Ids must not repeat; they are not secrets.
std::uint64_t random_bits() {
  thread_local std::uint64_t state =
      (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The two lower-case hex digits of each byte value.
constexpr std::array<std::array<char, 2>, 256> kHexPairs = [] {
  constexpr char kHex[] = "0123456789abcdef";
  std::array<std::array<char, 2>, 256> pairs{};
  for (std::size_t b = 0; b < 256; ++b) pairs[b] = {kHex[b >> 4], kHex[b & 15]};
  return pairs;
}();

// Writes `digits` (a multiple of 16) random lower-case hex digits at `out`, two at a time.
void random_hex(char* out, std::size_t digits) {
  for (std::size_t done = 0; done < digits; done += 16) {
    std::uint64_t bits = random_bits();
    for (std::size_t i = 0; i < 8; ++i, bits >>= 8) {
      std::memcpy(out + done + 14 - 2 * i, kHexPairs[bits & 0xff].data(), 2);
    }
  }
}

// Text of at most N characters kept in place: ids made per request need no allocation.
template <std::size_t N>
struct InlineText {
  std::array<char, N> text;
  std::size_t size = 0;
  std::string_view view() const { return {text.data(), size}; }
  void assign(std::string_view s) {
    size = std::min(s.size(), N);
    std::memcpy(text.data(), s.data(), size);
  }
};

// A request id: 32 hex digits.
void new_request_id(InlineText<128>& out) {
  random_hex(out.text.data(), 32);
  out.size = 32;
}

// "1.1" for the HTTP version of a message (major * 10 + minor).
std::string_view version_text(int version) {
  return version == 20 ? "2" : version == 10 ? "1.0" : "1.1";
}

// Lower-case hex digits only.
bool lower_hex(std::string_view text) {
  return std::ranges::all_of(
      text, [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// The W3C traceparent to send upstream (https://www.w3.org/TR/trace-context/): the incoming
// trace id and flags with our own span id as the parent, or a new trace when the client sent
// none or one that does not parse. `restarted` says which.
void next_traceparent(std::optional<std::string_view> in, bool& restarted, InlineText<55>& out) {
  // VERSION-TRACEID-PARENTID-FLAGS, 2-32-16-2 hex digits; a later version may append fields.
  constexpr std::string_view kZeros = "00000000000000000000000000000000";
  bool valid = in && in->size() >= 55 && (in->size() == 55 || (*in)[55] == '-') &&
               (*in)[2] == '-' && (*in)[35] == '-' && (*in)[52] == '-' &&
               lower_hex(in->substr(0, 2)) && in->substr(0, 2) != "ff" &&
               lower_hex(in->substr(3, 32)) && in->substr(3, 32) != kZeros &&
               lower_hex(in->substr(36, 16)) && in->substr(36, 16) != kZeros.substr(0, 16) &&
               lower_hex(in->substr(53, 2)) && (in->substr(0, 2) != "00" || in->size() == 55);
  restarted = !valid;
  // 00-TRACE-SPAN-FLAGS: the client's trace and flags, or a new trace (flags 00).
  out.assign("00-00000000000000000000000000000000-0000000000000000-00");
  char* text = out.text.data();
  if (valid) {
    in->substr(3, 32).copy(text + 3, 32);
    in->substr(53, 2).copy(text + 53, 2);
  } else {
    random_hex(text + 3, 32);
  }
  random_hex(text + 36, 16);
}

// An incoming X-Request-Id worth keeping: short, and only characters safe in logs.
bool good_request_id(std::string_view id) {
  return !id.empty() && id.size() <= 128 && std::ranges::all_of(id, [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' ||
           c == '_' || c == '.';
  });
}

bool trusted(const ServerConfig& server, const http::RequestContext& context) {
  if (context.peer == nullptr) return false;
  return std::ranges::any_of(server.trusted_proxies,
                             [&](const Cidr& cidr) { return cidr.contains(*context.peer); });
}

// Where a request keeps its client once derived (not logged: their names start with '_').
constexpr std::string_view kClientAttribute = "_client";
constexpr std::string_view kForwardedForAttribute = "_forwarded_for";

// Derives the client of `request` (client_identity.h) once, and keeps it with the request:
// ip_allow, ip_deny, rate limits by client_ip and the X-Forwarded-For sent upstream all read it.
// When it is the peer as the connection names it (most requests), nothing is kept: each reader
// falls back to the connection's text.
void note_client(http::Request& request, const ServerConfig& server) {
  if (detail::client_is_the_peer(request.context(), server.trusted_proxies)) return;
  if (!request.attribute(kClientAttribute).empty()) return;
  detail::ClientIdentity client = detail::identify_client(request, server.trusted_proxies);
  request.set_attribute(kClientAttribute, client.text);
  request.set_attribute(kForwardedForAttribute, client.forwarded_for);
}

// The client of `request` as text, canonical (the peer's own text if note_client has not run).
std::string_view client_text(const http::Request& request) {
  std::string_view noted = request.attribute(kClientAttribute);
  return noted.empty() ? request.context().remote : noted;
}

// The request attribute that holds a checked JWT's claim (not logged: '_').
std::string claim_attribute(std::string_view claim) { return fmt::format("_claim:{}", claim); }

// The request attribute that holds a field forward_auth's service answered with.
std::string auth_attribute(std::string_view field) { return fmt::format("_auth:{}", field); }

// What a rate limit counts `request` by.
std::string rate_limit_key(const http::Request& request, const RateLimitConfig& limit) {
  switch (limit.key) {
    case RateLimitConfig::Key::kRoute:
      return "route";
    case RateLimitConfig::Key::kHeader:
      return "h:" + std::string(request.headers().get(limit.header).value_or(""));
    case RateLimitConfig::Key::kClaim:
      return "c:" + std::string(request.attribute(claim_attribute(limit.header)));
    case RateLimitConfig::Key::kClientIp:
      break;
  }
  return "ip:" + std::string(client_text(request));
}

}  // namespace

// Password checks for basic_auth. bcrypt is slow on purpose (milliseconds): it runs on helper
// threads while the worker serves on, and credentials found good are remembered (by a SHA-256
// of user, password and hash), so a client pays for it once.
class PasswordCheck {
 public:
  bool matches(std::string_view user, std::string_view password, const std::string& hash) {
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

 private:
  static std::string digest(const std::string& text) {
    unsigned char sha[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), sha);
    return std::string(reinterpret_cast<char*>(sha), sizeof sha);
  }
  BlockingPool pool_{2};
  std::mutex lock_;
  std::unordered_set<std::string> good_;
};

namespace {

// The user of a request's `Authorization: Basic` credentials, if `auth` knows them and the
// password is right.
std::optional<std::string> authenticated_user(const http::Request& request,
                                              const BasicAuthConfig& auth, PasswordCheck& check) {
  std::string_view value = request.header(http::token::kAuthorization);
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

// The value of cookie `name` in the request's Cookie fields ("" if none; the last one if
// several).
std::string_view cookie_value(const http::Request& request, std::string_view name) {
  std::string_view value;
  for (const http::Field& f : request.headers()) {
    if (f.token != &http::token::kCookie) continue;
    for (std::string_view rest = f.value; !rest.empty();) {
      std::string_view pair = rest.substr(0, rest.find(';'));
      rest = pair.size() < rest.size() ? rest.substr(pair.size() + 1) : std::string_view{};
      while (!pair.empty() && pair.front() == ' ') pair.remove_prefix(1);
      if (pair.starts_with(name) && pair.size() > name.size() && pair[name.size()] == '=') {
        value = pair.substr(name.size() + 1);
      }
    }
  }
  return value;
}

// The service a traffic_split sends `request` to: the one its sticky cookie names, or one
// picked by weight (then `set_cookie` gets the Set-Cookie value that keeps it).
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

// A request attribute name under which the tightest rate limit's decision waits for the
// response (RateLimit-* fields).
constexpr std::string_view kRateLimitShown = "ratelimit";

// "a, b, c".
std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

// A CORS preflight: OPTIONS with Origin and Access-Control-Request-Method.
bool is_preflight(const http::Request& request) {
  return request.method() == "OPTIONS" && !request.header(http::token::kOrigin).empty() &&
         !request.header(http::token::kAccessControlRequestMethod).empty();
}

// Whether `cors` lets pages from `origin` in.
bool cors_allows(const CorsConfig& cors, std::string_view origin) {
  return cors.any_origin || std::ranges::find(cors.origins, origin) != cors.origins.end();
}

// The origin a CORS answer names: "*" when any will do and no credentials go along.
std::string_view cors_origin(const CorsConfig& cors, std::string_view origin) {
  return cors.any_origin && !cors.credentials ? std::string_view("*") : origin;
}

// The answer to a CORS preflight: 204 with what the page may do, or 403.
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
  response.headers.add("Vary", "Origin");
  return response;
}

// The CORS fields of an answer to an actual (not preflight) cross-origin request.
void add_cors_fields(const http::Request& request, const RouteConfig& route,
                     http::Response& response) {
  std::string_view origin = request.header(http::token::kOrigin);
  if (origin.empty() || is_preflight(request)) return;
  for (const MiddlewareConfig& m : route.middlewares) {
    if (m.kind != MiddlewareConfig::Kind::kCors || !cors_allows(m.cors, origin)) continue;
    response.headers.set("Access-Control-Allow-Origin", cors_origin(m.cors, origin));
    if (m.cors.credentials) response.headers.set("Access-Control-Allow-Credentials", "true");
    if (!m.cors.expose.empty()) {
      response.headers.set("Access-Control-Expose-Headers", joined(m.cors.expose));
    }
    response.headers.add("Vary", "Origin");
    return;
  }
}

// The token of a request for `jwt`: from its cookie, or Authorization: Bearer.
std::string_view bearer_token(const http::Request& request, const JwtConfig& jwt) {
  if (!jwt.cookie.empty()) return cookie_value(request, jwt.cookie);
  std::string_view authorization = request.header(http::token::kAuthorization);
  if (authorization.size() < 7 || !http::iequals(authorization.substr(0, 7), "bearer ")) return {};
  std::string_view token = authorization.substr(7);
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  return token;
}

// jwt: nullopt when the request's token is good (its claims kept as attributes), else the 401
// of RFC 6750.
std::optional<http::Response> check_jwt(http::Request& request, const JwtConfig& jwt) {
  std::string_view token = bearer_token(request, jwt);
  std::string challenge = fmt::format("Bearer realm=\"{}\"", jwt.realm);
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
                       fmt::format("{}, error=\"invalid_token\", error_description=\"{}\"",
                                   challenge, claims.error()));
    return answer;
  }
  for (const auto& [name, value] : *claims) {
    request.set_attribute(claim_attribute(name), value);
    if (name == "sub") request.set_attribute("user", value);
  }
  return std::nullopt;
}

// The middlewares of `route` that may answer in the gateway's place, in order: rate limits
// (429), ip_allow / ip_deny (403), max_body (413 for a declared length), redirect, respond,
// cors preflights, basic_auth and jwt (401), forward_auth (through `authorize`, which asks the
// auth service). The first that answers ends the request: its response is moved into `answer`
// and true returned; false lets the request go on to the service. (An out-parameter, not an
// optional: g++ 12 zeroes all 2 KiB of an optional<Response> returned by name, which every
// proxied request paid.)
template <typename Authorize>
bool answer_first(http::Request& request, const RouteConfig& route,
                  const std::vector<std::shared_ptr<RateLimiter>>& limits, PasswordCheck& passwords,
                  Authorize&& authorize, http::Response& answer) {
  const RateLimiter* tightest = nullptr;
  RateLimiter::Decision shown;
  bool answered = false;
  // Takes `response` as the answer.
  auto answer_with = [&](http::Response&& response) -> http::Response& {
    answered = true;
    return answer = std::move(response);
  };
  for (std::size_t i = 0; i < route.middlewares.size() && !answered; ++i) {
    const MiddlewareConfig& m = route.middlewares[i];
    switch (m.kind) {
      case MiddlewareConfig::Kind::kRateLimit: {
        auto decision = limits[i]->take(rate_limit_key(request, m.rate_limit), Clock::now());
        if (tightest == nullptr || !decision.allowed || decision.remaining < shown.remaining) {
          tightest = limits[i].get();
          shown = decision;
        }
        if (decision.unavailable) {
          answer_with(http::Response::error(503, "rate limit store unavailable"))
              .headers.set("Retry-After", "1");
        } else if (!decision.allowed) {
          answer_with(http::Response::error(429, "rate limit exceeded"))
              .headers.set("Retry-After",
                           std::to_string(std::max<std::uint64_t>(
                               1, static_cast<std::uint64_t>(std::ceil(decision.retry_after)))));
        }
        break;
      }
      case MiddlewareConfig::Kind::kIpAllow:
      case MiddlewareConfig::Kind::kIpDeny: {
        auto address = Address::parse_host(client_text(request));
        bool listed = address && std::ranges::any_of(m.networks, [&](const Cidr& cidr) {
                        return cidr.contains(*address);
                      });
        if (listed == (m.kind == MiddlewareConfig::Kind::kIpDeny)) {
          answer_with(http::Response::error(403, "client address not allowed"));
        }
        break;
      }
      case MiddlewareConfig::Kind::kMaxBody:
        if (request.head().content_length && *request.head().content_length > m.max_body) {
          answer_with(http::Response::error(413, "request body larger than the route allows"));
        }
        break;
      case MiddlewareConfig::Kind::kRedirect: {
        const http::RequestContext& context = request.context();
        std::string_view authority = request.header(http::token::kHost);
        std::string_view host = authority;
        std::string_view port;
        if (auto colon = authority.rfind(':');
            colon != std::string_view::npos &&
            authority.find(']', colon) == std::string_view::npos) {
          host = authority.substr(0, colon);
          port = authority.substr(colon + 1);
        }
        std::string scheme = m.scheme.empty() ? (context.tls ? "https" : "http") : m.scheme;
        std::string location = scheme + "://" + (m.host.empty() ? std::string(host) : m.host);
        if (m.port != 0) {
          location += ":" + std::to_string(m.port);
        } else if (!port.empty() && m.scheme.empty() && m.host.empty()) {
          location += ":" + std::string(port);  // same scheme and host: same port
        }
        location += m.path.empty() ? std::string(request.target()) : m.path;
        answer_with(http::Response(m.status)).headers.set("Location", location);
        break;
      }
      case MiddlewareConfig::Kind::kRespond:
        answer_with(http::Response(m.status, m.body, m.content_type));
        break;
      case MiddlewareConfig::Kind::kCors:
        if (is_preflight(request)) answer_with(answer_preflight(request, m.cors));
        break;
      case MiddlewareConfig::Kind::kBasicAuth:
        if (auto user = authenticated_user(request, *m.basic_auth, passwords)) {
          request.set_attribute("user", *user);
        } else {
          answer_with(http::Response::error(401, "authentication required"))
              .headers.set("WWW-Authenticate", fmt::format("Basic realm=\"{}\", charset=\"UTF-8\"",
                                                           m.basic_auth->realm));
        }
        break;
      case MiddlewareConfig::Kind::kJwt:
        if (auto refused = check_jwt(request, *m.jwt)) answer_with(std::move(*refused));
        break;
      case MiddlewareConfig::Kind::kForwardAuth:
        if (auto refused = authorize(*m.forward_auth)) answer_with(std::move(*refused));
        break;
      default:
        break;
    }
  }
  if (tightest != nullptr) {
    request.set_attribute(kRateLimitShown,
                          fmt::format("{} {} {}", tightest->burst(), shown.remaining,
                                      static_cast<std::uint64_t>(std::ceil(shown.reset))));
  }
  return answered;
}

// The RateLimit-* fields (draft-ietf-httpapi-ratelimit-headers) of the route's tightest limit.
void add_rate_limit_fields(const http::Request& request, http::Response& response) {
  std::string_view text = request.attribute(kRateLimitShown);
  if (text.empty()) return;
  auto first = text.find(' ');
  auto second = text.find(' ', first + 1);
  response.headers.set("RateLimit-Limit", text.substr(0, first));
  response.headers.set("RateLimit-Remaining", text.substr(first + 1, second - first - 1));
  response.headers.set("RateLimit-Reset", text.substr(second + 1));
}

// The status the client gets when the exchange failed with `ec`.
int status_for(std::error_code ec) {
  if (ec == ExchangeErrc::kConnectTimeout || ec == ExchangeErrc::kFirstByteTimeout ||
      ec == ExchangeErrc::kReadTimeout || ec == ExchangeErrc::kWriteTimeout) {
    return 504;
  }
  if (ec == ExchangeErrc::kNoCapacity || ec == ExchangeErrc::kPreempted) return 503;
  if (ec == ExchangeErrc::kCancelled) return 499;  // the client went away (nginx's code)
  return 502;
}

// True if a failure says something about the target's health (not the client's doing, nor
// our own limits).
bool counts_against_target(std::error_code ec) {
  return ec != ExchangeErrc::kNoCapacity && ec != ExchangeErrc::kCancelled &&
         ec != ExchangeErrc::kPreempted && ec != std::errc::invalid_argument;
}

// Counts a request in flight to a target on this worker while it lives.
class InFlight {
 public:
  explicit InFlight(std::size_t& count) : count_(count) { ++count_; }
  ~InFlight() { --count_; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::size_t& count_;
};

// The request as it goes to the upstream: the client's fields less the hop-by-hop ones, plus
// the X-Forwarded-* family, Via and X-Request-Id. Shared with the response's producer (or a
// tunnel), which also keeps the request counted in flight to its target until it ends.
struct ForwardHead {
  // User-provided, so that make_shared does not zero the whole object (the head's inline
  // field storage is 2 KiB) before constructing it.
  ForwardHead() {}

  std::optional<InFlight> in_flight;
  http::RequestHead head;
  /// The target, once a middleware has rewritten it (head.target points here then).
  std::string target;
  std::string authority;
  /// The client's request id (one worth keeping), or one made here.
  InlineText<128> request_id;
  /// The W3C traceparent sent upstream.
  InlineText<55> traceparent;
  // Owns the values built here (the head's views point into them).
  std::string forwarded_for, forwarded_proto, forwarded_host, via;
  /// The Upgrade offered upstream: the client's tokens the route allows ("" for none).
  std::string upgrade;
  /// The Sec-WebSocket-Key sent upstream, made here for an HTTP/2 client's extended CONNECT.
  std::string websocket_key;
};

// Which targets a request has tried: a bit each for the first 64, a list beyond.
class TriedTargets {
 public:
  bool contains(std::size_t i) const {
    return i < 64 ? (low_ >> i) & 1 : std::ranges::find(high_, i) != high_.end();
  }
  void add(std::size_t i) {
    if (i < 64) {
      low_ |= std::uint64_t{1} << i;
    } else if (!contains(i)) {
      high_.push_back(i);
    }
  }

 private:
  std::uint64_t low_ = 0;
  std::vector<std::size_t> high_;
};

// A target of `upstream` by its balancer, among the healthy ones not tried yet; or, with
// fewer healthy targets than the panic threshold, among all not tried yet (`panic` says so).
std::optional<std::size_t> pick_target(Gateway::WorkerState& worker,
                                       const Gateway::Upstream& upstream, const TriedTargets& tried,
                                       std::uint64_t key_hash, bool* panic = nullptr) {
  // The worker's scratch list: nothing parks between filling it and the pick.
  auto now = coarse_now();  // ejections last seconds
  std::vector<TargetView>& views = worker.views;
  views.resize(upstream.targets.size());
  std::size_t healthy = 0;
  for (std::size_t i = 0; i < views.size(); ++i) {
    views[i] = TargetView{.weight = upstream.targets[i].config.weight,
                          .healthy = upstream.targets[i].health->healthy(now),
                          .in_flight = worker.in_flight[upstream.index][i],
                          .excluded = tried.contains(i)};
    healthy += views[i].healthy ? 1 : 0;
  }
  // Envoy's panic mode: when most targets look down, the checks (or the clients causing the
  // failures) are more likely wrong than the targets; keep spreading the load over all.
  bool panicking = healthy * 100 < upstream.config->panic_threshold * views.size();
  if (panicking) {
    for (TargetView& v : views) v.healthy = true;
  }
  if (panic != nullptr) *panic = panicking;
  return worker.balancers[upstream.index]->pick(views, key_hash);
}

// A failure of target `index` that says something about it (counts_against_target): counted
// by passive checking, which may eject the target, within the upstream's cap.
void note_target_failure(const Gateway::Upstream& upstream, std::size_t index, Metrics* metrics,
                         std::uint32_t series) {
  using Verdict = Gateway::Upstream::Verdict;
  Verdict verdict = upstream.record_failure(index, coarse_now());
  if (verdict == Verdict::kCounted) return;
  const Gateway::Target& target = upstream.targets[index];
  if (verdict == Verdict::kEjected) {
    log_warn("upstream {}: target {} failed {} times within {} ms: out for as long",
             upstream.config->name, target.label, upstream.config->passive_health.max_fails,
             upstream.config->passive_health.fail_timeout.count());
  } else {
    log_warn(
        "upstream {}: target {} is failing, but ejecting it would leave too few targets in "
        "(max_ejection_percent {}%, one always stays): it stays",
        upstream.config->name, target.label, upstream.config->passive_health.max_ejection_percent);
  }
  if (metrics != nullptr) metrics->record_ejection(series, verdict == Verdict::kWithheld);
}

// "0.412" for 412 microseconds.
std::string milliseconds_text(std::chrono::microseconds t) {
  auto us = static_cast<std::uint64_t>(std::max<std::int64_t>(t.count(), 0));
  char text[32];
  auto end = std::to_chars(text, text + 24, us / 1000).ptr;  // 20 digits at most; 4 follow
  *end++ = '.';
  unsigned fraction = us % 1000;
  *end++ = static_cast<char>('0' + fraction / 100);
  *end++ = static_cast<char>('0' + fraction / 10 % 10);
  *end++ = static_cast<char>('0' + fraction % 10);
  return std::string(text, end);
}

// True for an HTTP/1.1 request that asks to switch protocols (WebSocket): the connection may
// become a tunnel to the upstream.
bool wants_upgrade(const http::Request& request) {
  return request.context().major_version == 1 && request.minor_version() == 1 &&
         request.headers().contains(http::token::kUpgrade) &&
         request.headers().has_token(http::token::kConnection, "upgrade");
}

// The client's Upgrade tokens the route allows (RFC 9110 7.8: "name[/version]", a list over
// any number of field lines), into out.upgrade and an Upgrade field of the forwarded head. The
// others go nowhere: the request goes on as a plain one without them (h2c, above all, which
// would carry the client's HTTP/2 streams past every route).
void offer_upgrade(const http::Request& request, const RouteConfig& route, ForwardHead& out) {
  if (!wants_upgrade(request) || route.upgrades.empty()) return;
  for (const http::Field& f : request.headers()) {
    if (f.token != &http::token::kUpgrade) continue;
    http::for_each_list_item(f.value, [&](std::string_view token) {
      std::string_view name = token.substr(0, token.find('/'));
      bool allowed = std::ranges::any_of(
          route.upgrades, [&](const std::string& p) { return http::iequals(p, name); });
      if (!allowed) return;
      if (!out.upgrade.empty()) out.upgrade += ", ";
      out.upgrade += token;
    });
  }
  if (!out.upgrade.empty())
    out.head.headers.add_view("Upgrade", http::token::kUpgrade, out.upgrade);
}

// Why a 101 must not be passed on (nullopt: it may). It must switch to a protocol the request
// offered, and for WebSocket prove it read the request's key (RFC 6455 4.1): anything else
// would join the client to an upstream that speaks who knows what.
std::optional<std::string_view> switch_refused(const ForwardHead& out,
                                               const http::ClientResponseHead& answer) {
  if (out.upgrade.empty()) return "a 101 to a request that offered no upgrade";
  std::string_view chosen = http::trim_ows(answer.headers.get(http::token::kUpgrade).value_or(""));
  chosen = chosen.substr(0, chosen.find_first_of(", \t"));
  std::string_view name = chosen.substr(0, chosen.find('/'));
  bool offered = false;
  http::for_each_list_item(out.upgrade, [&](std::string_view token) {
    offered = http::iequals(token.substr(0, token.find('/')), name);
    return !offered;
  });
  if (name.empty() || !offered) return "a 101 to a protocol the request did not offer";
  if (http::iequals(name, "websocket")) {
    auto key = out.head.headers.get(http::token::kSecWebsocketKey);
    auto accept = answer.headers.get(http::token::kSecWebsocketAccept);
    if (!key || !accept || *accept != http::websocket_accept(*key)) {
      return "a WebSocket 101 without the Sec-WebSocket-Accept of the request's key";
    }
  }
  return std::nullopt;
}

// An HTTP/2 client's extended CONNECT (RFC 8441) as the HTTP/1.1 upgrade it stands for: GET,
// with Upgrade and, for WebSocket, a key made here (the 101's Accept is checked against it).
// False if the route does not allow the protocol.
bool extended_connect_as_upgrade(const http::Request& request, const RouteConfig& route,
                                 ForwardHead& out) {
  std::string_view protocol = request.head().protocol;
  bool allowed = std::ranges::any_of(
      route.upgrades, [&](const std::string& p) { return http::iequals(p, protocol); });
  if (!allowed) return false;
  out.head.method = "GET";
  out.head.content_length.reset();
  out.head.chunked = false;  // the stream's DATA are the tunnel's, not a body
  out.upgrade = std::string(protocol);
  out.head.headers.add_view("Upgrade", http::token::kUpgrade, out.upgrade);
  if (http::iequals(protocol, "websocket")) {
    out.head.headers.erase(http::token::kSecWebsocketKey);
    out.websocket_key = http::websocket_key();
    out.head.headers.add_view("Sec-WebSocket-Key", http::token::kSecWebsocketKey,
                              out.websocket_key);
    if (!out.head.headers.contains(http::token::kSecWebsocketVersion)) {
      out.head.headers.add_view("Sec-WebSocket-Version", http::token::kSecWebsocketVersion, "13");
    }
  }
  return true;
}

// Moves bytes both ways between a client and an upstream until either side closes, no byte
// has moved for `idle`, or `lifetime` has passed (0: no limit). Each side's close is passed on
// as a half-close; an error on either side ends both (abort).
void tunnel(http::TunnelEnd& client, http::TunnelEnd& upstream, std::string_view to_upstream,
            std::string_view to_client, std::chrono::milliseconds idle,
            std::chrono::milliseconds lifetime) {
  auto last = std::make_shared<Clock::time_point>(Clock::now());
  Deadline end = lifetime.count() > 0 ? Deadline::after(lifetime) : Deadline::never();
  if ((!to_upstream.empty() && !upstream.write(to_upstream, Deadline::after(idle))) ||
      (!to_client.empty() && !client.write(to_client, Deadline::after(idle)))) {
    client.abort();
    upstream.abort();
    return;
  }
  auto pump = [idle, last, end](http::TunnelEnd& from, http::TunnelEnd& to) {
    BufferPool::Buffer buffer = take_buffer();
    for (;;) {
      auto n = from.read(buffer.span(), earliest(Deadline::after(idle), end));
      if (!n && n.error() == std::errc::timed_out && Clock::now() - *last < idle &&
          !end.expired()) {
        continue;
      }
      if (n && *n == 0) break;
      if (!n || !to.write(std::string_view(buffer.span().data(), *n), Deadline::after(idle))) {
        // Idle too long, reset, or broken: the whole tunnel ends.
        from.abort();
        to.abort();
        return;
      }
      *last = Clock::now();
    }
    to.close_write();  // this side is done sending
  };
  auto back = spawn([&] { pump(upstream, client); });
  pump(client, upstream);
  back.join();
}

void build_head(const http::Request& request, const ServerConfig& server, ForwardHead& out) {
  const http::RequestContext& context = request.context();
  const http::HeaderMap& in = request.headers();
  bool from_proxy = trusted(server, context);
  // CONNECT names its authority as the target; otherwise Host does.
  out.authority = request.method() == "CONNECT"
                      ? std::string(request.target())
                      : std::string(in.get(http::token::kHost).value_or(""));
  if (out.authority.empty() && context.local != nullptr) out.authority = context.local->to_string();

  auto id = in.get(http::token::kXRequestId);
  if (id && good_request_id(*id)) {
    out.request_id.assign(*id);
  } else {
    new_request_id(out.request_id);
  }
  bool trace_restarted = false;
  next_traceparent(in.get(http::token::kTraceparent), trace_restarted, out.traceparent);
  // The client and the trusted proxies before us (note_client); anyone else's claim is gone.
  std::string_view forwarded_for = request.attribute(kForwardedForAttribute);
  out.forwarded_for = forwarded_for.empty() ? context.remote : forwarded_for;
  auto proto = in.get(http::token::kXForwardedProto);
  out.forwarded_proto = proto && from_proxy ? std::string(*proto) : context.tls ? "https" : "http";
  auto host = in.get(http::token::kXForwardedHost);
  out.forwarded_host = host && from_proxy ? std::string(*host) : out.authority;
  std::string_view version =
      version_text(context.major_version == 2 ? 20 : 10 + request.minor_version());
  auto via = in.get(http::token::kVia);
  out.via = via ? std::string(*via) + ", " : std::string();
  out.via.append(version).append(" spindle");

  http::RequestHead& head = out.head;
  head.method = request.method();
  head.target = request.target();
  head.content_length = request.head().content_length;
  head.chunked = request.head().chunked;
  // Connection (or Proxy-Connection) may name more hop-by-hop fields; most requests have none.
  http::NominatedFields nominated(in);
  for (const http::Field& f : in) {
    // Hop-by-hop fields stay here. The client's Connection field never goes: the fields it
    // names would be dropped upstream, and it may name those added here (X-Forwarded-For,
    // Via, ...). Its Upgrade goes only as offer_upgrade allows.
    // Fields the proxy sets itself: the client's own are dropped (those of a trusted proxy are
    // folded into ours).
    if (!http::forwardable(f, nominated, http::FieldsFor::kProxiedRequest)) {
      bool te_trailers = f.token == &http::token::kTe && http::list_has_token(f.value, "trailers");
      if (!te_trailers) continue;
    }
    // A trace started again here drops the old trace's vendor state.
    if (trace_restarted && f.token == &http::token::kTracestate) continue;
    head.headers.add_view(f);
  }
  head.headers.add_view("X-Forwarded-For", http::token::kXForwardedFor, out.forwarded_for);
  head.headers.add_view("X-Forwarded-Proto", http::token::kXForwardedProto, out.forwarded_proto);
  if (!out.forwarded_host.empty())
    head.headers.add_view("X-Forwarded-Host", http::token::kXForwardedHost, out.forwarded_host);
  head.headers.add_view("Via", http::token::kVia, out.via);
  head.headers.add_view("X-Request-Id", http::token::kXRequestId, out.request_id.view());
  head.headers.add_view("traceparent", http::token::kTraceparent, out.traceparent.view());
  // The upstream says whether the body is wanted (send_body waits for its word).
  if (request.head().expect_continue)
    head.headers.add_view("Expect", http::token::kExpect, "100-continue");
}

void apply_edits(const HeaderEdits& edits, http::HeaderMap& headers) {
  for (const std::string& name : edits.remove) headers.erase(name);
  for (const auto& [name, value] : edits.set) headers.set(name, value);
  for (const auto& [name, value] : edits.add) headers.add(name, value);
}

// The route's middlewares, in order, on the request as it will go upstream.
void apply_request_middlewares(const http::Request& request, const RouteConfig& route,
                               ForwardHead& out) {
  for (const MiddlewareConfig& m : route.middlewares) {
    switch (m.kind) {
      case MiddlewareConfig::Kind::kForwardAuth:
        // The auth service's fields replace any the client sent under those names.
        for (const std::string& field : m.forward_auth->response_headers) {
          out.head.headers.erase(field);
          std::string_view value = request.attribute(auth_attribute(field));
          if (!value.empty()) out.head.headers.set(field, value);
        }
        break;
      case MiddlewareConfig::Kind::kJwt:
        // Claims to fields: whatever the client sent under those names goes.
        for (const auto& [claim, field] : m.jwt->claims_to_headers) {
          out.head.headers.erase(field);
          std::string_view value = request.attribute(claim_attribute(claim));
          if (!value.empty() && http::is_field_value(value)) out.head.headers.set(field, value);
        }
        break;
      case MiddlewareConfig::Kind::kHeaders:
        apply_edits(m.request, out.head.headers);
        break;
      case MiddlewareConfig::Kind::kStripPrefix: {
        // "/api/users?x" less "/api" is "/users?x"; "/api" alone becomes "/"; "/apix" stays.
        std::string_view target = out.head.target;
        if (!target.starts_with(m.prefix)) break;
        std::string_view rest = target.substr(m.prefix.size());
        if (!rest.empty() && rest.front() != '/' && rest.front() != '?') break;
        out.target =
            rest.empty() || rest.front() == '?' ? "/" + std::string(rest) : std::string(rest);
        out.head.target = out.target;
        break;
      }
      case MiddlewareConfig::Kind::kAddPrefix:
        out.target = m.prefix + std::string(out.head.target);
        out.head.target = out.target;
        break;
      case MiddlewareConfig::Kind::kReplacePath:
      case MiddlewareConfig::Kind::kReplacePathRegex: {
        // The path changes; the query stays.
        std::string_view target = out.head.target;
        auto question = target.find('?');
        std::string path(target.substr(0, question));
        std::string_view query =
            question == std::string_view::npos ? std::string_view() : target.substr(question);
        if (m.kind == MiddlewareConfig::Kind::kReplacePath) {
          path = m.replacement;
        } else if (!RE2::Replace(&path, *m.regex, m.replacement)) {
          break;  // no match: the target stays
        }
        if (!path.starts_with('/')) path.insert(0, "/");
        out.target = path + std::string(query);
        out.head.target = out.target;
        break;
      }
      default:
        break;  // the others answer before the request is forwarded (answer_first)
    }
  }
}

// Writes a small body whole, or streams a large one from the client. `first` keeps the piece
// read but not yet accepted by the upstream, so that an attempt that failed before it took
// any byte can be made again with it.
struct BodyState {
  bool unread = false;           // the client waits for 100 Continue: its body is not read yet
  bool replayable = true;        // the whole body is in `kept`
  std::string kept;              // the whole body (replayable) or the piece not yet sent
  bool streamed_beyond = false;  // bytes beyond `kept` went to an upstream: no retry
  bool complete = false;         // the client's whole body has been read
};

// Reads the client's body into `into` until it ends or holds more than `limit` bytes; true if
// it ended (throws HttpError as Request::read does).
bool read_up_to(http::Request& request, std::uint64_t limit, std::string& into) {
  std::string piece(kPiece, '\0');
  while (into.size() <= limit) {
    std::size_t n = request.read(piece);
    if (n == 0) return true;
    into.append(piece, 0, n);
  }
  return false;
}

Result<void> send_body(http::Request& request, http::ClientExchange& exchange, BodyState& body,
                       bool has_body, std::optional<std::uint64_t> max_body) {
  auto too_large = [&] { throw http::HttpError(413, "request body larger than the route allows"); };
  if (!has_body) return exchange.finish();
  if (body.unread) {
    // The client's body comes only after a 100 Continue, and that goes only if the upstream
    // wants the body: a refusal (401, 413, 417) then costs no upload.
    auto go = exchange.await_continue(kContinueWait);
    if (!go) return fail(go.error());
    if (!*go) return {};  // its final answer came first: read_head() has it
    if (body.replayable) {
      body.kept = request.body();  // the server's 100 goes out here
      body.complete = true;
    }
    body.unread = false;
  }
  if (max_body && body.kept.size() > *max_body) too_large();
  if (body.replayable) {
    if (auto w = exchange.write(body.kept); !w) return w;
    return exchange.finish();
  }
  if (!body.kept.empty()) {
    if (auto w = exchange.write(body.kept); !w) return w;
  }
  std::string piece(kPiece, '\0');
  std::uint64_t total = body.kept.size();
  for (;;) {
    std::size_t n = request.read(piece);  // throws HttpError: the client's body failed
    if (n == 0) {
      body.complete = true;
      break;
    }
    total += n;
    if (max_body && total > *max_body) too_large();  // a chunked body, past the limit
    body.streamed_beyond = true;
    if (auto w = exchange.write(std::string_view(piece).substr(0, n)); !w) return w;
  }
  return exchange.finish();
}

}  // namespace

Proxy::Proxy(Gateways& gateways, http::UpstreamConnections& connections, Metrics* metrics)
    : gateways_(gateways),
      connections_(connections),
      metrics_(metrics),
      passwords_(std::make_unique<PasswordCheck>()),
      mirrors_in_flight_(gateways.runtime().size()) {}

Proxy::~Proxy() {
  // Copies still on their way use the connections: they end within twice their timeout.
  (void)mirrors_.wait(Deadline::never(), false);
}

bool Proxy::finish_mirrors(Deadline deadline) { return !mirrors_.wait(deadline, false); }

namespace {

// A copy of a request for mirror, owning all it needs once the request is gone.
struct MirrorCopy {
  MirrorCopy() {}  // (not value-initialised: the head's inline field storage is large)
  std::string method, target, authority, body;
  http::RequestHead head;
};

// The way back: the route's middlewares in reverse order. Apart from the middleware's lambda
// (and never inlined into it): a compressed response is a second Response (2 KiB) that every
// request would otherwise carry room for on its fiber's stack while it waits.
[[gnu::noinline]] void on_the_way_back(const RouteConfig& route, http::Request& request,
                                       http::Response& response) {
  for (auto m = route.middlewares.rbegin(); m != route.middlewares.rend(); ++m) {
    if (m->kind == MiddlewareConfig::Kind::kHeaders) {
      apply_edits(m->response, response.headers);
    } else if (m->kind == MiddlewareConfig::Kind::kCompression) {
      response = (*m->compress)(request, [&](http::Request&) { return std::move(response); });
    }
  }
}

}  // namespace

void Proxy::mirror(http::Request& request, const std::shared_ptr<Gateway>& gateway,
                   const ServerConfig& server, const RouteConfig& route,
                   const MirrorConfig& config) {
  std::size_t& in_flight = mirrors_in_flight_[Worker::current()->index()];
  if (config.percent < 100) {
    thread_local std::minstd_rand random(std::random_device{}());
    if (std::uniform_real_distribution<double>(0, 100)(random) >= config.percent) return;
  }
  // A body goes along only when it is small and already due (no 100-continue to wait for):
  // the copy must never make the request wait.
  const http::RequestHead& in = request.head();
  bool has_body = in.chunked || in.content_length.value_or(0) > 0;
  if (has_body && (in.chunked || *in.content_length > kReplayLimit || in.expect_continue)) {
    request.set_attribute("mirror", "skipped");
    return;
  }
  if (in_flight >= config.max_in_flight) {
    request.set_attribute("mirror", "dropped");
    return;
  }
  auto built = std::allocate_shared<ForwardHead>(BlockAllocator<ForwardHead>());
  build_head(request, server, *built);
  apply_request_middlewares(request, route, *built);
  auto copy = std::make_shared<MirrorCopy>();
  copy->method = built->head.method;
  copy->target = built->head.target;
  copy->authority = built->authority;
  copy->head.method = copy->method;
  copy->head.target = copy->target;
  for (const http::Field& f : built->head.headers) {
    if (f.token != &http::token::kExpect) copy->head.headers.add(f);
  }
  if (has_body) {
    copy->body = request.body();
    copy->head.content_length = copy->body.size();
  }
  request.set_attribute("mirror", "sent");
  ++in_flight;
  mirrors_.add();
  spawn([this, gateway, copy, &config, &in_flight] {
    const Gateway::Service* service = gateway->service(config.service);
    const Gateway::Upstream& upstream = *service->upstream;
    // Each wait is bounded by the mirror's timeout, and the copy as a whole too (checked
    // between reads): an upstream that trickles its answer holds a slot for twice that at most.
    Deadline overall = Deadline::after(config.timeout);
    http::ExchangeTimeouts timeouts = service->timeouts;
    for (auto* t : {&timeouts.connect, &timeouts.first_byte, &timeouts.read, &timeouts.write}) {
      *t = std::min(*t, config.timeout);
    }
    if (auto pick = pick_target(gateway->worker_state(), upstream, TriedTargets(), 0)) {
      const Gateway::Target& target = upstream.targets[*pick];
      auto opened = connections_.open(target.endpoint, copy->head, copy->authority, timeouts,
                                      upstream.limits);
      if (opened) {
        auto& exchange = **opened;
        bool sent = (copy->body.empty() || exchange.write(copy->body)) && exchange.finish();
        bool whole = false;
        if (sent && exchange.read_head()) {
          char sink[4096];
          while (!overall.expired()) {
            auto n = exchange.read(sink);
            if (!n || *n == 0) {
              whole = n.has_value();
              break;
            }
          }
        }
        if (!whole) exchange.cancel();  // what is left of it is not waited for, nor pooled
      }
    }
    --in_flight;
    mirrors_.done();
  }).detach();
}

http::Middleware Proxy::middleware(std::string server_key) {
  std::uint32_t unrouted = metrics_ ? metrics_->request_series(server_key, "") : 0;
  return [this, server_key = std::move(server_key), unrouted](
             http::Request& request, const http::Next& next) -> http::Response {
    // From when its bytes came in (the poll that woke the connection, not a clock read of
    // its own): what a client waited for, and a clock read less a request.
    auto began = metrics_ ? Worker::last_poll_time() : Clock::time_point{};
    const std::shared_ptr<Gateway>& current = gateways_.current();
    const Gateway::Server* server = current ? current->server(server_key) : nullptr;
    const RouteConfig* route = nullptr;
    if (server != nullptr && server->routes.size() != 0) {
      // An extended CONNECT (RFC 8441) routes as the GET upgrade it stands for.
      std::string_view method = request.head().protocol.empty() ? request.method() : "GET";
      route = server->routes.select(request.header(http::token::kHost), request.target(), method,
                                    request.headers());
    }
    // A routed request keeps a copy of the snapshot (and of the route it points into), even if
    // a new one is published while it runs; one no route takes needs none (the copy's
    // count is atomic: two locked instructions).
    std::shared_ptr<Gateway> gateway = route ? current : nullptr;
    // Built in place (a response is a few KiB: each move of one shows per request).
    http::Response response = route ? on_route(request, gateway, *server, *route) : next(request);
    if (route && !route->middlewares.empty()) on_the_way_back(*route, request, response);
    if (metrics_) {
      std::uint32_t series = unrouted;
      if (route && !server->route_series.empty()) {
        series =
            server->route_series[static_cast<std::size_t>(route - gateway->config().routes.data())];
      }
      metrics_->record_request(series, response.status,
                               std::chrono::duration<double>(Clock::now() - began).count());
    }
    return response;
  };
}

http::Response Proxy::on_route(http::Request& request, const std::shared_ptr<Gateway>& gateway,
                               const Gateway::Server& server, const RouteConfig& route) {
  note_client(request, *server.config);
  if (route.middlewares.empty()) return pass_on(request, gateway, server, route);
  return through_middlewares(request, gateway, server, route);
}

[[gnu::noinline]] http::Response Proxy::through_middlewares(http::Request& request,
                                                            const std::shared_ptr<Gateway>& gateway,
                                                            const Gateway::Server& server,
                                                            const RouteConfig& route) {
  http::Response response;
  if (!answer_first(
          request, route,
          gateway->rate_limits(static_cast<std::size_t>(&route - gateway->config().routes.data())),
          *passwords_,
          [&](const ForwardAuthConfig& auth) { return authorize(request, gateway, auth); },
          response)) {
    response = pass_on(request, gateway, server, route);
  }
  add_rate_limit_fields(request, response);
  add_cors_fields(request, route, response);
  return response;
}

http::Response Proxy::pass_on(http::Request& request, const std::shared_ptr<Gateway>& gateway,
                              const Gateway::Server& server, const RouteConfig& route) {
  for (const MiddlewareConfig& m : route.middlewares) {
    if (m.kind == MiddlewareConfig::Kind::kMirror) {
      mirror(request, gateway, *server.config, route, m.mirror);
    }
  }
  // A traffic_split picks the service; otherwise the route names it.
  std::string_view service = route.service;
  std::string set_cookie;
  for (const MiddlewareConfig& m : route.middlewares) {
    if (m.kind == MiddlewareConfig::Kind::kTrafficSplit) {
      service = split_pick(request, m.traffic_split, set_cookie);
    }
  }
  http::Response response = forward(request, gateway, server, route, service);
  if (!set_cookie.empty()) response.headers.add("Set-Cookie", set_cookie);
  return response;
}

std::optional<http::Response> Proxy::authorize(http::Request& request,
                                               const std::shared_ptr<Gateway>& gateway,
                                               const ForwardAuthConfig& auth) {
  const Gateway::Service* service = gateway->service(auth.service);
  const Gateway::Upstream& upstream = *service->upstream;
  auto unavailable = [&](std::string_view why) {
    log_warn("forward_auth: service {}: {}: answered 503", auth.service, why);
    return http::Response::error(503, "authentication service unavailable");
  };
  auto pick = pick_target(gateway->worker_state(), upstream, TriedTargets(), 0);
  if (!pick) return unavailable("no healthy target");
  const Gateway::Target& target = upstream.targets[*pick];

  // GET path, with the client's fields (those chosen, never those about its body or the
  // connection) and what the request was: X-Forwarded-Method, -Proto, -Host, -Uri, -For.
  http::RequestHead head;
  head.method = "GET";
  head.target = auth.path;
  const http::HeaderMap& in = request.headers();
  http::NominatedFields nominated(in);
  for (const http::Field& f : in) {
    if (!http::forwardable(f, nominated, http::FieldsFor::kAuthRequest)) continue;
    if (!auth.request_headers.empty() &&
        std::ranges::none_of(auth.request_headers,
                             [&](const std::string& n) { return http::iequals(n, f.name); })) {
      continue;
    }
    head.headers.add_view(f);
  }
  const http::RequestContext& context = request.context();
  std::string client(client_text(request));
  head.headers.add_view("X-Forwarded-Method", request.method());
  head.headers.add_view("X-Forwarded-Proto", http::token::kXForwardedProto,
                        context.tls ? "https" : "http");
  head.headers.add_view("X-Forwarded-Host", http::token::kXForwardedHost,
                        request.header(http::token::kHost));
  head.headers.add_view("X-Forwarded-Uri", request.target());
  head.headers.add_view("X-Forwarded-For", http::token::kXForwardedFor, client);
  std::string authority = target.label;

  // (Sent again, as a forwarded request is, when the service closing a connection turned it
  // away unprocessed: http::resend_turned_away.)
  std::shared_ptr<http::ClientExchange> exchange;
  Result<const http::ClientResponseHead*> got = std::unexpected(std::error_code());
  for (unsigned turned_away = 0;;) {
    auto opened =
        connections_.open(target.endpoint, head, authority, service->timeouts, upstream.limits);
    if (!opened) {
      if (counts_against_target(opened.error())) {
        note_target_failure(upstream, *pick, metrics_, service->series);
      }
      return unavailable(opened.error().message());
    }
    exchange = std::move(*opened);
    auto finished = exchange->finish();
    got = finished ? exchange->read_head() : std::unexpected(finished.error());
    if (got || !http::resend_turned_away(got.error(), turned_away)) break;
    if (metrics_) metrics_->record_resend(service->series);
  }
  if (!got) {
    if (counts_against_target(got.error())) {
      note_target_failure(upstream, *pick, metrics_, service->series);
    }
    return unavailable(got.error().message());
  }
  const http::ClientResponseHead& answer = **got;
  // Its body: what a refusal says (a login page, say), at most 64 KiB.
  constexpr std::size_t kMaxBody = 64 * 1024;
  std::string body;
  char piece[4096];
  for (;;) {
    auto n = exchange->read(piece);
    if (!n) return unavailable(n.error().message());
    if (*n == 0) break;
    if (body.size() + *n > kMaxBody) return unavailable("an answer larger than 64 KiB");
    body.append(piece, *n);
  }
  target.health->record_success();
  if (answer.status >= 200 && answer.status < 300) {
    for (const std::string& field : auth.response_headers) {
      if (auto value = answer.headers.get(field))
        request.set_attribute(auth_attribute(field), *value);
    }
    return std::nullopt;
  }
  // A refusal (401, 403, a redirect to a login page, ...) is the client's answer as it is.
  http::Response refusal(answer.status);
  for (const http::Field& f : answer.headers) {
    if (f.token == &http::token::kContentLength) continue;
    refusal.headers.add(f);
  }
  refusal.body = std::move(body);
  return refusal;
}

namespace {

// One request on its way through Proxy::forward, and the steps of its way: the head made for
// the upstream (prepare), the body read as far as it may be kept (take_body), then attempts
// until a target answers or the retries run out (run): each picks a target, exchanges with it
// (exchange_with) and either answers the client (open_tunnel, pass_response) or tries again
// (retry_allowed); when none answered, give_up says why.
class Forwarding {
 public:
  Forwarding(http::Request& request, const std::shared_ptr<Gateway>& gateway,
             const Gateway::Server& server, const RouteConfig& route,
             const Gateway::Service& service, http::UpstreamConnections& connections,
             Metrics* metrics)
      : request_(request),
        gateway_(gateway),
        server_(server),
        route_(route),
        service_(service),
        upstream_(*service.upstream),
        retries_(service.config->retries),
        worker_(gateway->worker_state()),
        budget_(worker_.budgets[service.index]),
        connections_(connections),
        metrics_(metrics) {}

  // Why a request cannot go on this route: the error the client is answered.
  struct Refusal {
    int status;
    std::string detail;
  };
  // The head for the upstream, with the route's middlewares and upgrades applied; a refusal
  // instead when the request cannot go on this route. (Not a Response: a Response is 2 KiB,
  // and every proxied request's fiber would carry room for one more on its stack.)
  std::optional<Refusal> prepare();
  // Reads a body up to request_buffering before any target is chosen: it can be sent again,
  // and a client that dawdles costs no upstream anything. A chunked one is read that far to
  // see whether it ends within it.
  void take_body();
  // Attempts until a target answers (what the client then gets) or none may be tried again.
  http::Response run();

 private:
  // What one attempt got: the upstream's response head (on `exchange`), or why not.
  struct Attempt {
    std::shared_ptr<http::ClientExchange> exchange;
    const http::ClientResponseHead* head = nullptr;
    std::error_code failure;
  };
  Attempt exchange_with(const Gateway::Target& target);
  // True if an attempt that failed or was answered 502/503 is tried again: `safe` to send
  // again, attempts left, and a retry in the budget (spent here).
  bool retry_allowed(bool safe, unsigned attempt);
  // 101 (or CONNECT's 2xx): the connection becomes a tunnel between client and upstream.
  http::Response open_tunnel(const Gateway::Target& target, Attempt& attempt);
  // The upstream's response: its fields and its body, streamed to the client as it comes.
  http::Response pass_response(const Gateway::Target& target, Attempt& attempt,
                               Clock::duration first_byte_time);
  // No target answered: the last failure, as a status.
  http::Response give_up();

  http::Request& request_;
  const std::shared_ptr<Gateway>& gateway_;
  const Gateway::Server& server_;
  const RouteConfig& route_;
  const Gateway::Service& service_;
  const Gateway::Upstream& upstream_;
  const RetryPolicy& retries_;
  Gateway::WorkerState& worker_;
  Gateway::WorkerState::Budget& budget_;
  http::UpstreamConnections& connections_;
  Metrics* metrics_;

  std::shared_ptr<ForwardHead> forward_head_;
  // CONNECT becomes a tunnel through the upstream (an HTTP proxy) once it answers 2xx.
  bool connect_ = false;
  // An HTTP/2 client's extended CONNECT (RFC 8441), sent upstream as an HTTP/1.1 upgrade.
  bool extended_connect_ = false;
  // What the access log shows of the proxying: noted only for a server that writes one.
  bool logged_ = false;
  bool has_body_ = false;
  bool idempotent_ = false;
  // The smallest max_body of the route's middlewares, for a body without a length.
  std::optional<std::uint64_t> route_max_body_;
  BodyState body_;
  // The key consistent_hash hashes.
  std::uint64_t key_hash_ = 0;
  // The last attempt's failure and target, and whether its connection was a pooled one.
  std::error_code last_error_;
  std::string_view last_target_;
  bool last_reused_ = false;
};

std::optional<Forwarding::Refusal> Forwarding::prepare() {
  // Only an HTTP/1.1 connection can be taken over for CONNECT's tunnel.
  connect_ = request_.method() == "CONNECT" && request_.head().protocol.empty();
  if (connect_ && request_.context().major_version != 1) {
    return Refusal{501, "CONNECT is forwarded from HTTP/1.1 clients only"};
  }
  for (const MiddlewareConfig& m : route_.middlewares) {
    if (m.kind == MiddlewareConfig::Kind::kMaxBody) {
      route_max_body_ = std::min(route_max_body_.value_or(m.max_body), m.max_body);
    }
  }
  forward_head_ = std::allocate_shared<ForwardHead>(BlockAllocator<ForwardHead>());
  build_head(request_, *server_.config, *forward_head_);
  apply_request_middlewares(request_, route_, *forward_head_);
  // Upgrades go only where the route allows them.
  extended_connect_ = !request_.head().protocol.empty();
  if (extended_connect_) {
    if (!extended_connect_as_upgrade(request_, route_, *forward_head_)) {
      return Refusal{501,
                     fmt::format("no upgrade to '{}' on this route", request_.head().protocol)};
    }
    if (upstream_.protocol != http::WireProtocol::kHttp1) {
      return Refusal{501, "an extended CONNECT goes to HTTP/1.1 services only"};
    }
  } else {
    offer_upgrade(request_, route_, *forward_head_);
  }
  logged_ = server_.config->access_log.enabled;
  if (logged_) {
    request_.set_attribute("route", route_.name);
    request_.set_attribute("request_id", forward_head_->request_id.view());
    request_.set_attribute("trace_id", forward_head_->traceparent.view().substr(3, 32));
  }
  const http::RequestHead& head = forward_head_->head;
  has_body_ = head.chunked || head.content_length.value_or(0) > 0;
  idempotent_ = http::is_idempotent(head.method);
  if (upstream_.config->balancer == BalancerKind::kConsistentHash) {
    const HashKey& key = upstream_.config->hash;
    std::string_view value = request_.context().remote;
    if (key.by == HashKey::By::kHeader) {
      value = request_.header(key.key);
    } else if (key.by == HashKey::By::kCookie) {
      value = cookie_value(request_, key.key);
    }
    key_hash_ = hash_key(value);
  }
  return std::nullopt;
}

void Forwarding::take_body() {
  const http::RequestHead& head = forward_head_->head;
  const std::uint64_t buffering = service_.config->request_buffering;
  body_.replayable = !has_body_ || head.content_length.value_or(UINT64_MAX) <= buffering;
  body_.unread = has_body_ && request_.head().expect_continue;
  body_.complete = !has_body_;
  if (has_body_ && !body_.unread) {
    if (body_.replayable) {
      body_.kept = request_.body();
      body_.complete = true;
    } else if (head.chunked && buffering > 0) {
      body_.complete = body_.replayable = read_up_to(request_, buffering, body_.kept);
    }
  }
}

Forwarding::Attempt Forwarding::exchange_with(const Gateway::Target& target) {
  Attempt attempt;
  // After a pooled connection failed, a new one: the others idle as long may be closed too.
  auto opened = connections_.open(target.endpoint, forward_head_->head, forward_head_->authority,
                                  service_.timeouts, upstream_.limits, last_reused_);
  last_reused_ = false;
  if (!opened) {
    attempt.failure = opened.error();
    return attempt;
  }
  // Shared with the client-gone callback and a streamed body's producer. Its count comes from
  // the block cache: made from the unique_ptr, a shared_ptr takes it from malloc.
  attempt.exchange = std::shared_ptr<http::ClientExchange>(
      opened->release(), std::default_delete<http::ClientExchange>(), BlockAllocator<char>());
  http::ClientExchange& exchange = *attempt.exchange;
  last_reused_ = exchange.reused();
  // The client going away cancels the exchange (HTTP/2 RST_STREAM).
  request_.on_client_gone([weak = std::weak_ptr(attempt.exchange)] {
    if (auto e = weak.lock()) e->cancel();
  });
  // Interim answers (103 Early Hints) go on to the client as they come.
  exchange.on_informational([this](const http::ClientResponseHead& interim) {
    (void)request_.send_interim(interim.status, interim.headers);
  });
  auto sent = send_body(request_, exchange, body_, has_body_, route_max_body_);
  // Even when the body could not all go out, the upstream may have answered (an early 413,
  // say): its answer is what the client should see.
  auto got = exchange.read_head();
  exchange.on_informational(nullptr);
  if (got) {
    attempt.head = *got;
  } else {
    attempt.failure = sent ? got.error() : sent.error();
  }
  return attempt;
}

bool Forwarding::retry_allowed(bool safe, unsigned attempt) {
  if (!safe || attempt >= retries_.attempts) return false;
  if (budget_.milli < 1000) {
    if (metrics_) metrics_->record_retry_denied(service_.series);
    return false;
  }
  budget_.milli -= 1000;
  if (metrics_) metrics_->record_retry(service_.series);
  return true;
}

http::Response Forwarding::run() {
  const http::RequestHead& head = forward_head_->head;
  TriedTargets tried;
  // A target that turned the request away unprocessed while closing a connection gracefully
  // gets it again (http::resend_turned_away): then no target is picked.
  std::optional<std::size_t> again;
  unsigned turned_away = 0;
  for (unsigned number = 1;; ++number) {
    bool panic = false;
    auto pick = std::exchange(again, std::nullopt);
    if (!pick) {
      pick = pick_target(worker_, upstream_, tried, key_hash_, &panic);
      if (panic && metrics_) metrics_->record_panic(service_.series);
    }
    if (!pick && number > 1 && last_reused_ && upstream_.targets.size() == 1) {
      // Every target tried: the last failure stands. But a single target may be tried again
      // when the failure was a pooled connection it had closed: no fault of the target.
      pick = 0;
    }
    if (!pick) {
      if (number == 1) {
        log_warn("route {}: upstream {} has no healthy target: answered 503", route_.name,
                 upstream_.config->name);
        return http::Response::error(503, "no healthy upstream");
      }
      return give_up();
    }
    const Gateway::Target& target = upstream_.targets[*pick];
    tried.add(*pick);
    last_target_ = target.label;
    forward_head_->in_flight.reset();
    forward_head_->in_flight.emplace(worker_.in_flight[upstream_.index][*pick]);
    auto started = Clock::now();
    Attempt attempt = exchange_with(target);
    if (attempt.head == nullptr) {
      last_error_ = attempt.failure;
      bool body_whole = body_.replayable || !body_.streamed_beyond;
      // Turned away unprocessed by an upstream closing a connection: routine, no failure of
      // the target's, so neither an attempt nor a retry (of the budget).
      if (body_whole && http::resend_turned_away(attempt.failure, turned_away)) {
        if (metrics_) metrics_->record_resend(service_.series);
        again = pick;
        --number;  // not an attempt
        continue;
      }
      // A failure while the client's own body was still coming (stalled, cut, past the
      // upstream's read deadline) may be the client's doing: it is not the target's.
      if (counts_against_target(attempt.failure) && body_.complete) {
        note_target_failure(upstream_, *pick, metrics_, service_.series);
      }
      // Safe to send again: nothing reached the upstream (whatever the method, if the body is
      // still whole or not yet begun), or an idempotent request whose body is kept and whose
      // connection closed before any answer.
      bool safe = (http::nothing_reached_upstream(attempt.failure) && body_whole) ||
                  (idempotent_ && body_.replayable &&
                   attempt.failure == ExchangeErrc::kClosedBeforeResponse);
      if (retry_allowed(safe, number)) {
        log_info("route {}: {} {} to {} failed ({}): trying again", route_.name, head.method,
                 head.target, target.label, attempt.failure.message());
        continue;
      }
      return give_up();
    }
    int status = attempt.head->status;
    bool connected = connect_ && status >= 200 && status < 300;  // CONNECT's tunnel is open
    if (status == 101 || connected) return open_tunnel(target, attempt);
    if (extended_connect_ && status >= 200 && status < 300) {
      // A 2xx opens the tunnel for an HTTP/2 client: an upstream that did not switch must not
      // be passed on as one that did.
      attempt.exchange->cancel();
      log_warn("route {}: {} upgrade to {}: answered {} without switching: answered 502",
               route_.name, head.target, target.label, status);
      return http::Response::error(502, "the upstream did not switch protocols");
    }
    bool could_retry = (status == 502 || status == 503) && idempotent_ && body_.replayable &&
                       upstream_.targets.size() > 1;
    if (retry_allowed(could_retry, number)) {
      last_error_ = {};
      continue;  // another target may do better
    }
    target.health->record_success();
    return pass_response(target, attempt, Clock::now() - started);
  }
}

http::Response Forwarding::open_tunnel(const Gateway::Target& target, Attempt& attempt) {
  const http::RequestHead& head = forward_head_->head;
  const http::ClientResponseHead& response_head = *attempt.head;
  if (logged_) request_.set_attribute("upstream", target.label);
  if (auto refused = response_head.status == 101 ? switch_refused(*forward_head_, response_head)
                                                 : std::nullopt) {
    attempt.exchange->cancel();  // its connection is closed, never pooled
    log_warn("route {}: {} {} to {}: {}: answered 502", route_.name, head.method, head.target,
             target.label, *refused);
    return http::Response::error(502, *refused);
  }
  target.health->record_success();
  auto early = std::make_shared<std::string>();
  auto taken = attempt.exchange->take_connection(*early);
  if (!taken) return http::Response::error(502, taken.error().message());
  // An HTTP/2 client's extended CONNECT is answered 200 (RFC 8441 5): its stream is the
  // tunnel. The 101's proof of the key was ours to check, not the client's.
  http::Response response(extended_connect_ ? 200 : response_head.status);
  for (const http::Field& f : response_head.headers) {
    if (extended_connect_ && f.token == &http::token::kSecWebsocketAccept) continue;
    response.headers.add(f);
  }
  auto upstream_stream = std::make_shared<Stream>(std::move(*taken));
  response.takeover = [upstream_stream, early, forward_head = forward_head_, gateway = gateway_,
                       timeouts = service_.config->timeouts](http::TunnelEnd& client,
                                                             std::string_view from_client) {
    http::StreamTunnelEnd upstream_end(*upstream_stream);
    tunnel(client, upstream_end, from_client, *early, timeouts.idle, timeouts.tunnel);
  };
  return response;
}

http::Response Forwarding::pass_response(const Gateway::Target& target, Attempt& attempt,
                                         Clock::duration first_byte_time) {
  const http::RequestHead& head = forward_head_->head;
  const http::ClientResponseHead& response_head = *attempt.head;
  std::shared_ptr<http::ClientExchange> exchange = attempt.exchange;
  if (metrics_) {
    metrics_->record_upstream(service_.series,
                              std::chrono::duration<double>(exchange->connect_time()).count(),
                              std::chrono::duration<double>(first_byte_time).count());
  }
  if (logged_) {
    auto first_byte = std::chrono::duration_cast<std::chrono::milliseconds>(first_byte_time);
    request_.set_attribute("upstream", target.label);
    request_.set_attribute("upstream_connect_ms", milliseconds_text(exchange->connect_time()));
    request_.set_attribute("upstream_first_byte_ms", std::to_string(first_byte.count()));
  }
  // The upstream's fields (the server drops hop-by-hop ones and sets the framing), with our
  // Via added to its. Every return below returns `response`, so it is built in the caller's
  // place (a response is a few KiB: a move of one shows per request).
  // To an HTTP/2 client names go in lower case (its encoder writes them so): a known one can be
  // its token's text rather than a copy of the upstream's spelling.
  const bool names_lower_cased = request_.context().major_version == 2;
  http::Response response(response_head.status);
  for (const http::Field& f : response_head.headers) {
    if (f.token == &http::token::kVia) continue;
    if (names_lower_cased) {
      response.headers.add_lower_case(f);
    } else {
      response.headers.add(f);
    }
  }
  auto via = response_head.headers.get(http::token::kVia);
  std::string our_via = via ? std::string(*via) + ", " : std::string();
  our_via.append(version_text(response_head.version)).append(" spindle");
  response.headers.add_with_static_name("Via", http::token::kVia, our_via);
  if (request_.method() == "HEAD" || response_head.no_body) {
    if (response_head.content_length) {
      response.stream = [](http::BodyWriter&) {};
      response.stream_length = response_head.content_length;
    }
    return response;
  }
  // The first piece is read here, before the head goes out: it then goes with the head in one
  // write, a body that is all there needs no producer at all, and an upstream that cuts before
  // its first byte still gets the client a 502.
  std::string& first = response.body;
  std::error_code failure;
  {
    BufferPool::Buffer piece = take_buffer();  // pooled: no 16 KiB allocation per request
    auto n = exchange->read(piece.span().first(std::min(kFirstPiece, piece.span().size())));
    if (n) {
      first.assign(piece.span().data(), *n);
    } else {
      failure = n.error();
    }
  }
  if (failure == ExchangeErrc::kCancelled) {
    log_info("route {}: {} {} to {}: the client went away: upstream exchange abandoned",
             route_.name, head.method, head.target, target.label);
    response = http::Response::error(499, failure.message());
    return response;
  }
  if (failure) {
    int status = failure == ExchangeErrc::kPreempted ? 503 : 502;
    log_warn("route {}: {} {} to {}: {} before the body: answered {}", route_.name, head.method,
             head.target, target.label, failure.message(), status);
    response = http::Response::error(status, failure.message());
    return response;
  }
  bool whole = first.empty() ||
               (response_head.content_length && *response_head.content_length == first.size());
  if (whole) {
    char end;
    auto n = exchange->read({&end, 1});  // the body's end: the connection goes back to the pool
    if (n && *n == 0) {
      if (exchange->trailers().empty()) return response;
      // Trailers need a producer to carry them.
      response.stream = [exchange](http::BodyWriter& writer) {
        writer.set_trailers(exchange->trailers());
      };
      return response;
    }
  }
  response.stream_length = response_head.content_length;
  // The producer keeps the snapshot, the exchange and the in-flight count until the body is
  // sent.
  response.stream = [gateway = gateway_, exchange, forward_head = forward_head_,
                     label = target.label, route = route_.name](http::BodyWriter& writer) {
    BufferPool::Buffer buffer = take_buffer();
    for (;;) {
      auto n = exchange->read(buffer.span());
      if (!n) {
        // Cut mid-body: the client's connection or stream is aborted, never ended short.
        throw std::runtime_error(
            fmt::format("route {}: upstream {}: {}", route, label, n.error().message()));
      }
      if (*n == 0) break;
      if (!writer.write(std::string_view(buffer.span().data(), *n))) {
        exchange->cancel();  // the client is gone
        return;
      }
    }
    if (!exchange->trailers().empty()) writer.set_trailers(exchange->trailers());
  };
  return response;
}

http::Response Forwarding::give_up() {
  const http::RequestHead& head = forward_head_->head;
  int status = status_for(last_error_);
  if (status == 499) {
    log_info("route {}: {} {} to {}: the client went away: upstream exchange abandoned",
             route_.name, head.method, head.target, last_target_);
  } else {
    log_warn("route {}: {} {} to {}: {}: answered {}", route_.name, head.method, head.target,
             last_target_, last_error_.message(), status);
  }
  if (logged_) request_.set_attribute("upstream", last_target_);
  return http::Response::error(status, last_error_.message());
}

}  // namespace

http::Response Proxy::forward(http::Request& request, const std::shared_ptr<Gateway>& gateway,
                              const Gateway::Server& server, const RouteConfig& route,
                              std::string_view service_name) {
  note_client(request, *server.config);
  const Gateway::Service* service =
      gateway->service(service_name.empty() ? std::string_view(route.service) : service_name);
  if (service == nullptr) return http::Response::error(502, "no such service");
  // A retry budget grows with every request (capped), and each retry spends one.
  auto& budget = gateway->worker_state().budgets[service->index];
  budget.milli = std::min<std::int64_t>(
      budget.milli + static_cast<std::int64_t>(service->config->retries.budget * 1000), 100'000);
  Forwarding forwarding(request, gateway, server, route, *service, connections_, metrics_);
  if (auto refused = forwarding.prepare()) {
    return http::Response::error(refused->status, refused->detail);
  }
  forwarding.take_body();
  return forwarding.run();
}

}  // namespace spindle::proxy
