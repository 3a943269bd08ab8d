#include "spindle/server/router.h"

#include <algorithm>
#include <stdexcept>

#include "spindle/http/bytes.h"

namespace spindle::http {

struct Router::Node {
  /// Children for literal segments.
  std::vector<std::pair<std::string, std::unique_ptr<Node>>> statics;
  /// The `{name}` child and its name.
  std::unique_ptr<Node> param;
  std::string param_name;
  /// The `*name` child (always a leaf) and its name.
  std::unique_ptr<Node> wildcard;
  std::string wildcard_name;
  /// Handlers by method.
  std::vector<std::pair<std::string, Handler>> handlers;

  const Handler* find(std::string_view method) const {
    for (const auto& [m, h] : handlers) {
      if (m == method) return &h;
    }
    return nullptr;
  }
};

namespace {

// Splits off the first segment of `path` (which starts after a '/').
std::string_view next_segment(std::string_view& path) {
  std::size_t slash = path.find('/');
  std::string_view segment = path.substr(0, slash);
  path = slash == std::string_view::npos ? std::string_view() : path.substr(slash + 1);
  return segment;
}

bool is_param(std::string_view s) { return s.size() > 2 && s.front() == '{' && s.back() == '}'; }

}  // namespace

Router::Router() : root_(std::make_unique<Node>()) {}
Router::~Router() = default;
Router::Router(Router&&) noexcept = default;
Router& Router::operator=(Router&&) noexcept = default;

Router& Router::route(std::string_view method, std::string_view pattern, Handler handler) {
  if (pattern.empty() || pattern.front() != '/') {
    throw std::invalid_argument("route pattern must start with '/': " + std::string(pattern));
  }
  Node* node = root_.get();
  std::string_view rest = pattern.substr(1);
  bool more = !rest.empty();
  bool all_static = true;
  while (more) {
    more = rest.find('/') != std::string_view::npos;
    std::string_view segment = next_segment(rest);
    if (segment.starts_with('*')) {
      if (more)
        throw std::invalid_argument("*wildcard must be the last segment: " + std::string(pattern));
      if (!node->wildcard) {
        node->wildcard = std::make_unique<Node>();
        node->wildcard_name = std::string(segment.substr(1));
      } else if (node->wildcard_name != segment.substr(1)) {
        throw std::invalid_argument("conflicting wildcard names in " + std::string(pattern));
      }
      node = node->wildcard.get();
      all_static = false;
    } else if (is_param(segment)) {
      std::string_view name = segment.substr(1, segment.size() - 2);
      if (!node->param) {
        node->param = std::make_unique<Node>();
        node->param_name = std::string(name);
      } else if (node->param_name != name) {
        throw std::invalid_argument("conflicting parameter names in " + std::string(pattern));
      }
      node = node->param.get();
      all_static = false;
    } else {
      if (segment.find_first_of("{}") != std::string_view::npos) {
        throw std::invalid_argument("malformed segment '" + std::string(segment) + "' in " +
                                    std::string(pattern));
      }
      auto it = std::find_if(node->statics.begin(), node->statics.end(),
                             [&](const auto& child) { return child.first == segment; });
      if (it == node->statics.end()) {
        node->statics.emplace_back(std::string(segment), std::make_unique<Node>());
        it = node->statics.end() - 1;
      }
      node = it->second.get();
    }
  }
  if (node->find(method)) {
    throw std::invalid_argument("route already defined: " + std::string(method) + " " +
                                std::string(pattern));
  }
  node->handlers.emplace_back(std::string(method), std::move(handler));
  if (all_static) add_exact(pattern, node);
  return *this;
}

Router& Router::use(Middleware middleware) {
  middleware_.push_back(std::move(middleware));
  return *this;
}

Response Router::handle(Request& request) const { return run(0, request); }

Response Router::run(std::size_t i, Request& request) const {
  if (i == middleware_.size()) return dispatch(request);
  auto rest = [this, i](Request& r) { return run(i + 1, r); };
  return middleware_[i](request, Next(rest));
}

void Router::add_exact(std::string_view path, const Node* node) {
  if ((exact_count_ + 1) * 2 > exact_.size()) {
    std::vector<ExactRoute> old = std::move(exact_);
    exact_.assign(std::max<std::size_t>(16, old.size() * 2), ExactRoute{});
    exact_count_ = 0;
    for (ExactRoute& route : old) {
      if (route.node != nullptr) add_exact(route.path, route.node);
    }
  }
  const std::uint64_t hash = path_hash(path);
  const std::size_t mask = exact_.size() - 1;
  std::size_t at = hash & mask;
  for (; exact_[at].node != nullptr; at = (at + 1) & mask) {
    if (exact_[at].path == path) return;  // another method of the same route: the same node
  }
  exact_[at] = {hash, std::string(path), node};
  ++exact_count_;
}

const Router::Node* Router::match(std::string_view path, Request& request) const {
  if (!exact_.empty()) {
    const std::uint64_t hash = path_hash(path);
    const std::size_t mask = exact_.size() - 1;
    for (std::size_t at = hash & mask; exact_[at].node != nullptr; at = (at + 1) & mask) {
      const ExactRoute& route = exact_[at];
      if (route.hash == hash && http::equal_bytes(route.path, path)) {
        request.clear_params();
        return route.node;
      }
    }
  }
  // Depth-first, static before {param} before *wildcard; parameters of an abandoned branch are
  // dropped by truncating to the count on entry.
  struct Matcher {
    Request& request;
    std::vector<std::pair<std::string_view, std::string_view>> params;

    const Node* walk(const Node* node, std::string_view rest, bool at_end) {
      if (at_end) {
        if (!node->handlers.empty()) return node;
        // "/files/" and "/files" both reach an empty wildcard.
        if (node->wildcard && !node->wildcard->handlers.empty()) {
          params.emplace_back(node->wildcard_name, std::string_view());
          return node->wildcard.get();
        }
        return nullptr;
      }
      std::string_view remaining = rest;
      bool more = remaining.find('/') != std::string_view::npos;
      std::string_view segment = next_segment(remaining);
      for (const auto& [name, child] : node->statics) {
        if (name == segment) {
          if (const Node* found = walk(child.get(), remaining, !more)) return found;
        }
      }
      std::size_t mark = params.size();
      if (node->param && !segment.empty()) {
        params.emplace_back(node->param_name, segment);
        if (const Node* found = walk(node->param.get(), remaining, !more)) return found;
        params.resize(mark);
      }
      if (node->wildcard) {
        params.emplace_back(node->wildcard_name, rest);
        return node->wildcard.get();
      }
      return nullptr;
    }
  } matcher{request, {}};

  std::string_view rest = path.substr(1);
  const Node* node = matcher.walk(root_.get(), rest, rest.empty() && path == "/");
  if (node) {
    request.clear_params();
    for (const auto& [n, v] : matcher.params) request.set_param(n, v);
  }
  return node;
}

Response Router::dispatch(Request& request) const {
  const Node* node = match(request.path(), request);
  if (!node) return Response::error(404);
  std::string_view method = request.method();
  if (const Handler* h = node->find(method)) return (*h)(request);
  if (method == "HEAD") {
    if (const Handler* h = node->find("GET")) return (*h)(request);
  }
  std::string allow;
  for (const auto& [m, h] : node->handlers) {
    allow += allow.empty() ? m : ", " + m;
    if (m == "GET" && !node->find("HEAD")) allow += ", HEAD";
  }
  if (!node->find("OPTIONS")) allow += ", OPTIONS";
  Response response = method == "OPTIONS" ? Response(204) : Response::error(405);
  response.headers.add(std::string_view("Allow"), allow);
  return response;
}

}  // namespace spindle::http
