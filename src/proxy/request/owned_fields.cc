#include "owned_fields.h"

#include <algorithm>

#include "spindle/base/ascii.h"
#include "spindle/http/canonical.h"

namespace spindle::proxy::detail {
namespace {

// Adds `name` to `out` unless it is there.
void note(std::string_view name, std::vector<OwnedField>& out) {
  OwnedField field{ascii_lower(name), ascii_lower(name)};
  std::ranges::replace(field.folded, '_', '-');
  if (std::ranges::none_of(out, [&](const OwnedField& f) { return f.written == field.written; })) {
    out.push_back(std::move(field));
  }
}

// The fields a middleware judges (a rate limit's key, those forward_auth sends) or writes.
void note_middleware(const MiddlewareConfig& m, std::vector<OwnedField>& out) {
  using Kind = MiddlewareConfig::Kind;
  if (m.kind == Kind::kRateLimit && m.rate_limit.key == RateLimitConfig::Key::kHeader) {
    note(m.rate_limit.header, out);
  } else if (m.kind == Kind::kJwt) {
    for (const auto& [claim, field] : m.jwt->claims_to_headers) note(field, out);
  } else if (m.kind == Kind::kForwardAuth) {
    for (const std::string& field : m.forward_auth->request_headers) note(field, out);
    for (const std::string& field : m.forward_auth->response_headers) note(field, out);
  } else if (m.kind == Kind::kHeaders) {
    for (const auto& [field, value] : m.request.set) note(field, out);
    for (const auto& [field, value] : m.request.add) note(field, out);
    for (const std::string& field : m.request.remove) note(field, out);
  }
}

}  // namespace

std::vector<OwnedField> owned_fields(const RouteTable& routes) {
  std::vector<OwnedField> out;
  for (std::size_t i = 0; i < routes.size(); ++i) {
    const RouteConfig& route = routes.route(i);
    for (const auto& [field, value] : route.match.headers) note(field, out);
    for (const MiddlewareConfig& m : route.middlewares) note_middleware(m, out);
  }
  return out;
}

std::optional<std::string_view> ambiguous_owned_field(const http::HeaderMap& headers,
                                                      const std::vector<OwnedField>& owned) {
  for (const OwnedField& o : owned) {
    bool seen = false;
    for (const http::Field& f : headers) {
      if (!http::names_same_field(f.name, o.folded)) continue;
      if (!http::iequals(f.name, o.written)) return "a field the gateway judges, spelt otherwise";
      if (seen) return "a field the gateway judges, twice";
      seen = true;
    }
  }
  return std::nullopt;
}

}  // namespace spindle::proxy::detail
