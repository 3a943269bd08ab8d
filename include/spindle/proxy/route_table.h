#pragma once
/// RouteTable: which route of the configuration takes a request, for one server.
///
/// A route is a candidate when every condition of its `match` holds (host, path, methods,
/// headers). Of several candidates the most specific wins, in this order:
///   1. the host: a route naming the exact host, then one whose "*.domain" wildcard matches
///      (the longer domain first), then one naming no hosts;
///   2. the path: an exact `path`, then the longest `path_prefix`, then a `path_regex`, then
///      no path condition;
///   3. the order in which the routes are declared.
/// Paths are compared without regard to ASCII case (path, path_prefix, path_regex alike), and an
/// exact `path` with or without one trailing '/' (a `path_prefix` ending in '/' takes the path
/// without it too): upstreams such as Express route so, and every
/// spelling they serve as a protected path must be judged by the route that protects it.
/// A route whose methods name GET takes HEAD too (RFC 9110 §9.3.2: the upstream runs its GET
/// handler for it). Methods and headers only filter; they do not make a route more specific. Built
/// once per configuration (regular expressions compiled then), read-only afterwards: any thread.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "spindle/http/header_map.h"
#include "spindle/proxy/config.h"

namespace re2 {
class RE2;
}

namespace spindle::proxy {

/// A field name a configuration's routes judge or write (a route's match on fields, a rate
/// limit's key, what jwt and forward_auth write, what forward_auth sends, a headers edit): a
/// request may have it once, in this spelling (Gateway::Server::owned_fields).
struct OwnedField {
  std::string written;  ///< lower case, as the configuration spells it
  std::string folded;   ///< lower case, each '_' as '-': the name of its every spelling
};

class RouteTable {
 public:
  /// The routes of `config` that apply to the server named `server_name` (a route naming no
  /// servers applies to every server). `config` must outlive the table.
  RouteTable(const Config& config, std::string_view server_name);
  ~RouteTable();
  RouteTable(RouteTable&&) noexcept;
  RouteTable& operator=(RouteTable&&) noexcept;

  /// The route for a request to `host` (its Host or :authority; any port and a trailing dot
  /// are ignored, case too) with request target `target` (the query is not part of the path),
  /// or nullptr if none matches.
  const RouteConfig* select(std::string_view host, std::string_view target, std::string_view method,
                            const http::HeaderMap& headers) const;

  /// Routes in the table.
  std::size_t size() const { return entries_.size(); }
  /// Route `i` (below size()), in the configuration's order.
  const RouteConfig& route(std::size_t i) const { return *entries_[i].route; }

 private:
  struct Entry {
    const RouteConfig* route;
    std::unique_ptr<re2::RE2> regex;
  };
  std::vector<Entry> entries_;
};

}  // namespace spindle::proxy
