#include "gateway_config.h"

#include <fmt/format.h>
#include <re2/re2.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>

#include "spindle/base/ascii.h"
#include "spindle/handlers/compression.h"
#include "spindle/http/rules.h"
#include "spindle/proxy/jwt.h"

namespace spindle::proxy::detail {
namespace {

// A DNS name or an IP literal as routes and targets may hold: letters, digits, '-', '.', and
// for IPv6 ':' (no brackets here).
bool is_host(std::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  return std::ranges::all_of(
      host, [](unsigned char c) { return std::isalnum(c) || c == '-' || c == '.' || c == ':'; });
}

// The names of a YAML mapping's entries, in order, each with its reader.
template <typename Fn>
void for_each_entry(const ConfigReader& parent, std::string_view key, Fn&& fn) {
  YAML::Node section = parent.get(key);
  if (!section) return;
  if (!section.IsMap()) parent.fail_key(key, "expected a mapping of names to definitions");
  ConfigReader map(parent.file(), section, std::string(key));
  std::set<std::string> seen;
  for (const auto& entry : section) {
    if (!entry.first.IsScalar() || entry.first.Scalar().empty()) {
      map.fail(entry.first, std::string(key), "a name must be a plain string");
    }
    const std::string& name = entry.first.Scalar();
    if (!seen.insert(name).second) map.fail(entry.first, map.key_path(name), "given twice");
    fn(name, ConfigReader(parent.file(), entry.second, map.key_path(name)));
  }
}

std::string known_names(const std::vector<std::string>& names) {
  return names.empty() ? "none is defined" : fmt::format("defined: {}", fmt::join(names, ", "));
}

RouteMatch read_match(const ConfigReader& r) {
  r.only({"hosts", "path", "path_prefix", "path_regex", "methods", "headers"});
  RouteMatch m;
  for (std::string host : r.strings("hosts")) {
    host = ascii_lower(host);
    std::string_view name = host;
    if (name.starts_with("*.")) name.remove_prefix(2);
    if (!is_host(name) || name.find(':') != std::string_view::npos) {
      r.fail_key("hosts", fmt::format("'{}' is not a host name or *.domain", host));
    }
    m.hosts.push_back(host);
  }
  int paths = r.has("path") + r.has("path_prefix") + r.has("path_regex");
  if (paths > 1) r.fail(r.node(), r.key_path("path"), "give one of path, path_prefix, path_regex");
  m.path = r.string("path", "");
  m.path_prefix = r.string("path_prefix", "");
  m.path_regex = r.string("path_regex", "");
  for (auto [key, value] : {std::pair{"path", &m.path}, {"path_prefix", &m.path_prefix}}) {
    if (r.has(key) && (!value->starts_with('/') || !http::is_request_target(*value))) {
      r.fail_key(key, "expected a path starting with /");
    }
  }
  if (r.has("path_regex")) {
    RE2 re(m.path_regex, RE2::Quiet);
    if (!re.ok()) {
      r.fail_key("path_regex", fmt::format("invalid regular expression: {}", re.error()));
    }
  }
  for (const std::string& method : r.strings("methods")) {
    if (!http::is_method(method))
      r.fail_key("methods", fmt::format("'{}' is not a method", method));
    m.methods.push_back(method);
  }
  if (r.has("headers")) {
    ConfigReader headers = r.nested("headers");
    for (const auto& entry : headers.node()) {
      std::string name = entry.first.IsScalar() ? entry.first.Scalar() : "";
      if (!http::is_field_name(name)) {
        headers.fail(entry.first, headers.key_path(name), "not a header field name");
      }
      std::string value = scalar_text(headers, entry.second, headers.key_path(name));
      if (!http::is_field_value(value)) {
        headers.fail(entry.second, headers.key_path(name), "not a valid field value");
      }
      m.headers.emplace_back(ascii_lower(name), value);
    }
  }
  return m;
}

// The field names and values of a mapping ("{x-env: prod}"), checked.
std::vector<std::pair<std::string, std::string>> read_fields(const ConfigReader& r) {
  std::vector<std::pair<std::string, std::string>> fields;
  for (const auto& entry : r.node()) {
    std::string name = entry.first.IsScalar() ? entry.first.Scalar() : "";
    if (!http::is_field_name(name))
      r.fail(entry.first, r.key_path(name), "not a header field name");
    std::string value = scalar_text(r, entry.second, r.key_path(name));
    if (!http::is_field_value(value))
      r.fail(entry.second, r.key_path(name), "not a valid field value");
    fields.emplace_back(std::move(name), std::move(value));
  }
  return fields;
}

HeaderEdits read_edits(const ConfigReader& r) {
  r.only({"set", "add", "remove"});
  HeaderEdits edits;
  if (r.has("set")) edits.set = read_fields(r.nested("set"));
  if (r.has("add")) edits.add = read_fields(r.nested("add"));
  for (const std::string& name : r.strings("remove")) {
    if (!http::is_field_name(name))
      r.fail_key("remove", fmt::format("'{}' is not a field name", name));
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

// jwt: {jwks_file, algorithms, issuer, audience, leeway, cookie, claims_to_headers, realm}.
std::shared_ptr<JwtConfig> read_jwt(const ConfigReader& r) {
  r.only({"jwks_file", "algorithms", "issuer", "audience", "leeway", "cookie", "claims_to_headers",
          "realm"});
  auto jwt = std::make_shared<JwtConfig>();
  if (!r.has("jwks_file")) r.fail_key("jwks_file", "required (a JWKS file: {\"keys\": [...]})");
  std::string file = config_path(r.file(), r.string("jwks_file", ""));
  std::ifstream in(file);
  if (!in) r.fail_key("jwks_file", fmt::format("cannot read {}", file));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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
      jwt->claims_to_headers.emplace_back(claim, field);
      jwt->kept_claims.push_back(claim);
    }
  }
  jwt->kept_claims.push_back("sub");
  return jwt;
}

MiddlewareConfig read_middleware(const ConfigReader& list, const YAML::Node& node,
                                 const std::string& path) {
  constexpr const char* kKnown =
      "headers, strip_prefix, add_prefix, replace_path, replace_path_regex, rate_limit, "
      "ip_allow, ip_deny, max_body, redirect, respond, cors, basic_auth, jwt, forward_auth, "
      "mirror, compression, traffic_split";
  if (!node.IsMap() || node.size() != 1) {
    list.fail(node, path,
              fmt::format("expected one middleware as {{NAME: SETTINGS}} ({})", kKnown));
  }
  std::string kind = node.begin()->first.IsScalar() ? node.begin()->first.Scalar() : "";
  ConfigReader entry(list.file(), node, path);
  MiddlewareConfig m;
  if (kind == "headers") {
    ConfigReader h = entry.nested("headers");
    h.only({"request", "response"});
    m.kind = MiddlewareConfig::Kind::kHeaders;
    if (h.has("request")) m.request = read_edits(h.nested("request"));
    if (h.has("response")) m.response = read_edits(h.nested("response"));
  } else if (kind == "strip_prefix" || kind == "add_prefix") {
    m.kind = kind == "strip_prefix" ? MiddlewareConfig::Kind::kStripPrefix
                                    : MiddlewareConfig::Kind::kAddPrefix;
    m.prefix = entry.string(kind, "");
    if (!m.prefix.starts_with('/') || m.prefix.size() < 2 || m.prefix.ends_with('/') ||
        !http::is_request_target(m.prefix)) {
      entry.fail_key(kind,
                     "expected a path prefix such as /api (starting with /, not ending with /)");
    }
  } else if (kind == "rate_limit") {
    m.kind = MiddlewareConfig::Kind::kRateLimit;
    m.rate_limit = read_rate_limit(entry.nested("rate_limit"));
  } else if (kind == "replace_path") {
    m.kind = MiddlewareConfig::Kind::kReplacePath;
    m.replacement = entry.string(kind, "");
    if (!m.replacement.starts_with('/') || !http::is_request_target(m.replacement) ||
        m.replacement.find('?') != std::string::npos) {
      entry.fail_key(kind, "expected a path starting with / (the query is kept)");
    }
  } else if (kind == "replace_path_regex") {
    ConfigReader r = entry.nested(kind);
    r.only({"regex", "replacement"});
    m.kind = MiddlewareConfig::Kind::kReplacePathRegex;
    auto regex = std::make_shared<RE2>(r.string("regex", ""), RE2::Quiet);
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
  } else if (kind == "ip_allow" || kind == "ip_deny") {
    m.kind =
        kind == "ip_allow" ? MiddlewareConfig::Kind::kIpAllow : MiddlewareConfig::Kind::kIpDeny;
    for (const std::string& text : entry.strings(kind)) {
      auto cidr = Cidr::parse(text);
      if (!cidr) {
        entry.fail_key(
            kind, fmt::format("'{}' is not an address or network (10.0.0.0/8, fd00::/8)", text));
      }
      m.networks.push_back(*cidr);
    }
    if (m.networks.empty()) entry.fail_key(kind, "expected a list of networks");
  } else if (kind == "max_body") {
    m.kind = MiddlewareConfig::Kind::kMaxBody;
    m.max_body = entry.size(kind, 0);
  } else if (kind == "redirect") {
    ConfigReader r = entry.nested(kind);
    r.only({"scheme", "host", "port", "path", "status"});
    m.kind = MiddlewareConfig::Kind::kRedirect;
    m.scheme = r.string("scheme", "");
    if (!m.scheme.empty() && m.scheme != "http" && m.scheme != "https") {
      r.fail_key("scheme", "expected http or https");
    }
    m.host = r.string("host", "");
    if (!m.host.empty() && !http::is_field_value(m.host)) r.fail_key("host", "not a host name");
    m.port = static_cast<std::uint16_t>(r.number("port", 0, 65535));
    m.path = r.string("path", "");
    if (!m.path.empty() && (!m.path.starts_with('/') || !http::is_request_target(m.path))) {
      r.fail_key("path", "expected a path starting with /");
    }
    m.status = static_cast<int>(r.number("status", 302, 999));
    if (m.status != 301 && m.status != 302 && m.status != 303 && m.status != 307 &&
        m.status != 308) {
      r.fail_key("status", "expected 301, 302, 303, 307 or 308");
    }
  } else if (kind == "cors") {
    ConfigReader r = entry.nested(kind);
    r.only({"origins", "methods", "headers", "expose", "credentials", "max_age"});
    m.kind = MiddlewareConfig::Kind::kCors;
    CorsConfig& cors = m.cors;
    for (const std::string& origin : r.strings("origins")) {
      if (origin == "*") {
        cors.any_origin = true;
      } else if ((origin.starts_with("http://") || origin.starts_with("https://")) &&
                 http::is_field_value(origin) && !origin.ends_with('/')) {
        cors.origins.push_back(origin);
      } else {
        r.fail_key("origins",
                   fmt::format("'{}' is not an origin (scheme://host[:port], or *)", origin));
      }
    }
    if (!cors.any_origin && cors.origins.empty())
      r.fail_key("origins", "required: a list of origins, or *");
    if (r.has("methods")) {
      cors.methods.clear();
      for (const std::string& method : r.strings("methods")) {
        if (!http::is_method(method))
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
      std::string lower = name;
      std::ranges::transform(lower, lower.begin(),
                             [](char c) { return static_cast<char>(std::tolower(c)); });
      cors.headers.push_back(lower);
    }
    for (const std::string& name : r.strings("expose")) {
      if (!http::is_field_name(name))
        r.fail_key("expose", fmt::format("'{}' is not a field name", name));
      cors.expose.push_back(name);
    }
    cors.credentials = r.boolean("credentials", false);
    cors.max_age = std::chrono::duration_cast<std::chrono::seconds>(
        r.duration("max_age", std::chrono::seconds(600)));
  } else if (kind == "basic_auth") {
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
    std::ifstream in(file);
    if (!in) r.fail_key("users_file", fmt::format("cannot read {}", file));
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      if (line.empty() || line.starts_with('#')) continue;
      auto colon = line.find(':');
      std::string user = line.substr(0, colon);
      std::string hash = colon == std::string::npos ? "" : line.substr(colon + 1);
      bool bcrypt =
          hash.starts_with("$2y$") || hash.starts_with("$2b$") || hash.starts_with("$2a$");
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
  } else if (kind == "compression") {
    ConfigReader r = entry.nested(kind);
    r.only({"min_size", "gzip_level", "brotli_quality"});
    m.kind = MiddlewareConfig::Kind::kCompression;
    http::CompressionOptions options;
    options.min_size = r.size("min_size", options.min_size);
    options.gzip_level = static_cast<int>(r.number("gzip_level", 6, 9));
    if (options.gzip_level == 0) r.fail_key("gzip_level", "expected 1 to 9");
    options.brotli_quality = static_cast<int>(r.number("brotli_quality", 5, 11));
    m.compress = std::make_shared<const http::Middleware>(http::compression(options));
  } else if (kind == "mirror") {
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
  } else if (kind == "forward_auth") {
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
      auto& names = std::string_view(key) == "request_headers" ? auth->request_headers
                                                               : auth->response_headers;
      for (const std::string& name : r.strings(key)) {
        if (!http::is_field_name(name))
          r.fail_key(key, fmt::format("'{}' is not a field name", name));
        names.push_back(ascii_lower(name));
      }
    }
    m.forward_auth = std::move(auth);
  } else if (kind == "jwt") {
    m.kind = MiddlewareConfig::Kind::kJwt;
    m.jwt = read_jwt(entry.nested(kind));
  } else if (kind == "traffic_split") {
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
  } else if (kind == "respond") {
    ConfigReader r = entry.nested(kind);
    r.only({"status", "body", "content_type"});
    m.kind = MiddlewareConfig::Kind::kRespond;
    m.status = static_cast<int>(r.number("status", 200, 999));
    if (m.status < 200 || m.status > 599) r.fail_key("status", "expected 200 to 599");
    m.body = r.string("body", "");
    m.content_type = r.string("content_type", "text/plain; charset=utf-8");
    if (!http::is_field_value(m.content_type)) r.fail_key("content_type", "not a field value");
  } else {
    entry.fail(node.begin()->first, entry.key_path(kind),
               fmt::format("unknown middleware (expected one of: {})", kKnown));
  }
  return m;
}

RouteConfig read_route(const ConfigReader& r, const Config& config) {
  r.only({"name", "servers", "match", "middlewares", "service", "upgrades"});
  RouteConfig route;
  route.name = r.string("name", "");
  std::vector<std::string> server_names;
  for (const ServerConfig& s : config.servers) {
    if (!s.name.empty()) server_names.push_back(s.name);
  }
  for (const std::string& name : r.strings("servers")) {
    if (std::ranges::find(server_names, name) == server_names.end()) {
      r.fail_key("servers",
                 fmt::format("no server named '{}' ({})", name, known_names(server_names)));
    }
    route.servers.push_back(name);
  }
  if (!r.has("match"))
    r.fail(r.node(), r.key_path("match"), "required (match: {path_prefix: /} takes every request)");
  route.match = read_match(r.nested("match"));
  YAML::Node middlewares = r.sequence("middlewares", "a list of middlewares");
  for (std::size_t i = 0; i < middlewares.size(); ++i) {
    route.middlewares.push_back(
        read_middleware(r, middlewares[i], fmt::format("{}[{}]", r.key_path("middlewares"), i)));
  }
  // A rate limit by claim counts the claims of a jwt before it, which keeps them.
  std::shared_ptr<JwtConfig> jwt;
  for (std::size_t i = 0; i < route.middlewares.size(); ++i) {
    MiddlewareConfig& m = route.middlewares[i];
    if (m.kind == MiddlewareConfig::Kind::kJwt) {
      jwt = std::make_shared<JwtConfig>(*m.jwt);
      m.jwt = jwt;
    } else if (m.kind == MiddlewareConfig::Kind::kRateLimit &&
               m.rate_limit.key == RateLimitConfig::Key::kClaim) {
      if (!jwt) {
        r.fail(middlewares[i]["rate_limit"]["key"],
               fmt::format("{}[{}].rate_limit.key", r.key_path("middlewares"), i),
               "a claim is known only after a jwt: put one before this rate_limit");
      }
      jwt->kept_claims.push_back(m.rate_limit.header);
    }
  }
  route.service = r.string("service", "");
  if (route.service.empty()) r.fail(r.node(), r.key_path("service"), "required");
  if (r.has("upgrades")) {
    route.upgrades.clear();
    for (const std::string& protocol : r.strings("upgrades")) {
      if (!http::is_token(protocol)) {
        r.fail_key("upgrades", fmt::format("'{}' is not a protocol name (a token)", protocol));
      }
      std::string name = ascii_lower(protocol);
      if (name == "h2c") {
        r.fail_key("upgrades",
                   "h2c can never be allowed: the client's HTTP/2 streams would reach the "
                   "upstream past every route and middleware (h2c smuggling)");
      }
      route.upgrades.push_back(std::move(name));
    }
  }
  return route;
}

UpstreamTimeouts read_timeouts(const ConfigReader& r) {
  r.only({"connect", "first_byte", "read", "write", "idle", "tunnel"});
  UpstreamTimeouts t;
  t.connect = r.duration("connect", t.connect);
  t.first_byte = r.duration("first_byte", t.first_byte);
  t.read = r.duration("read", t.read);
  t.write = r.duration("write", t.write);
  t.idle = r.duration("idle", t.idle);
  t.tunnel = r.duration("tunnel", t.tunnel);  // 0 allowed: no limit
  for (auto [key, value] : {std::pair{"connect", t.connect},
                            {"first_byte", t.first_byte},
                            {"read", t.read},
                            {"write", t.write},
                            {"idle", t.idle}}) {
    if (value.count() == 0) r.fail_key(key, "must be more than 0");
  }
  return t;
}

RetryPolicy read_retries(const ConfigReader& r) {
  r.only({"attempts", "budget"});
  RetryPolicy p;
  p.attempts = static_cast<unsigned>(r.number("attempts", p.attempts, 10));
  if (p.attempts == 0) r.fail_key("attempts", "at least 1 (the first attempt)");
  if (r.has("budget")) {
    std::string text = r.string("budget", "");
    unsigned percent = 0;
    bool ok = text.ends_with('%');
    if (ok) {
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size() - 1, percent);
      ok = ec == std::errc{} && end == text.data() + text.size() - 1 && percent <= 100 &&
           text.size() > 1;
    }
    if (!ok) r.fail_key("budget", "expected a share of requests from 0% to 100%, such as 20%");
    p.budget = percent / 100.0;
  }
  return p;
}

// url: http://HOST[:PORT] or https://HOST[:PORT], nothing after the authority but "/".
void read_url(const ConfigReader& r, ServiceConfig& service, Config& config) {
  std::string url = r.string("url", "");
  bool https = url.starts_with("https://");
  std::string_view rest = url;
  if (https) {
    rest.remove_prefix(8);
  } else if (url.starts_with("http://")) {
    rest.remove_prefix(7);
  } else {
    r.fail_key("url", "expected http://HOST[:PORT] or https://HOST[:PORT]");
  }
  if (rest.ends_with('/')) rest.remove_suffix(1);
  bool has_port = !rest.empty() && rest.back() != ']' &&
                  rest.rfind(':') != std::string_view::npos &&
                  (rest.front() != '[' || rest.rfind(']') < rest.rfind(':'));
  std::string authority(rest);
  if (!has_port) authority += https ? ":443" : ":80";
  auto target = split_host_port(authority);
  if (!target) r.fail_key("url", "expected http://HOST[:PORT] or https://HOST[:PORT] (no path)");
  UpstreamConfig upstream;
  upstream.name = service.name + ".url";
  upstream.targets.push_back({target->first, target->second, 1});
  service.upstream = upstream.name;
  service.tls = https;
  config.upstreams.push_back(std::move(upstream));
}

ServiceConfig read_service(const std::string& name, const ConfigReader& r, Config& config) {
  r.only({"upstream", "url", "protocol", "timeouts", "retries", "tls", "request_buffering"});
  ServiceConfig service;
  service.name = name;
  if (r.has("upstream") == r.has("url")) {
    r.fail(r.node(), r.key_path("upstream"), "give one of upstream (a name) or url");
  }
  std::string protocol = r.string("protocol", "http");
  if (protocol == "http") {
    service.protocol = UpstreamProtocol::kHttp1;
  } else if (protocol == "h2") {
    service.protocol = UpstreamProtocol::kH2;
    service.tls = true;
  } else if (protocol == "h2c") {
    service.protocol = UpstreamProtocol::kH2c;
  } else {
    r.fail_key("protocol", "expected http, h2 (HTTP/2 over TLS) or h2c (cleartext HTTP/2)");
  }
  if (r.has("url")) {
    read_url(r, service, config);
    if (service.protocol == UpstreamProtocol::kH2c && service.tls) {
      r.fail_key("protocol", "h2c is cleartext: the url must be http://");
    }
    if (service.protocol == UpstreamProtocol::kH2 && !service.tls) {
      r.fail_key("protocol", "h2 is HTTP/2 over TLS: the url must be https:// (h2c for cleartext)");
    }
  } else {
    service.upstream = r.string("upstream", "");
  }
  if (r.has("tls")) {
    ConfigReader tls = r.nested("tls");
    tls.only({"ca", "verify", "server_name"});
    if (service.protocol == UpstreamProtocol::kH2c) {
      r.fail_key("tls", "h2c is cleartext: use protocol h2 for HTTP/2 over TLS");
    }
    if (r.has("url") && !service.tls) {
      r.fail_key("tls", "the url is http://: give https:// for TLS");
    }
    service.tls = true;
    if (tls.has("ca")) service.tls_ca_file = pem_file(tls, "ca", "a PEM CA bundle");
    service.tls_verify = tls.boolean("verify", true);
    service.tls_server_name = tls.string("server_name", "");
    if (!service.tls_server_name.empty() &&
        (!is_host(service.tls_server_name) ||
         service.tls_server_name.find(':') != std::string::npos)) {
      tls.fail_key("server_name", "expected a host name");
    }
  }
  if (r.has("timeouts")) service.timeouts = read_timeouts(r.nested("timeouts"));
  if (r.has("retries")) service.retries = read_retries(r.nested("retries"));
  service.request_buffering = r.size("request_buffering", service.request_buffering);
  return service;
}

void read_balancer(const ConfigReader& r, UpstreamConfig& u) {
  YAML::Node b = r.get("balancer");
  if (!b) return;
  if (b.IsScalar()) {
    const std::string& kind = b.Scalar();
    if (kind == "round_robin") {
      u.balancer = BalancerKind::kRoundRobin;
    } else if (kind == "weighted") {
      u.balancer = BalancerKind::kWeighted;
    } else if (kind == "least_connections") {
      u.balancer = BalancerKind::kLeastConnections;
    } else if (kind == "random_two") {
      u.balancer = BalancerKind::kRandomTwo;
    } else {
      r.fail_key("balancer",
                 "expected round_robin, weighted, least_connections, random_two or "
                 "consistent_hash: {by: header|cookie|client_ip, key: NAME}");
    }
    return;
  }
  ConfigReader kind = r.nested("balancer");
  kind.only({"consistent_hash"});
  ConfigReader hash = kind.nested("consistent_hash");
  hash.only({"by", "key"});
  std::string by = hash.string("by", "client_ip");
  u.balancer = BalancerKind::kConsistentHash;
  if (by == "client_ip") {
    u.hash.by = HashKey::By::kClientIp;
    if (hash.has("key")) hash.fail_key("key", "client_ip takes no key");
    return;
  }
  if (by == "header") {
    u.hash.by = HashKey::By::kHeader;
  } else if (by == "cookie") {
    u.hash.by = HashKey::By::kCookie;
  } else {
    hash.fail_key("by", "expected header, cookie or client_ip");
  }
  u.hash.key = hash.string("key", "");
  if (!http::is_field_name(u.hash.key)) {
    hash.fail(hash.has("key") ? hash.get("key") : hash.node(), hash.key_path("key"),
              fmt::format("required for by: {} (a header or cookie name)", by));
  }
  if (u.hash.by == HashKey::By::kHeader) u.hash.key = ascii_lower(u.hash.key);
}

void read_health(const ConfigReader& r, UpstreamConfig& u) {
  r.only({"active", "passive", "panic_threshold"});
  u.panic_threshold = static_cast<unsigned>(r.number("panic_threshold", u.panic_threshold, 100));
  if (r.has("active")) {
    ConfigReader a = r.nested("active");
    a.only({"path", "interval", "timeout", "healthy", "unhealthy"});
    ActiveHealthConfig& h = u.active_health;
    h.enabled = true;
    h.path = a.string("path", h.path);
    if (!h.path.starts_with('/') || !http::is_request_target(h.path)) {
      a.fail_key("path", "expected a path starting with /");
    }
    h.interval = a.duration("interval", h.interval);
    h.timeout = a.duration("timeout", h.timeout);
    if (h.interval.count() == 0) a.fail_key("interval", "must be more than 0");
    if (h.timeout.count() == 0) a.fail_key("timeout", "must be more than 0");
    h.healthy = static_cast<unsigned>(a.number("healthy", h.healthy, 100));
    h.unhealthy = static_cast<unsigned>(a.number("unhealthy", h.unhealthy, 100));
    if (h.healthy == 0) a.fail_key("healthy", "at least 1");
    if (h.unhealthy == 0) a.fail_key("unhealthy", "at least 1");
  }
  if (r.has("passive")) {
    ConfigReader p = r.nested("passive");
    p.only({"max_fails", "fail_timeout", "max_ejection_percent"});
    u.passive_health.max_fails =
        static_cast<unsigned>(p.number("max_fails", u.passive_health.max_fails, 1000));
    u.passive_health.fail_timeout = p.duration("fail_timeout", u.passive_health.fail_timeout);
    u.passive_health.max_ejection_percent = static_cast<unsigned>(
        p.number("max_ejection_percent", u.passive_health.max_ejection_percent, 100));
  }
}

UpstreamConfig read_upstream(const std::string& name, const ConfigReader& r) {
  r.only({"balancer", "targets", "srv", "health", "keepalive", "limits"});
  UpstreamConfig u;
  u.name = name;
  read_balancer(r, u);
  u.srv = r.string("srv", "");
  // SRV names have labels starting with '_' (_http._tcp.api.example).
  bool srv_name =
      !u.srv.empty() && !u.srv.starts_with('.') && !u.srv.ends_with('.') &&
      u.srv.find("..") == std::string::npos && std::ranges::all_of(u.srv, [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
      });
  if (r.has("srv") && !srv_name) {
    r.fail_key("srv", "expected a DNS name (_http._tcp.api.example)");
  }
  if (r.has("srv") && r.has("targets")) r.fail_key("srv", "either srv or targets, not both");
  YAML::Node targets = r.sequence("targets", "{address: HOST:PORT, weight: N}");
  if (targets.size() == 0 && u.srv.empty()) {
    r.fail(r.node(), r.key_path("targets"), "at least one target (or srv: NAME)");
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    ConfigReader t(r.file(), targets[i], fmt::format("{}[{}]", r.key_path("targets"), i));
    t.only({"address", "weight"});
    std::string address = t.string("address", "");
    auto split = split_host_port(address);
    if (!split) {
      t.fail(t.has("address") ? t.get("address") : t.node(), t.key_path("address"),
             address.empty() ? "required (HOST:PORT)"
                             : fmt::format("'{}' is not HOST:PORT ([IPv6]:PORT)", address));
    }
    auto weight = static_cast<unsigned>(t.number("weight", 1, 1000));
    if (weight == 0) t.fail_key("weight", "at least 1 (remove the target to send it nothing)");
    u.targets.push_back({split->first, split->second, weight});
  }
  if (r.has("health")) read_health(r.nested("health"), u);
  if (r.has("limits")) {
    ConfigReader l = r.nested("limits");
    l.only({"max_connections", "max_pending", "preempt_stalled"});
    u.limits.max_connections = l.number("max_connections", u.limits.max_connections, 1'000'000);
    u.limits.max_pending = l.number("max_pending", u.limits.max_pending, 1'000'000);
    u.limits.preempt_stalled = l.duration("preempt_stalled", u.limits.preempt_stalled);
  }
  // The connections made for the load stay for the idle timeout: fewer idle ones than may be
  // busy would close and open connections at every request beyond them (2.7x the CPU a
  // proxied request with max_connections 1024 and 256 idle). A limit of 0 (none) keeps 256.
  if (u.limits.max_connections != 0) {
    u.keepalive.max_idle = std::min<std::size_t>(u.limits.max_connections, 100'000);
  }
  if (r.has("keepalive")) {
    ConfigReader k = r.nested("keepalive");
    k.only({"max_idle", "idle_timeout"});
    u.keepalive.max_idle = k.number("max_idle", u.keepalive.max_idle, 100'000);
    u.keepalive.idle_timeout = k.duration("idle_timeout", u.keepalive.idle_timeout);
  }
  return u;
}

}  // namespace

std::optional<std::pair<std::string, std::uint16_t>> split_host_port(std::string_view text) {
  std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  std::string_view host = text.substr(0, colon), port_text = text.substr(colon + 1);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return std::nullopt;
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return std::nullopt;  // IPv6 needs brackets
  }
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc{} || end != port_text.data() + port_text.size() ||
      port == 0 || port > 65535 || !is_host(host)) {
    return std::nullopt;
  }
  return std::pair{ascii_lower(std::string(host)), static_cast<std::uint16_t>(port)};
}

