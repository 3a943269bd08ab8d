#include "spindle/proxy/route_table.h"

#include <re2/re2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "spindle/base/ascii.h"

namespace spindle::proxy {
namespace {

// The host in lower case, without port or trailing dot.
std::string normalise_host(std::string_view host) {
  if (host.starts_with('[')) {
    std::size_t end = host.find(']');
    host = host.substr(0, end == std::string_view::npos ? host.size() : end + 1);
  } else if (std::size_t colon = host.rfind(':'); colon != std::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (host.ends_with('.')) host.remove_suffix(1);
  return ascii_lower(host);
}

// How well `hosts` matches `host`: 0 no match; 1 no host condition; 2 + the wildcard domain's
// length for a wildcard; a value above every wildcard for the exact name.
std::size_t host_rank(const std::vector<std::string>& hosts, const std::string& host) {
  if (hosts.empty()) return 1;
  std::size_t best = 0;
  for (const std::string& pattern : hosts) {
    if (pattern == host) return SIZE_MAX;
    if (pattern.starts_with("*.")) {
      std::string_view domain = std::string_view(pattern).substr(1);  // ".example.com"
      if (host.size() > domain.size() && host.ends_with(domain)) {
        best = std::max(best, 2 + domain.size());
      }
    }
  }
  return best;
}

// True if `path` begins with `prefix`, ASCII case aside: many upstreams route without regard to
// case (Express and ASP.NET by default), so every case spelling of a protected path must be
// judged by the route that protects it.
bool starts_with_any_case(std::string_view path, std::string_view prefix) {
  return path.size() >= prefix.size() && http::iequals(path.substr(0, prefix.size()), prefix);
}

// True if the route's `prefix` takes `path`: it begins with it, ASCII case aside, or is the
// prefix less its trailing '/' ("/admin" for "/admin/"), which Express (non-strict routing, its
// default) serves with its "/admin/" view and Flask redirects there.
bool under_prefix(std::string_view path, std::string_view prefix) {
  if (starts_with_any_case(path, prefix)) return true;
  return prefix.size() > 1 && prefix.ends_with('/') &&
         http::iequals(path, prefix.substr(0, prefix.size() - 1));
}

// `path` without one trailing '/' ("/" stays).
std::string_view without_trailing_slash(std::string_view path) {
  return path.size() > 1 && path.ends_with('/') ? path.substr(0, path.size() - 1) : path;
}

// True if `path` is the route's exact `wanted` path, ASCII case and one trailing '/' aside
// (Express routes /a/ as /a; Flask redirects /a to the /a/ of its rule).
bool same_path_any_case(std::string_view path, std::string_view wanted) {
  return http::iequals(without_trailing_slash(path), without_trailing_slash(wanted));
}

// True if `method` is one of `methods`; HEAD is wherever GET is (RFC 9110 §9.3.2: a server
// answers HEAD as it would GET, and Flask, Express and Go's mux run the GET handler for it).
bool method_allowed(const std::vector<std::string>& methods, std::string_view method) {
  if (methods.empty() || std::ranges::find(methods, method) != methods.end()) return true;
  return method == "HEAD" && std::ranges::find(methods, "GET") != methods.end();
}

}  // namespace

RouteTable::RouteTable(const Config& config, std::string_view server_name) {
  for (const RouteConfig& route : config.routes) {
    if (!route.servers.empty() &&
        std::ranges::find(route.servers, server_name) == route.servers.end()) {
      continue;
    }
    Entry entry{&route, nullptr};
    if (!route.match.path_regex.empty()) {
      // Paths are matched ASCII case aside (starts_with_any_case).
      re2::RE2::Options options(re2::RE2::Quiet);
      options.set_case_sensitive(false);
      entry.regex = std::make_unique<re2::RE2>(route.match.path_regex, options);
    }
    entries_.push_back(std::move(entry));
  }
}

RouteTable::~RouteTable() = default;
RouteTable::RouteTable(RouteTable&&) noexcept = default;
RouteTable& RouteTable::operator=(RouteTable&&) noexcept = default;

const RouteConfig* RouteTable::select(std::string_view host, std::string_view target,
                                      std::string_view method,
                                      const http::HeaderMap& headers) const {
  std::string_view path = target.substr(0, target.find('?'));
  std::string wanted_host = normalise_host(host);
  const RouteConfig* best = nullptr;
  // (host rank, path kind, prefix length): larger is more specific; ties keep the earlier.
  std::array<std::size_t, 3> best_rank{};
  for (const Entry& entry : entries_) {
    const RouteMatch& m = entry.route->match;
    std::size_t by_host = host_rank(m.hosts, wanted_host);
    if (by_host == 0) continue;
    std::array<std::size_t, 3> rank{by_host, 0, 0};
    if (!m.path.empty()) {
      if (!same_path_any_case(path, m.path)) continue;
      rank[1] = 4;
    } else if (!m.path_prefix.empty()) {
      if (!under_prefix(path, m.path_prefix)) continue;
      rank[1] = 3;
      rank[2] = m.path_prefix.size();
    } else if (entry.regex) {
      if (!re2::RE2::PartialMatch(re2::StringPiece(path.data(), path.size()), *entry.regex)) {
        continue;
      }
      rank[1] = 2;
    } else {
      rank[1] = 1;
    }
    if (!method_allowed(m.methods, method)) continue;
    // CONNECT opens a tunnel: only a route that names the method takes it, never a catch-all.
    if (method == "CONNECT" && m.methods.empty()) continue;
    bool headers_match = std::ranges::all_of(m.headers, [&](const auto& field) {
      auto value = headers.get(field.first);
      return value && *value == field.second;
    });
    if (!headers_match) continue;
    if (best == nullptr || rank > best_rank) {
      best = entry.route;
      best_rank = rank;
    }
  }
  return best;
}

}  // namespace spindle::proxy
