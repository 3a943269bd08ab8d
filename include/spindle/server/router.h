#pragma once
/// Router: maps (method, path) to a handler through a tree of path segments — static segments,
/// `{param}` segments and a trailing `*wildcard` — with middleware around every request.
/// Answers 404 for unknown paths, 405 with Allow for unknown methods, HEAD from GET, and
/// OPTIONS with Allow.

#include <concepts>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "spindle/server/message.h"

namespace spindle::http {

/// Answers one request. May throw: HttpError becomes its status, anything else a 500.
using Handler = std::function<Response(Request&)>;
/// The rest of the chain, as seen by a middleware: call it (or not) while the middleware runs;
/// it refers to the chain, it does not hold it, so it is not kept past that call. Any callable
/// taking a Request& converts to one (a test calls a middleware with a lambda).
class Next {
 public:
  template <typename F>
  requires(!std::same_as<std::remove_cvref_t<F>, Next> &&
           std::is_invocable_r_v<Response, F&, Request&>)
      Next(F&& rest)  // NOLINT(google-explicit-constructor): a lambda stands for the rest
      : rest_(const_cast<void*>(static_cast<const void*>(std::addressof(rest)))),
        call_([](void* f, Request& r) -> Response {
          return (*static_cast<std::remove_reference_t<F>*>(f))(r);
        }) {}
  Next(const Next&) = delete;
  Next& operator=(const Next&) = delete;

  Response operator()(Request& request) const { return call_(rest_, request); }

 private:
  void* rest_;
  Response (*call_)(void*, Request&);
};
/// Runs around the handlers: may answer itself, or call next(request) and adjust its response.
using Middleware = std::function<Response(Request&, const Next&)>;

/// A route table. Build it first, then share it read-only between workers.
class Router {
 public:
  Router();
  ~Router();
  Router(Router&&) noexcept;
  Router& operator=(Router&&) noexcept;

  /// Adds a route. `pattern` starts with '/'; a segment may be `{name}` (matches one segment)
  /// or, as the last one, `*name` (matches the rest, possibly empty). Static segments win over
  /// `{param}`, which wins over `*wildcard`. Throws std::invalid_argument for a malformed
  /// pattern or a route that is already taken.
  Router& route(std::string_view method, std::string_view pattern, Handler handler);
  Router& get(std::string_view pattern, Handler h) { return route("GET", pattern, std::move(h)); }
  Router& post(std::string_view pattern, Handler h) { return route("POST", pattern, std::move(h)); }
  Router& put(std::string_view pattern, Handler h) { return route("PUT", pattern, std::move(h)); }
  Router& patch(std::string_view pattern, Handler h) {
    return route("PATCH", pattern, std::move(h));
  }
  Router& del(std::string_view pattern, Handler h) {
    return route("DELETE", pattern, std::move(h));
  }
  /// Adds a middleware; they run in the order added, outermost first.
  Router& use(Middleware middleware);

  /// Runs the middleware chain and the matching handler. Handler exceptions propagate.
  Response handle(Request& request) const;

 private:
  struct Node;
  /// The route for `path`, filling the request's parameters; nullptr if none.
  const Node* match(std::string_view path, Request& request) const;
  /// Picks the handler by method (or answers 405 / OPTIONS).
  Response dispatch(Request& request) const;
  /// Runs middleware `i` (or dispatch past the last).
  Response run(std::size_t i, Request& request) const;

  /// A multiply-xor hash of eight bytes at a time: a route path is short, and std::hash's
  /// byte-wise Murmur showed in the per-request cost.
  static std::uint64_t path_hash(std::string_view s) {
    std::uint64_t h = s.size() * 0x9e3779b97f4a7c15ull;
    std::size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      std::uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      h = (h ^ w) * 0xff51afd7ed558ccdull;
      h ^= h >> 32;
    }
    for (; i < s.size(); ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 0x100000001b3ull;
    return h ^ (h >> 29);
  }
  /// Adds a route of static segments only to exact_.
  void add_exact(std::string_view path, const Node* node);

  /// The tree's root ("/").
  std::unique_ptr<Node> root_;
  /// Routes made of static segments only, by their whole path: a request for one of them is
  /// found with one hash lookup (the walk would reach the same node, static segments winning).
  /// Open addressing in a power-of-two table at most half full (no division to find a slot,
  /// no node to follow); a path is compared only where the whole hash agrees.
  struct ExactRoute {
    std::uint64_t hash = 0;
    std::string path;
    const Node* node = nullptr;  ///< nullptr: an empty slot
  };
  std::vector<ExactRoute> exact_;
  std::size_t exact_count_ = 0;
  /// The middleware, outermost first.
  std::vector<Middleware> middleware_;
};

}  // namespace spindle::http