void read_redis(const ConfigReader& top, Config& config) {
  if (!top.has("redis")) return;
  ConfigReader r = top.nested("redis");
  r.only({"address", "timeout", "password", "database", "backoff"});
  RedisConfig redis;
  std::string address = r.string("address", "");
  auto split = split_host_port(address);
  if (!split) {
    r.fail(r.has("address") ? r.get("address") : r.node(), r.key_path("address"),
           address.empty() ? "required (HOST:PORT)"
                           : fmt::format("'{}' is not HOST:PORT ([IPv6]:PORT)", address));
  }
  redis.host = split->first;
  redis.port = split->second;
  redis.timeout = r.duration("timeout", redis.timeout);
  if (redis.timeout.count() == 0) r.fail_key("timeout", "must be more than 0");
  redis.password = r.string("password", "");
  redis.database = static_cast<unsigned>(r.number("database", 0, 1'000'000));
  redis.backoff = r.duration("backoff", redis.backoff);
  config.redis = std::move(redis);
}

void read_dns(const ConfigReader& top, Config& config) {
  if (!top.has("dns")) return;
  ConfigReader r = top.nested("dns");
  r.only({"servers", "min_ttl", "max_ttl", "srv_refresh", "timeout"});
  DnsConfig& dns = config.dns;
  for (const std::string& server : r.strings("servers")) {
    auto address = Address::parse(server);
    if (!address || !address->unix_path().empty()) {
      r.fail_key("servers", fmt::format("'{}' is not IPv4:PORT or [IPv6]:PORT", server));
    }
    dns.servers.push_back(server);
  }
  dns.min_ttl = r.duration("min_ttl", dns.min_ttl);
  dns.max_ttl = r.duration("max_ttl", dns.max_ttl);
  if (dns.min_ttl.count() == 0) r.fail_key("min_ttl", "must be more than 0");
  if (dns.max_ttl < dns.min_ttl) r.fail_key("max_ttl", "must be at least min_ttl");
  dns.srv_refresh = r.duration("srv_refresh", dns.srv_refresh);
  if (dns.srv_refresh.count() == 0) r.fail_key("srv_refresh", "must be more than 0");
  dns.timeout = r.duration("timeout", dns.timeout);
  if (dns.timeout.count() == 0) r.fail_key("timeout", "must be more than 0");
}

