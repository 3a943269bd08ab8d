// The request as it goes to the upstream: its head (forward_head.h), with the ids and trace
// context made here and the upgrades a route allows.
#include "forward_head.h"

#include <re2/re2.h>

#include <random>

#include "client_identity.h"
#include "route_middlewares.h"
#include "spindle/http/rules.h"
#include "spindle/http/websocket.h"

namespace spindle::proxy::detail {
namespace {

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

// A request id: 32 hex digits.
void new_request_id(InlineText<128>& out) {
  random_hex(out.text.data(), 32);
  out.size = 32;
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

// True if the connection's peer is one of the server's trusted proxies.
bool trusted(const ServerConfig& server, const http::RequestContext& context) {
  if (context.peer == nullptr) return false;
  return std::ranges::any_of(server.trusted_proxies,
                             [&](const Cidr& cidr) { return cidr.contains(*context.peer); });
}

// True for an HTTP/1.1 request that asks to switch protocols (WebSocket): the connection may
// become a tunnel to the upstream.
bool wants_upgrade(const http::Request& request) {
  return request.context().major_version == 1 && request.minor_version() == 1 &&
         request.headers().contains(http::token::kUpgrade) &&
         request.headers().has_token(http::token::kConnection, "upgrade");
}

}  // namespace

void request_id_of(const http::Request& request, InlineText<128>& out) {
  std::string_view noted = request.attribute(kRequestIdAttribute);
  auto id = noted.empty() ? request.headers().get(http::token::kXRequestId) : noted;
  if (id && (!noted.empty() || good_request_id(*id))) {
    out.assign(*id);
  } else {
    new_request_id(out);
  }
}

std::string_view note_request_id(http::Request& request) {
  if (std::string_view noted = request.attribute(kRequestIdAttribute); !noted.empty()) {
    return noted;
  }
  InlineText<128> id;
  request_id_of(request, id);
  request.set_attribute(kRequestIdAttribute, id.view());
  return request.attribute(kRequestIdAttribute);
}

void note_route(http::Request& request, const RouteConfig& route) {
  request.set_attribute("route", route.name);
  note_request_id(request);
}

std::string_view version_text(int version) {
  return version == 20 ? "2" : version == 10 ? "1.0" : "1.1";
}

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

bool extended_connect_as_upgrade(const http::Request& request, const RouteConfig& route,
                                 ForwardHead& out) {
  std::string_view protocol = request.head().protocol;
  bool allowed = std::ranges::any_of(
      route.upgrades, [&](const std::string& p) { return http::iequals(p, protocol); });
  if (!allowed) return false;
  out.head.method = forwarded_method(request);
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

void as_extended_connect(ForwardHead& out) {
  if (out.upgrade.empty()) return;
  std::string_view offered = out.upgrade;
  std::string_view first = offered.substr(0, offered.find(','));
  first = http::trim_ows(first.substr(0, first.find('/')));
  // (Upgrade tokens are case-insensitive; :protocol values are registered in lower case.)
  out.extended_protocol = http::iequals(first, "websocket") ? "websocket" : std::string(first);
  out.extended = std::make_unique<http::RequestHead>();
  http::RequestHead& connect = *out.extended;
  connect.method = "CONNECT";
  connect.protocol = out.extended_protocol;
  connect.target = out.head.target;
  connect.authority = out.head.authority;
  for (const http::Field& f : out.head.headers) {
    if (f.token == &http::token::kUpgrade || f.token == &http::token::kSecWebsocketKey) continue;
    connect.headers.add_view(f);
  }
  if (out.head.headers.never_indexed()) connect.headers.mark_never_indexed();
}

std::string authority_of(const http::Request& request) {
  std::string authority(request.authority());
  const http::RequestContext& context = request.context();
  if (authority.empty() && context.local != nullptr) authority = context.local->to_string();
  return authority;
}

void forwarded_fields(const http::Request& request, const ServerConfig& server,
                      std::string_view authority, ForwardedFields& out) {
  const http::RequestContext& context = request.context();
  const http::HeaderMap& in = request.headers();
  bool from_proxy = trusted(server, context);
  // The client and the trusted proxies before us (note_client); anyone else's claim is gone.
  std::string_view forwarded_for = noted_forwarded_for(request);
  out.for_list = forwarded_for.empty() ? context.remote : forwarded_for;
  auto proto = in.get(http::token::kXForwardedProto);
  out.proto = proto && from_proxy ? std::string(*proto) : context.tls ? "https" : "http";
  auto host = in.get(http::token::kXForwardedHost);
  out.host = host && from_proxy ? *host : authority;
}

void add_forwarded_fields(const ForwardedFields& fields, http::HeaderMap& headers) {
  headers.add_view("X-Forwarded-For", http::token::kXForwardedFor, fields.for_list);
  headers.add_view("X-Forwarded-Proto", http::token::kXForwardedProto, fields.proto);
  if (!fields.host.empty())
    headers.add_view("X-Forwarded-Host", http::token::kXForwardedHost, fields.host);
}

std::string_view forwarded_method(const http::Request& request) {
  return request.head().protocol.empty() ? request.method() : std::string_view("GET");
}

void build_head(const http::Request& request, const ServerConfig& server, ForwardHead& out) {
  const http::RequestContext& context = request.context();
  const http::HeaderMap& in = request.headers();
  out.authority = authority_of(request);
  request_id_of(request, out.request_id);
  bool trace_restarted = false;
  next_traceparent(in.get(http::token::kTraceparent), trace_restarted, out.traceparent);
  forwarded_fields(request, server, out.authority, out.forwarded);
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
  if (in.never_indexed()) head.headers.mark_never_indexed();  // RFC 7541 §6.2.3
  add_forwarded_fields(out.forwarded, head.headers);
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

namespace {

// A jwt that reads its token from a cookie verified no Authorization: a token there (another
// user's, one signed by nobody) must not reach an upstream that trusts the gateway to have
// verified it.
void erase_unverified_authorization(const JwtConfig& jwt, http::HeaderMap& headers) {
  if (!jwt.cookie.empty()) headers.erase(http::token::kAuthorization);
}

}  // namespace

void apply_field_edits(const http::Request& request, const MiddlewareConfig& m,
                       http::HeaderMap& headers) {
  switch (m.kind) {
    case MiddlewareConfig::Kind::kForwardAuth:
      // The auth service's fields replace any the client sent under those names.
      for (const std::string& field : m.forward_auth->response_headers) {
        headers.erase(field);
        std::string_view value = request.attribute(auth_attribute(field));
        if (!value.empty()) headers.set(field, value);
      }
      break;
    case MiddlewareConfig::Kind::kJwt:
      erase_unverified_authorization(*m.jwt, headers);
      // Claims to fields: whatever the client sent under those names goes.
      for (const auto& [claim, field] : m.jwt->claims_to_headers) {
        headers.erase(field);
        std::string_view value = request.attribute(claim_attribute(claim));
        if (!value.empty() && http::is_field_value(value)) headers.set(field, value);
      }
      break;
    case MiddlewareConfig::Kind::kHeaders:
      apply_edits(m.request, headers);
      break;
    default:
      break;
  }
}

bool edits_request_fields(const MiddlewareConfig& m) {
  switch (m.kind) {
    case MiddlewareConfig::Kind::kForwardAuth:
      return !m.forward_auth->response_headers.empty();
    case MiddlewareConfig::Kind::kJwt:
      return !m.jwt->claims_to_headers.empty();
    case MiddlewareConfig::Kind::kHeaders:
      return !m.request.empty();
    default:
      return false;
  }
}

void erase_written_fields(const MiddlewareConfig& m, http::HeaderMap& headers) {
  switch (m.kind) {
    case MiddlewareConfig::Kind::kForwardAuth:
      for (const std::string& field : m.forward_auth->response_headers) headers.erase(field);
      break;
    case MiddlewareConfig::Kind::kJwt:
      erase_unverified_authorization(*m.jwt, headers);
      for (const auto& [claim, field] : m.jwt->claims_to_headers) headers.erase(field);
      break;
    case MiddlewareConfig::Kind::kHeaders:
      for (const auto& [field, value] : m.request.set) headers.erase(field);
      for (const auto& [field, value] : m.request.add) headers.erase(field);
      break;
    default:
      break;
  }
}

bool edits_responses(const RouteConfig& route) {
  return std::ranges::any_of(route.middlewares, [](const MiddlewareConfig& m) {
    return m.kind == MiddlewareConfig::Kind::kHeaders && !m.response.empty();
  });
}

void edit_interim_fields(const RouteConfig& route, http::HeaderMap& fields) {
  for (auto m = route.middlewares.rbegin(); m != route.middlewares.rend(); ++m) {
    if (m->kind == MiddlewareConfig::Kind::kHeaders) apply_edits(m->response, fields);
  }
}

void edit_trailer_fields(const RouteConfig& route, http::HeaderMap& fields) {
  for (const MiddlewareConfig& m : route.middlewares) {
    if (m.kind != MiddlewareConfig::Kind::kHeaders) continue;
    for (const std::string& name : m.response.remove) fields.erase(name);
    for (const auto& [name, value] : m.response.set) fields.erase(name);
  }
}

void apply_request_middlewares(const http::Request& request, const RouteConfig& route,
                               ForwardHead& out) {
  for (const MiddlewareConfig& m : route.middlewares) {
    switch (m.kind) {
      case MiddlewareConfig::Kind::kForwardAuth:
      case MiddlewareConfig::Kind::kJwt:
        apply_field_edits(request, m, out.head.headers);
        break;
      case MiddlewareConfig::Kind::kHeaders:
        apply_field_edits(request, m, out.head.headers);
        // A Host set is the authority the request goes up for (the client under the proxy
        // writes Host, or :authority, from it); X-Forwarded-Host keeps the client's.
        for (const auto& [name, value] : m.request.set) {
          if (http::field_flags(name, http::field_flag::kHost) != 0) out.authority = value;
        }
        break;
      case MiddlewareConfig::Kind::kStripPrefix: {
        // "/api/users?x" less "/api" is "/users?x"; "/api" alone becomes "/"; "/apix" stays.
        // ASCII case aside, as routes match paths (route_table.h): /API/users is /users too.
        std::string_view target = out.head.target;
        if (target.size() < m.prefix.size() ||
            !http::iequals(target.substr(0, m.prefix.size()), m.prefix)) {
          break;
        }
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

}  // namespace spindle::proxy::detail
