// Reading a route's middlewares (gateway_config.h): a reader per kind, each checking its
// settings as it reads them, and the one list of the kinds' names.
#include <fmt/format.h>
#include <re2/re2.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <ranges>
#include <sstream>

#include "gateway_config.h"
#include "spindle/base/ascii.h"
#include "spindle/handlers/compression.h"
#include "spindle/http/canonical.h"
#include "spindle/http/rules.h"
#include "spindle/proxy/cors.h"
#include "spindle/proxy/jwt_keys.h"

namespace spindle::proxy::detail {
namespace {

// Which message a headers middleware's edits are for.
enum class Edited { kRequest, kResponse };

// Why an edit of field `name` (by `how`: set, add or remove) of `edited` would not do what it
// says, if it would not: the framing and the hop-by-hop fields are written by whoever sends
// each message (spindle's own, or none), a request has exactly one Host, its authority (set
// makes the upstream see that authority: `value` must be host[:port]), and at most one of each
// singleton field (Authorization: set it, never add it).
std::optional<std::string> edit_refused(std::string_view name, std::string_view how,
                                        std::string_view value, Edited edited) {
  if (http::field_flags(name, http::field_flag::kHopByHop | http::field_flag::kFraming) != 0) {
    return fmt::format(
        "'{}' is written by the sender of each message (framing, hop-by-hop): "
        "an edit of it would be dropped",
        name);
  }
  if (edited == Edited::kRequest && http::field_flags(name, http::field_flag::kHost) != 0) {
    if (how != "set") return std::string("a request has one Host: set it, or leave it");
    if (!http::is_authority(value)) return fmt::format("'{}' is not host[:port]", value);
  }
  // One added beside the client's would be two: the request the gateway refuses from a client
  // (canonical.h), and a judge (basic_auth, jwt) and the upstream could read either.
  if (edited == Edited::kRequest && how == "add" &&
      http::field_flags(name, http::field_flag::kSingleton) != 0) {
    return fmt::format("a request has one {}: set it", name);
  }
  return std::nullopt;
}

// Refuses at `key` a field `name` that a middleware copies into the request that goes up
// (forward_auth's response_headers, jwt's claims_to_headers) if a headers edit could not write
// it either: the value is known only per request, so Host is refused too.
void refuse_written(const ConfigReader& r, std::string_view key, std::string_view name) {
  if (auto refused = edit_refused(name, "copy", "", Edited::kRequest)) {
    r.fail_key(key, fmt::format("{}: {}", name, *refused));
  }
}

// The field names and values of a mapping ("{x-env: prod}"), checked.
std::vector<std::pair<std::string, std::string>> read_fields(const ConfigReader& r,
                                                             std::string_view how, Edited edited) {
  std::vector<std::pair<std::string, std::string>> fields;
  for (const auto& entry : r.node()) {
    std::string name = entry.first.IsScalar() ? entry.first.Scalar() : "";
    if (!http::is_field_name(name))
      r.fail(entry.first, r.key_path(name), "not a header field name");
    std::string value = scalar_text(r, entry.second, r.key_path(name));
    if (!http::is_field_value(value))
      r.fail(entry.second, r.key_path(name), "not a valid field value");
    if (auto refused = edit_refused(name, how, value, edited)) {
      r.fail(entry.first, r.key_path(name), *refused);
    }
    fields.emplace_back(std::move(name), std::move(value));
  }
  return fields;
}

HeaderEdits read_edits(const ConfigReader& r, Edited edited) {
  r.only({"set", "add", "remove"});
  HeaderEdits edits;
  if (r.has("set")) edits.set = read_fields(r.nested("set"), "set", edited);
  if (r.has("add")) edits.add = read_fields(r.nested("add"), "add", edited);
  for (const std::string& name : r.strings("remove")) {
    if (!http::is_field_name(name))
      r.fail_key("remove", fmt::format("'{}' is not a field name", name));
    if (auto refused = edit_refused(name, "remove", "", edited)) r.fail_key("remove", *refused);
    edits.remove.push_back(name);
  }
  return edits;
}

// rate_limit: {key, rate: N/s|N/m|N/h, burst, store, failure_mode}.
RateLimitConfig read_rate_limit(const ConfigReader& r) {
  r.only({"key", "rate", "burst", "store", "failure_mode", "batch"});
  RateLimitConfig limit;
  std::string key = r.string("key", "client_ip");
  if (key == "client_ip") {
    limit.key = RateLimitConfig::Key::kClientIp;
  } else if (key == "route") {
    limit.key = RateLimitConfig::Key::kRoute;
  } else if (key.starts_with("header:") && http::is_field_name(key.substr(7))) {
    limit.key = RateLimitConfig::Key::kHeader;
    limit.header = key.substr(7);
    std::ranges::transform(limit.header, limit.header.begin(),
                           [](char c) { return static_cast<char>(std::tolower(c)); });
  } else if (key.starts_with("claim:") && key.size() > 6) {
    limit.key = RateLimitConfig::Key::kClaim;
    limit.header = key.substr(6);
  } else {
    r.fail_key("key", "expected client_ip, route, header:NAME or claim:NAME");
  }
  limit.rate_text = r.string("rate", "");
  auto slash = limit.rate_text.find('/');
  double count = 0;
  std::string_view unit;
  if (slash != std::string::npos) {
    std::string number = limit.rate_text.substr(0, slash);
    char* end = nullptr;
    count = std::strtod(number.c_str(), &end);
    if (number.empty() || end != number.c_str() + number.size()) count = 0;
    unit = std::string_view(limit.rate_text).substr(slash + 1);
  }
  double per = unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : 0;
  if (!(count > 0) || per == 0 || count / per > 1e9) {
    r.fail_key("rate", "expected requests per second, minute or hour: 100/s, 30/m, 1000/h");
  }
  limit.rate = count / per;
  limit.burst =
      static_cast<unsigned>(r.number("burst", std::max(1.0, std::ceil(count)), 1'000'000'000));
  if (limit.burst == 0) r.fail_key("burst", "must be at least 1");
  std::string store = r.string("store", "local");
  if (store == "redis") {
    limit.store = RateLimitConfig::Store::kRedis;
  } else if (store != "local") {
    r.fail_key("store", "expected local (this process) or redis (shared through redis:)");
  }
  std::string failure = r.string("failure_mode", "open");
  if (failure != "open" && failure != "closed")
    r.fail_key("failure_mode", "expected open (let requests through) or closed (503)");
  limit.fail_open = failure == "open";
  limit.batch = static_cast<unsigned>(r.number("batch", 0, 1'000'000));
  if (r.has("batch") && limit.batch == 0) r.fail_key("batch", "must be at least 1");
  if (limit.store == RateLimitConfig::Store::kLocal && (r.has("batch") || r.has("failure_mode"))) {
    r.fail_key(r.has("batch") ? "batch" : "failure_mode", "only with store: redis");
  }
  return limit;
}

// The text of a file a middleware names (users_file, jwks_file), read as the configuration
// file is (read_config_file): a regular file of at most 64 MiB. A FIFO put in its place would
// hold a reload, and the SIGTERM after it, for ever; a device (/dev/zero) would grow a string
// without end.
std::string named_file(const ConfigReader& r, std::string_view key, const std::string& file) {
  try {
    return read_config_file(file);
  } catch (const ConfigError& e) {
    r.fail_key(key, fmt::format("cannot read {}", e.what()));
  }
}

// jwt: {jwks_file, algorithms, issuer, audience, leeway, cookie, claims_to_headers, realm}.
std::shared_ptr<JwtConfig> read_jwt(const ConfigReader& r) {
  r.only({"jwks_file", "algorithms", "issuer", "audience", "leeway", "cookie", "claims_to_headers",
          "realm"});
  auto jwt = std::make_shared<JwtConfig>();
  if (!r.has("jwks_file")) r.fail_key("jwks_file", "required (a JWKS file: {\"keys\": [...]})");
  std::string file = config_path(r.file(), r.string("jwks_file", ""));
  std::string text = named_file(r, "jwks_file", file);
  try {
    jwt->keys = JwtKeys::parse(text);
  } catch (const std::exception& e) {
    r.fail_key("jwks_file", fmt::format("{}: {}", file, e.what()));
  }
  if (r.has("algorithms")) {
    jwt->algorithms = r.strings("algorithms");
    for (const std::string& alg : jwt->algorithms) {
      if (alg != "HS256" && alg != "RS256" && alg != "ES256") {
        r.fail_key("algorithms", fmt::format("'{}' (expected HS256, RS256, ES256)", alg));
      }
    }
    if (jwt->algorithms.empty()) r.fail_key("algorithms", "at least one");
  }
  jwt->issuer = r.string("issuer", "");
  jwt->audiences = r.strings("audience");
  jwt->leeway = std::chrono::duration_cast<std::chrono::seconds>(
      r.duration("leeway", std::chrono::seconds(0)));
  jwt->cookie = r.string("cookie", "");
  if (r.has("cookie") && !http::is_token(jwt->cookie)) r.fail_key("cookie", "not a cookie name");
  jwt->realm = r.string("realm", jwt->realm);
  if (!http::is_field_value(jwt->realm) || jwt->realm.find('"') != std::string::npos) {
    r.fail_key("realm", "must not hold quotes or control characters");
  }
  if (r.has("claims_to_headers")) {
    YAML::Node map = r.get("claims_to_headers");
    if (!map.IsMap()) r.fail_key("claims_to_headers", "expected {CLAIM: FIELD}");
    for (const auto& entry : map) {
      std::string claim = scalar_text(r, entry.first, r.key_path("claims_to_headers"));
      std::string field = scalar_text(r, entry.second, r.key_path("claims_to_headers"));
      if (!http::is_field_name(field)) {
        r.fail(entry.second, r.key_path("claims_to_headers"),
               fmt::format("'{}' is not a field name", field));
      }
      refuse_written(r, "claims_to_headers", field);
      jwt->claims_to_headers.emplace_back(claim, field);
      jwt->kept_claims.push_back(claim);
    }
  }
  jwt->kept_claims.push_back("sub");
  return jwt;
}

// Each middleware's reader: `entry` is the list item ({kind: settings}), `kind` its name.

void read_headers(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  ConfigReader h = entry.nested(kind);
  h.only({"request", "response"});
  m.kind = MiddlewareConfig::Kind::kHeaders;
  if (h.has("request")) m.request = read_edits(h.nested("request"), Edited::kRequest);
  if (h.has("response")) m.response = read_edits(h.nested("response"), Edited::kResponse);
}

void read_prefix(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  m.kind = kind == "strip_prefix" ? MiddlewareConfig::Kind::kStripPrefix
                                  : MiddlewareConfig::Kind::kAddPrefix;
  m.prefix = entry.string(kind, "");
  if (!m.prefix.starts_with('/') || m.prefix.size() < 2 || m.prefix.ends_with('/') ||
      !http::is_request_target(m.prefix)) {
    entry.fail_key(kind,
                   "expected a path prefix such as /api (starting with /, not ending with /)");
  }
}

void read_rate_limit_middleware(const ConfigReader& entry, const std::string& kind,
                                MiddlewareConfig& m) {
  m.kind = MiddlewareConfig::Kind::kRateLimit;
  m.rate_limit = read_rate_limit(entry.nested(kind));
}

void read_replace_path(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  m.kind = MiddlewareConfig::Kind::kReplacePath;
  m.replacement = entry.string(kind, "");
  if (!m.replacement.starts_with('/') || !http::is_request_target(m.replacement) ||
      m.replacement.find('?') != std::string::npos) {
    entry.fail_key(kind, "expected a path starting with / (the query is kept)");
  }
}

void read_replace_path_regex(const ConfigReader& entry, const std::string& kind,
                             MiddlewareConfig& m) {
  ConfigReader r = entry.nested(kind);
  r.only({"regex", "replacement"});
  m.kind = MiddlewareConfig::Kind::kReplacePathRegex;
  // ASCII case aside, as routes match paths (route_table.h): every spelling a route takes is
  // rewritten, as strip_prefix strips it. "(?-i:...)" asks for case where it matters.
  RE2::Options options(RE2::Quiet);
  options.set_case_sensitive(false);
  auto regex = std::make_shared<RE2>(r.string("regex", ""), options);
  if (!r.has("regex") || !regex->ok()) {
    r.fail_key("regex", r.has("regex")
                            ? fmt::format("invalid regular expression: {}", regex->error())
                            : std::string("required (an RE2 pattern searched in the path)"));
  }
  m.replacement = r.string("replacement", "");
  std::string why;
  if (!regex->CheckRewriteString(m.replacement, &why)) {
    r.fail_key("replacement", fmt::format("{} (groups are \\1 to \\9)", why));
  }
  m.regex = std::move(regex);
}

void read_networks(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  m.kind = kind == "ip_allow" ? MiddlewareConfig::Kind::kIpAllow : MiddlewareConfig::Kind::kIpDeny;
  for (const std::string& text : entry.strings(kind)) {
    auto cidr = Cidr::parse(text);
    if (!cidr) {
      entry.fail_key(kind,
                     fmt::format("'{}' is not an address or network (10.0.0.0/8, fd00::/8)", text));
    }
    m.networks.push_back(*cidr);
  }
  if (m.networks.empty()) entry.fail_key(kind, "expected a list of networks");
}

void read_max_body(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  m.kind = MiddlewareConfig::Kind::kMaxBody;
  m.max_body = entry.size(kind, 0);
}

void read_redirect(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  ConfigReader r = entry.nested(kind);
  r.only({"scheme", "host", "port", "path", "status"});
  m.kind = MiddlewareConfig::Kind::kRedirect;
  m.scheme = r.string("scheme", "");
  if (!m.scheme.empty() && m.scheme != "http" && m.scheme != "https") {
    r.fail_key("scheme", "expected http or https");
  }
  m.host = r.string("host", "");
  // The Location's authority: host[:port] as a request's is judged (http/canonical.h), so that
  // no '/', '@', '?' or '#' makes it name another host.
  if (!m.host.empty() && !http::is_authority(m.host)) {
    r.fail_key("host", fmt::format("'{}' is not host[:port]", m.host));
  }
  m.port = static_cast<std::uint16_t>(r.number("port", 0, 65535));
  m.path = r.string("path", "");
  if (!m.path.empty() && (!m.path.starts_with('/') || !http::is_request_target(m.path))) {
    r.fail_key("path", "expected a path starting with /");
  }
  m.status = static_cast<int>(r.number("status", 302, 999));
  if (m.status != 301 && m.status != 302 && m.status != 303 && m.status != 307 && m.status != 308) {
    r.fail_key("status", "expected 301, 302, 303, 307 or 308");
  }
}

// The Fetch standard takes "*" literally in an answer to a request with credentials: a browser
// would refuse every answer of such a `cors` (origins) or expose no field (expose).
void refuse_what_fetch_forbids(const ConfigReader& r, const CorsConfig& cors) {
  if (!cors.credentials) return;
  if (cors.any_origin) {
    r.fail_key("credentials", "true cannot go with origins: * (browsers refuse it): list them");
  }
  if (std::ranges::find(cors.expose, "*") != cors.expose.end()) {
    r.fail_key("expose",
               "'*' exposes nothing with credentials: true (browsers read it as a "
               "name): list the fields");
  }
}

void read_cors(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  ConfigReader r = entry.nested(kind);
  r.only({"origins", "methods", "headers", "expose", "credentials", "max_age"});
  m.kind = MiddlewareConfig::Kind::kCors;
  CorsConfig& cors = m.cors;
  for (const std::string& origin : r.strings("origins")) {
    if (origin == "*") {
      cors.any_origin = true;
    } else if (std::string why = origin_pattern_error(origin); why.empty()) {
      cors.origins.push_back(origin);
    } else {
      r.fail_key("origins", fmt::format("'{}' is not an origin: {}", origin, why));
    }
  }
  if (!cors.any_origin && cors.origins.empty())
    r.fail_key("origins", "required: a list of origins, or *");
  if (r.has("methods")) {
    cors.methods.clear();
    for (const std::string& method : r.strings("methods")) {
      // ("*" is a token, but a preflight asks for a method, never for "*".)
      if (!http::is_method(method) || method == "*")
        r.fail_key("methods", fmt::format("'{}' is not a method", method));
      cors.methods.push_back(method);
    }
  }
  for (const std::string& name : r.strings("headers")) {
    if (name == "*") {
      cors.any_header = true;
      continue;
    }
    if (!http::is_field_name(name))
      r.fail_key("headers", fmt::format("'{}' is not a field name", name));
    cors.headers.push_back(ascii_lower(name));
  }
  for (const std::string& name : r.strings("expose")) {
    if (!http::is_field_name(name))
      r.fail_key("expose", fmt::format("'{}' is not a field name", name));
    cors.expose.push_back(name);
  }
  cors.credentials = r.boolean("credentials", false);
  refuse_what_fetch_forbids(r, cors);
  cors.max_age = std::chrono::duration_cast<std::chrono::seconds>(
      r.duration("max_age", std::chrono::seconds(600)));
}

void read_basic_auth(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  ConfigReader r = entry.nested(kind);
  r.only({"users_file", "realm"});
  m.kind = MiddlewareConfig::Kind::kBasicAuth;
  auto auth = std::make_shared<BasicAuthConfig>();
  auth->realm = r.string("realm", auth->realm);
  if (!http::is_field_value(auth->realm) || auth->realm.find('"') != std::string::npos) {
    r.fail_key("realm", "must not hold quotes or control characters");
  }
  if (!r.has("users_file")) r.fail_key("users_file", "required (an htpasswd file)");
  std::string file = config_path(r.file(), r.string("users_file", ""));
  std::istringstream in(named_file(r, "users_file", file));
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line.starts_with('#')) continue;
    auto colon = line.find(':');
    std::string user = line.substr(0, colon);
    std::string hash = colon == std::string::npos ? "" : line.substr(colon + 1);
    bool bcrypt = hash.starts_with("$2y$") || hash.starts_with("$2b$") || hash.starts_with("$2a$");
    if (user.empty() || (!bcrypt && !hash.starts_with("{SHA}"))) {
      r.fail_key("users_file",
                 fmt::format("{}:{}: expected USER:HASH with a bcrypt ($2y$, htpasswd -B) or "
                             "{{SHA}} hash",
                             file, number));
    }
    auth->users[user] = hash;
  }
  if (auth->users.empty()) r.fail_key("users_file", fmt::format("{}: no users", file));
  m.basic_auth = std::move(auth);
}

void read_compression(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  ConfigReader r = entry.nested(kind);
  r.only({"min_size", "gzip_level", "brotli_quality"});
  m.kind = MiddlewareConfig::Kind::kCompression;
  http::CompressionOptions options;
  options.min_size = r.size("min_size", options.min_size);
  options.gzip_level = static_cast<int>(r.number("gzip_level", 6, 9));
  if (options.gzip_level == 0) r.fail_key("gzip_level", "expected 1 to 9");
  options.brotli_quality = static_cast<int>(r.number("brotli_quality", 5, 11));
  m.compress = std::make_shared<const http::Middleware>(http::compression(options));
}

void read_mirror(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  ConfigReader r = entry.nested(kind);
  r.only({"service", "percent", "max_in_flight", "timeout"});
  m.kind = MiddlewareConfig::Kind::kMirror;
  m.mirror.timeout = r.duration("timeout", m.mirror.timeout);
  if (m.mirror.timeout.count() == 0) r.fail_key("timeout", "must be more than 0");
  m.mirror.service = r.string("service", "");
  if (m.mirror.service.empty()) r.fail_key("service", "required (where the copies go)");
  m.mirror.percent = static_cast<double>(r.number("percent", 100, 100));
  m.mirror.max_in_flight = r.number("max_in_flight", m.mirror.max_in_flight, 100'000);
  if (m.mirror.max_in_flight == 0) r.fail_key("max_in_flight", "must be at least 1");
}

void read_forward_auth(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  ConfigReader r = entry.nested(kind);
  r.only({"service", "path", "request_headers", "response_headers"});
  m.kind = MiddlewareConfig::Kind::kForwardAuth;
  auto auth = std::make_shared<ForwardAuthConfig>();
  auth->service = r.string("service", "");
  if (auth->service.empty()) r.fail_key("service", "required (the service that decides)");
  auth->path = r.string("path", auth->path);
  if (!auth->path.starts_with('/') || !http::is_request_target(auth->path)) {
    r.fail_key("path", "expected a path starting with /");
  }
  for (const char* key : {"request_headers", "response_headers"}) {
    auto& names =
        std::string_view(key) == "request_headers" ? auth->request_headers : auth->response_headers;
    for (const std::string& name : r.strings(key)) {
      if (!http::is_field_name(name))
        r.fail_key(key, fmt::format("'{}' is not a field name", name));
      // The copies are written into the request that goes up, as a headers edit's are.
      if (&names == &auth->response_headers) refuse_written(r, key, name);
      names.push_back(ascii_lower(name));
    }
  }
  m.forward_auth = std::move(auth);
}

void read_jwt_middleware(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  m.kind = MiddlewareConfig::Kind::kJwt;
  m.jwt = read_jwt(entry.nested(kind));
}

void read_traffic_split(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  ConfigReader r = entry.nested(kind);
  r.only({"services", "sticky_cookie"});
  m.kind = MiddlewareConfig::Kind::kTrafficSplit;
  YAML::Node shares = r.sequence("services", "{service, weight}");
  for (std::size_t i = 0; i < shares.size(); ++i) {
    ConfigReader share(r.file(), shares[i], fmt::format("{}[{}]", r.key_path("services"), i));
    share.only({"service", "weight"});
    TrafficSplitConfig::Share s{share.string("service", ""),
                                static_cast<unsigned>(share.number("weight", 1, 1'000'000))};
    if (s.service.empty()) share.fail(shares[i], share.key_path("service"), "required");
    m.traffic_split.shares.push_back(std::move(s));
  }
  if (m.traffic_split.shares.empty())
    r.fail_key("services", "expected a list of {service, weight}");
  unsigned total = 0;
  for (const auto& s : m.traffic_split.shares) total += s.weight;
  if (total == 0) r.fail_key("services", "the weights add up to 0");
  m.traffic_split.cookie = r.string("sticky_cookie", "");
  if (!m.traffic_split.cookie.empty() && !http::is_field_name(m.traffic_split.cookie)) {
    r.fail_key("sticky_cookie", "not a cookie name");
  }
}

void read_respond(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m) {
  ConfigReader r = entry.nested(kind);
  r.only({"status", "body", "content_type"});
  m.kind = MiddlewareConfig::Kind::kRespond;
  m.status = static_cast<int>(r.number("status", 200, 999));
  if (m.status < 200 || m.status > 599) r.fail_key("status", "expected 200 to 599");
  m.body = r.string("body", "");
  m.content_type = r.string("content_type", "text/plain; charset=utf-8");
  if (!http::is_field_value(m.content_type)) r.fail_key("content_type", "not a field value");
}

// Every middleware a route may name, with its kind, its reader and the phases it acts in
// (docs/gateway.md, "The middleware chain"): the one list of their names.
struct MiddlewareKind {
  std::string_view name;
  MiddlewareConfig::Kind kind;
  void (*read)(const ConfigReader& entry, const std::string& kind, MiddlewareConfig& m);
  std::string_view phases;
};
using Kind = MiddlewareConfig::Kind;
constexpr MiddlewareKind kMiddlewareKinds[] = {
    {"headers", Kind::kHeaders, read_headers, "request, response"},
    {"strip_prefix", Kind::kStripPrefix, read_prefix, "request"},
    {"add_prefix", Kind::kAddPrefix, read_prefix, "request"},
    {"replace_path", Kind::kReplacePath, read_replace_path, "request"},
    {"replace_path_regex", Kind::kReplacePathRegex, read_replace_path_regex, "request"},
    {"rate_limit", Kind::kRateLimit, read_rate_limit_middleware, "answer, response"},
    {"ip_allow", Kind::kIpAllow, read_networks, "answer"},
    {"ip_deny", Kind::kIpDeny, read_networks, "answer"},
    {"max_body", Kind::kMaxBody, read_max_body, "answer, forward"},
    {"redirect", Kind::kRedirect, read_redirect, "answer"},
    {"respond", Kind::kRespond, read_respond, "answer"},
    {"cors", Kind::kCors, read_cors, "answer, response"},
    {"basic_auth", Kind::kBasicAuth, read_basic_auth, "answer"},
    {"jwt", Kind::kJwt, read_jwt_middleware, "answer, request"},
    {"forward_auth", Kind::kForwardAuth, read_forward_auth, "answer, request"},
    {"mirror", Kind::kMirror, read_mirror, "forward"},
    {"compression", Kind::kCompression, read_compression, "response"},
    {"traffic_split", Kind::kTrafficSplit, read_traffic_split, "forward"},
};

// The entry of `kind` in kMiddlewareKinds.
const MiddlewareKind& kind_entry(Kind kind) {
  return *std::ranges::find(kMiddlewareKinds, kind, &MiddlewareKind::kind);
}

// "headers, strip_prefix, ...": the names of kMiddlewareKinds, for error messages.
std::string middleware_names() {
  return fmt::format(
      "{}", fmt::join(kMiddlewareKinds | std::views::transform(&MiddlewareKind::name), ", "));
}

}  // namespace

MiddlewareConfig read_middleware(const ConfigReader& list, const YAML::Node& node,
                                 const std::string& path) {
  if (!node.IsMap() || node.size() != 1) {
    list.fail(
        node, path,
        fmt::format("expected one middleware as {{NAME: SETTINGS}} ({})", middleware_names()));
  }
  std::string kind = node.begin()->first.IsScalar() ? node.begin()->first.Scalar() : "";
  ConfigReader entry(list.file(), node, path);
  MiddlewareConfig m;
  for (const MiddlewareKind& k : kMiddlewareKinds) {
    if (k.name != kind) continue;
    k.read(entry, kind, m);
    assert(m.kind == k.kind);
    return m;
  }
  entry.fail(node.begin()->first, entry.key_path(kind),
             fmt::format("unknown middleware (expected one of: {})", middleware_names()));
  return m;
}

}  // namespace spindle::proxy::detail

namespace spindle::proxy {

std::string_view middleware_name(const MiddlewareConfig& m) {
  return detail::kind_entry(m.kind).name;
}

std::string_view middleware_phases(const MiddlewareConfig& m) {
  return detail::kind_entry(m.kind).phases;
}

std::string describe_chains(const Config& config) {
  std::string out;
  for (const RouteConfig& route : config.routes) {
    if (route.middlewares.empty()) continue;
    out += fmt::format("route {}:", route.name);
    for (std::size_t i = 0; i < route.middlewares.size(); ++i) {
      const MiddlewareConfig& m = route.middlewares[i];
      out += fmt::format("{} {} {} [{}]", i == 0 ? "" : ",", i + 1, middleware_name(m),
                         middleware_phases(m));
    }
    out += '\n';
  }
  return out;
}

}  // namespace spindle::proxy