void read_gateway(const ConfigReader& top, Config& config) {
  read_redis(top, config);
  read_dns(top, config);
  for_each_entry(top, "upstreams", [&](const std::string& name, const ConfigReader& r) {
    config.upstreams.push_back(read_upstream(name, r));
  });
  std::vector<std::string> upstream_names;
  for (const auto& u : config.upstreams) upstream_names.push_back(u.name);
  for_each_entry(top, "services", [&](const std::string& name, const ConfigReader& r) {
    ServiceConfig service = read_service(name, r, config);
    if (r.has("upstream") && !config.upstream(service.upstream)) {
      r.fail_key("upstream", fmt::format("no upstream named '{}' ({})", service.upstream,
                                         known_names(upstream_names)));
    }
    config.services.push_back(std::move(service));
  });
  std::vector<std::string> service_names;
  for (const auto& s : config.services) service_names.push_back(s.name);
  YAML::Node routes = top.sequence("routes", "routes ({name, match, service})");
  std::set<std::string> route_names;
  for (std::size_t i = 0; i < routes.size(); ++i) {
    ConfigReader r(top.file(), routes[i], fmt::format("routes[{}]", i));
    RouteConfig route = read_route(r, config);
    if (!config.service(route.service)) {
      r.fail_key("service", fmt::format("no service named '{}' ({})", route.service,
                                        known_names(service_names)));
    }
    for (std::size_t k = 0; k < route.middlewares.size(); ++k) {
      const MiddlewareConfig& m = route.middlewares[k];
      std::string named = m.forward_auth                              ? m.forward_auth->service
                          : m.kind == MiddlewareConfig::Kind::kMirror ? m.mirror.service
                                                                      : std::string();
      if (!named.empty() && !config.service(named)) {
        const char* kind = m.forward_auth ? "forward_auth" : "mirror";
        r.fail(routes[i]["middlewares"][k][kind]["service"],
               fmt::format("{}[{}].{}.service", r.key_path("middlewares"), k, kind),
               fmt::format("no service named '{}' ({})", named, known_names(service_names)));
      }
    }
    for (std::size_t k = 0; k < route.middlewares.size(); ++k) {
      const auto& shares = route.middlewares[k].traffic_split.shares;
      for (std::size_t j = 0; j < shares.size(); ++j) {
        if (config.service(shares[j].service)) continue;
        YAML::Node at = routes[i]["middlewares"][k]["traffic_split"]["services"][j]["service"];
        r.fail(at,
               fmt::format("{}[{}].traffic_split.services[{}].service", r.key_path("middlewares"),
                           k, j),
               fmt::format("no service named '{}' ({})", shares[j].service,
                           known_names(service_names)));
      }
    }
    for (std::size_t k = 0; k < route.middlewares.size(); ++k) {
      const MiddlewareConfig& m = route.middlewares[k];
      if (m.kind == MiddlewareConfig::Kind::kRateLimit &&
          m.rate_limit.store == RateLimitConfig::Store::kRedis && !config.redis) {
        r.fail(routes[i]["middlewares"][k]["rate_limit"]["store"],
               fmt::format("{}[{}].rate_limit.store", r.key_path("middlewares"), k),
               "redis needs a top-level redis: {address: HOST:PORT}");
      }
    }
    if (!route.name.empty() && !route_names.insert(route.name).second) {
      r.fail_key("name", fmt::format("another route is named '{}'", route.name));
    }
    if (route.name.empty()) route.name = fmt::format("routes[{}]", i);
    config.routes.push_back(std::move(route));
  }
}

}  // namespace spindle::proxy::detail
