#include "gateway_config.h"

#include <fmt/format.h>
#include <re2/re2.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <set>

#include "spindle/base/ascii.h"
#include "spindle/http/canonical.h"
#include "spindle/http/rules.h"
#include "spindle/http/target.h"
#include "spindle/proxy/jwt_keys.h"

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
    // As a request's method is judged (http/canonical.h): "put" is PUT.
    auto canonical = http::is_method(method) ? http::canonical_method(method) : std::nullopt;
    if (!canonical) r.fail_key("methods", fmt::format("'{}' is not a method", method));
    m.methods.emplace_back(*canonical);
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

// True if `route` applies to `server` (a route naming no servers applies to every one).
bool route_serves(const RouteConfig& route, const ServerConfig& server) {
  return route.servers.empty() ||
         std::ranges::find(route.servers, server.name) != route.servers.end();
}

// Refuses a route's `path` or `path_prefix` that no request can have: requests are normalised
// before routing (http/target.h, with the rules of each server the route applies to), route
// paths are matched as written, so "/%7Euser", "//admin" or "/a/../admin" would never match
// and the request would go to another route, unjudged. The query is never part of the path.
void refuse_unnormal_paths(const ConfigReader& r, const RouteConfig& route, const Config& config) {
  for (auto [key, value] :
       {std::pair{"path", &route.match.path}, {"path_prefix", &route.match.path_prefix}}) {
    if (value->empty()) continue;
    if (value->find('?') != std::string::npos) {
      r.fail_key(
          key, fmt::format("'{}': a route matches the path; the query is not part of it", *value));
    }
    for (const ServerConfig& server : config.servers) {
      if (!route_serves(route, server)) continue;
      std::string normal = *value;
      auto size = http::normalize_target(normal.data(), normal.size(), server.http.paths);
      if (!size) {
        r.fail_key(
            key, fmt::format("'{}': no request has such a path ({})", *value, size.error().reason));
      }
      normal.resize(*size);
      if (normal != *value) {
        r.fail_key(key, fmt::format("'{}' is not a path a request can have: requests are "
                                    "normalised before routing (escapes of unreserved "
                                    "characters decoded, dot segments removed, runs of / "
                                    "merged): write '{}'",
                                    *value, normal));
      }
    }
  }
}

// True if every request route `r` can take meets the conditions of `p` other than the path:
// the same hosts, and methods, fields and servers that filter no more than r's do.
bool takes_all_but_the_path(const RouteConfig& p, const RouteConfig& r) {
  auto sorted = [](std::vector<std::string> v) {
    std::ranges::sort(v);
    return v;
  };
  auto within = [](const auto& small, const auto& large) {
    return std::ranges::all_of(
        small, [&](const auto& x) { return std::ranges::find(large, x) != large.end(); });
  };
  bool methods = p.match.methods.empty() ||
                 (!r.match.methods.empty() && within(r.match.methods, p.match.methods));
  bool servers = p.servers.empty() || (!r.servers.empty() && within(r.servers, p.servers));
  return sorted(p.match.hosts) == sorted(r.match.hosts) && methods && servers &&
         within(p.match.headers, r.match.headers);
}

// True if every path `regex` can match begins with `prefix`, ASCII case aside: the range of
// its matches (RE2::PossibleMatchRange, of the pattern read with case) lies within the prefix's
// (a case-insensitive match is a match of some case spelling). "/" is every path but "*"
// (OPTIONS *).
bool regex_within_prefix(const std::string& regex, const std::string& prefix) {
  RE2 cased(regex, RE2::Quiet);
  if (prefix == "/") return !RE2::PartialMatch("*", cased);
  std::string min, max;
  if (!cased.PossibleMatchRange(&min, &max, static_cast<int>(prefix.size()) + 1)) return false;
  return min.starts_with(prefix) && max.starts_with(prefix);
}

// Refuses a path_regex route no request can reach: a path_prefix route (route_table.h ranks it
// above every path_regex) that takes every request the regex route does. A guarded route that
// looks reachable but is not sends its requests unjudged to the other.
void refuse_unreachable_routes(const ConfigReader& top, const Config& config) {
  YAML::Node routes = top.get("routes");
  for (std::size_t i = 0; i < config.routes.size(); ++i) {
    const RouteConfig& r = config.routes[i];
    if (r.match.path_regex.empty()) continue;
    for (const RouteConfig& p : config.routes) {
      if (p.match.path_prefix.empty() || !takes_all_but_the_path(p, r) ||
          !regex_within_prefix(r.match.path_regex, p.match.path_prefix)) {
        continue;
      }
      top.fail(routes[i]["match"]["path_regex"], fmt::format("routes[{}].match.path_regex", i),
               fmt::format("route '{}' can take no request: route '{}' (path_prefix: {}) takes "
                           "every path it matches, and a path_prefix outranks a path_regex; "
                           "give it a path_prefix or path, or narrow '{}'",
                           r.name, p.name, p.match.path_prefix, p.name));
    }
  }
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
  refuse_unnormal_paths(r.nested("match"), route, config);
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
  r.only({"servers", "min_ttl", "max_ttl", "srv_refresh", "timeout", "stale_grace"});
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
  dns.stale_grace = r.duration("stale_grace", dns.stale_grace);
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
  refuse_unreachable_routes(top, config);
}

}  // namespace spindle::proxy::detail
