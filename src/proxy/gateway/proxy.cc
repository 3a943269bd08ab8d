// The proxy: forwards a request that matched a route to a target of its service, streaming
// both bodies, retrying only when it is safe, and answering 502 / 503 / 504 itself when the
// upstream cannot. Here: the middleware a server runs, the route middlewares that may answer
// first (route_middlewares.h for their rules), forward_auth and mirror; forwarding.cc has the
// forwarded request's own steps.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <random>

#include "proxy/request/client_identity.h"
#include "proxy/request/forward_head.h"
#include "proxy/request/owned_fields.h"
#include "proxy/request/route_middlewares.h"
#include "spindle/base/block_cache.h"
#include "spindle/base/log.h"
#include "spindle/fiber/worker.h"
#include "spindle/http/rules.h"
#include "spindle/proxy/gateway.h"
#include "targets.h"

namespace spindle::proxy {

using detail::add_cors_fields;
using detail::answer_preflight;
using detail::apply_edits;
using detail::apply_field_edits;
using detail::apply_request_middlewares;
using detail::auth_attribute;
using detail::authenticated_user;
using detail::build_head;
using detail::check_jwt;
using detail::claim_attribute;
using detail::client_text;
using detail::counts_against_target;
using detail::erase_written_fields;
using detail::ForwardHead;
using detail::is_preflight;
using detail::note_client;
using detail::note_route;
using detail::note_target_failure;
using detail::pick_target;
using detail::split_pick;
using detail::TriedTargets;
using http::ExchangeErrc;

namespace {

// The largest body a mirror copy carries (and holds in memory until its target took it).
constexpr std::uint64_t kMirrorBodyLimit = 64 * 1024;

// The fields of a request as the route's middlewares passed so far left them (a headers edit,
// the fields jwt and forward_auth write): what the middleware at hand judges is what the
// upstream gets, since the forwarded head takes the same edits in the same order
// (apply_request_middlewares). The request's own fields until a middleware edits them; a copy
// from then on.
class JudgedFields {
 public:
  explicit JudgedFields(const http::Request& request) : request_(request) {}

  /// The fields to judge.
  const http::HeaderMap& get() const { return edited_ ? *edited_ : request_.headers(); }

  /// Takes the edits of `m`, once it has acted (jwt's claims and forward_auth's answer are the
  /// request's attributes by then).
  void after(const MiddlewareConfig& m) {
    if (!detail::edits_request_fields(m)) return;
    if (!edited_) {
      edited_ = std::make_unique<http::HeaderMap>();
      for (const http::Field& f : request_.headers()) edited_->add_view(f);
    }
    apply_field_edits(request_, m, *edited_);
  }

 private:
  const http::Request& request_;
  std::unique_ptr<http::HeaderMap> edited_;  ///< null until a middleware edits the fields
};

// What a rate limit counts `request` by (`fields`: its fields as judged, JudgedFields).
std::string rate_limit_key(const http::Request& request, const http::HeaderMap& fields,
                           const RateLimitConfig& limit) {
  switch (limit.key) {
    case RateLimitConfig::Key::kRoute:
      return "route";
    case RateLimitConfig::Key::kHeader:
      return "h:" + std::string(fields.get(limit.header).value_or(""));
    case RateLimitConfig::Key::kClaim:
      return "c:" + std::string(request.attribute(claim_attribute(limit.header)));
    case RateLimitConfig::Key::kClientIp:
      break;
  }
  return "ip:" + std::string(client_text(request));
}

// A request attribute name under which the tightest rate limit's decision waits for the
// response (RateLimit-* fields).
constexpr std::string_view kRateLimitShown = "ratelimit";

// The answer to a request a rate limit's `decision` refused: 503 when its store was
// unavailable, else 429; Retry-After either way.
http::Response rate_limited(const RateLimiter::Decision& decision) {
  if (decision.unavailable) {
    http::Response answer = http::Response::error(503, "rate limit store unavailable");
    answer.headers.set("Retry-After", "1");
    return answer;
  }
  http::Response answer = http::Response::error(429, "rate limit exceeded");
  answer.headers.set("Retry-After",
                     std::to_string(std::max<std::uint64_t>(
                         1, static_cast<std::uint64_t>(std::ceil(decision.retry_after)))));
  return answer;
}

// True if the request's client (note_client) is in one of `networks` (ip_allow, ip_deny).
bool client_listed(const http::Request& request, const std::vector<Cidr>& networks) {
  auto address = Address::parse_host(client_text(request));
  return address &&
         std::ranges::any_of(networks, [&](const Cidr& cidr) { return cidr.contains(*address); });
}

// Where a redirect middleware sends the request: its scheme, host, port and path where it
// names them, else the request's own (the port kept only when scheme and host are).
std::string redirect_location(const http::Request& request, const MiddlewareConfig& m) {
  std::string_view authority = request.authority();
  std::string_view host = authority;
  std::string_view port;
  if (auto colon = authority.rfind(':');
      colon != std::string_view::npos && authority.find(']', colon) == std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  std::string scheme = m.scheme.empty() ? (request.context().tls ? "https" : "http") : m.scheme;
  std::string location = scheme + "://" + (m.host.empty() ? std::string(host) : m.host);
  if (m.port != 0) {
    location += ":" + std::to_string(m.port);
  } else if (!port.empty() && m.scheme.empty() && m.host.empty()) {
    location += ":" + std::string(port);  // same scheme and host: same port
  }
  location += m.path.empty() ? std::string(request.target()) : m.path;
  return location;
}

// The middlewares of `route` that may answer in the gateway's place, in order: rate limits
// (429), ip_allow / ip_deny (403), max_body (413 for a declared length), redirect, respond,
// cors preflights, basic_auth and jwt (401), forward_auth (through `authorize`, which asks the
// auth service about the request as the middleware at the position it is given sees it). Each
// judges the fields as the middlewares before it edited them (JudgedFields). The first
// that answers ends the request: its response is moved into `answer` and true returned; false lets
// the request go on to the service. (An out-parameter, not an optional: g++ 12 zeroes all 2 KiB of
// an optional<Response> returned by name, which every proxied request paid.)
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
  JudgedFields fields(request);
  for (std::size_t i = 0; i < route.middlewares.size() && !answered; ++i) {
    const MiddlewareConfig& m = route.middlewares[i];
    switch (m.kind) {
      case MiddlewareConfig::Kind::kRateLimit: {
        auto decision =
            limits[i]->take(rate_limit_key(request, fields.get(), m.rate_limit), Clock::now());
        if (tightest == nullptr || !decision.allowed || decision.remaining < shown.remaining) {
          tightest = limits[i].get();
          shown = decision;
        }
        if (decision.unavailable || !decision.allowed) {
          answer_with(rate_limited(decision));
        }
        break;
      }
      case MiddlewareConfig::Kind::kIpAllow:
      case MiddlewareConfig::Kind::kIpDeny:
        if (client_listed(request, m.networks) == (m.kind == MiddlewareConfig::Kind::kIpDeny)) {
          answer_with(http::Response::error(403, "client address not allowed"));
        }
        break;
      case MiddlewareConfig::Kind::kMaxBody:
        if (request.head().content_length && *request.head().content_length > m.max_body) {
          answer_with(http::Response::error(413, "request body larger than the route allows"));
        }
        break;
      case MiddlewareConfig::Kind::kRedirect:
        answer_with(http::Response(m.status))
            .headers.set("Location", redirect_location(request, m));
        break;
      case MiddlewareConfig::Kind::kRespond:
        answer_with(http::Response(m.status, m.body, m.content_type));
        break;
      case MiddlewareConfig::Kind::kCors:
        if (is_preflight(request)) answer_with(answer_preflight(request, m.cors));
        break;
      case MiddlewareConfig::Kind::kBasicAuth:
        if (auto user = authenticated_user(fields.get(), *m.basic_auth, passwords)) {
          request.set_attribute("user", *user);
        } else {
          answer_with(http::Response::error(401, "authentication required"))
              .headers.set("WWW-Authenticate", fmt::format("Basic realm=\"{}\", charset=\"UTF-8\"",
                                                           m.basic_auth->realm));
        }
        break;
      case MiddlewareConfig::Kind::kJwt:
        if (auto refused = check_jwt(request, fields.get(), *m.jwt)) {
          answer_with(std::move(*refused));
        }
        break;
      case MiddlewareConfig::Kind::kForwardAuth:
        if (auto refused = authorize(i)) answer_with(std::move(*refused));
        break;
      default:
        break;
    }
    if (!answered) fields.after(m);
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

// The fields forward_auth at position `at` of `route` sends its service, into `out`: the
// request's as the middlewares before it left them (a headers edit, the fields jwt wrote from
// its token), less those a middleware from `at` on writes (the upstream gets another value or
// none of them, never the client's), less those about the body or the connection and those the
// gateway owns, and only those forward_auth lists if it lists any. The auth service judges the
// fields the upstream receives.
void fields_for_auth(const http::Request& request, const RouteConfig& route, std::size_t at,
                     http::HeaderMap& out) {
  const http::HeaderMap& in = request.headers();
  http::NominatedFields nominated(in);
  for (const http::Field& f : in) {
    if (http::forwardable(f, nominated, http::FieldsFor::kAuthRequest)) out.add_view(f);
  }
  for (std::size_t i = 0; i < route.middlewares.size(); ++i) {
    if (i < at) {
      apply_field_edits(request, route.middlewares[i], out);
    } else {
      erase_written_fields(route.middlewares[i], out);
    }
  }
  const std::vector<std::string>& chosen = route.middlewares[at].forward_auth->request_headers;
  out.erase_if([&](const http::Field& f) {
    bool unchosen = !chosen.empty() && std::ranges::none_of(chosen, [&](const std::string& n) {
      return http::iequals(n, f.name);
    });
    auto never = static_cast<std::uint16_t>(http::FieldsFor::kAuthRequest);
    return unchosen || http::field_flags(f.name, never) != 0;
  });
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
                   const ServerConfig& server, const RouteConfig& route, const MirrorConfig& config,
                   std::uint64_t primary_buffering) {
  std::size_t& in_flight = mirrors_in_flight_[Worker::current()->index()];
  if (config.percent < 100) {
    thread_local std::minstd_rand random(std::random_device{}());
    if (std::uniform_real_distribution<double>(0, 100)(random) >= config.percent) return;
  }
  // A body goes along only when the primary reads it whole before sending it anyway (within
  // its service's request_buffering), when it is small and already due (no 100-continue to
  // wait for): the copy must never change what the primary gets nor make it wait. Reading a
  // body the primary streams would take it off the connection under the primary's feet.
  const http::RequestHead& in = request.head();
  bool has_body = in.chunked || in.content_length.value_or(0) > 0;
  if (has_body && (in.chunked || in.expect_continue ||
                   *in.content_length > std::min(kMirrorBodyLimit, primary_buffering))) {
    request.set_attribute("mirror", "skipped");
    const Gateway::Service* target = gateway->service(config.service);
    if (metrics_ && target != nullptr) metrics_->record_mirror_skipped(target->series);
    return;
  }
  if (in_flight >= config.max_in_flight) {
    request.set_attribute("mirror", "dropped");
    return;
  }
  detail::note_request_id(request);  // the copy and the request carry one id
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
    // A field the routes judge, twice or spelt otherwise: which would the upstream read?
    std::optional<std::string_view> ambiguous;
    if (server != nullptr && !server->owned_fields.empty()) {
      ambiguous = detail::ambiguous_owned_field(request.headers(), server->owned_fields);
    }
    if (server != nullptr && server->routes.size() != 0 && !ambiguous) {
      // An extended CONNECT (RFC 8441) routes as the GET upgrade it stands for.
      route = server->routes.select(request.authority(), request.target(),
                                    detail::forwarded_method(request), request.headers());
    }
    // A routed request keeps a copy of the snapshot (and of the route it points into), even if
    // a new one is published while it runs; one no route takes needs none (the copy's
    // count is atomic: two locked instructions).
    std::shared_ptr<Gateway> gateway = route ? current : nullptr;
    // Built in place (a response is a few KiB: each move of one shows per request).
    http::Response response = ambiguous ? http::Response::error(400, *ambiguous)
                              : route   ? on_route(request, gateway, *server, *route)
                                        : next(request);
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
  if (server.config->access_log.enabled) note_route(request, route);
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
          [&](std::size_t at) { return authorize(request, gateway, server, route, at); },
          response)) {
    response = pass_on(request, gateway, server, route);
  }
  add_rate_limit_fields(request, response);
  add_cors_fields(request, route, response);
  return response;
}

http::Response Proxy::pass_on(http::Request& request, const std::shared_ptr<Gateway>& gateway,
                              const Gateway::Server& server, const RouteConfig& route) {
  // A traffic_split picks the service; otherwise the route names it.
  std::string_view service = route.service;
  std::string set_cookie;
  for (const MiddlewareConfig& m : route.middlewares) {
    if (m.kind == MiddlewareConfig::Kind::kTrafficSplit) {
      service = split_pick(request, m.traffic_split, set_cookie);
    }
  }
  // The copies take a body only as far as the service picked reads it whole anyway.
  const Gateway::Service* primary = gateway->service(service);
  const std::uint64_t buffering = primary ? primary->config->request_buffering : 0;
  for (const MiddlewareConfig& m : route.middlewares) {
    if (m.kind == MiddlewareConfig::Kind::kMirror) {
      mirror(request, gateway, *server.config, route, m.mirror, buffering);
    }
  }
  http::Response response = forward(request, gateway, server, route, service);
  if (!set_cookie.empty()) response.headers.add("Set-Cookie", set_cookie);
  return response;
}

std::optional<http::Response> Proxy::authorize(http::Request& request,
                                               const std::shared_ptr<Gateway>& gateway,
                                               const Gateway::Server& server,
                                               const RouteConfig& route, std::size_t at) {
  const ForwardAuthConfig& auth = *route.middlewares[at].forward_auth;
  const Gateway::Service* service = gateway->service(auth.service);
  const Gateway::Upstream& upstream = *service->upstream;
  auto unavailable = [&](std::string_view why) {
    log_warn("forward_auth: service {}: {}: answered 503", auth.service, why);
    return http::Response::error(503, "authentication service unavailable");
  };
  auto pick = pick_target(gateway->worker_state(), upstream, TriedTargets(), 0);
  if (!pick) return unavailable("no healthy target");
  const Gateway::Target& target = upstream.targets[*pick];

  // GET path, with the request's fields as the upstream will get them (those chosen, never
  // those about its body or the connection, nor those the gateway owns) and what the request
  // was: X-Forwarded-Method, -Proto, -Host, -Uri, -For (as the upstream is told them), and its
  // X-Request-Id.
  http::RequestHead head;
  head.method = "GET";
  head.target = auth.path;
  fields_for_auth(request, route, at, head.headers);
  // What the upstream is told: its method (an RFC 8441 WebSocket's GET), and the X-Forwarded-*
  // fields the forwarded head carries (a trusted proxy's host and scheme, the hop list).
  head.headers.add_view("X-Forwarded-Method", http::token::kXForwardedMethod,
                        detail::forwarded_method(request));
  detail::ForwardedFields forwarded;
  detail::forwarded_fields(request, *server.config, detail::authority_of(request), forwarded);
  detail::add_forwarded_fields(forwarded, head.headers);
  head.headers.add_view("X-Forwarded-Uri", http::token::kXForwardedUri, request.target());
  // The forwarded request's, for the service's log (copied: the attribute's text moves when
  // attributes are added).
  detail::InlineText<128> id;
  id.assign(detail::note_request_id(request));
  head.headers.add_view("X-Request-Id", http::token::kXRequestId, id.view());
  std::string authority = target.label;

  // (Sent again, as a forwarded request is, when the service closing a connection turned it
  // away unprocessed: http::resend_turned_away.)
  std::shared_ptr<http::ClientExchange> exchange;
  Result<const http::ClientResponseHead*> got = std::unexpected(std::error_code());
  bool fresh = false;
  for (unsigned turned_away = 0;;) {
    auto opened = connections_.open(target.endpoint, head, authority, service->timeouts,
                                    upstream.limits, fresh);
    if (!opened) {
      if (counts_against_target(opened.error())) {
        note_target_failure(upstream, *pick, metrics_, service->series);
      }
      return unavailable(opened.error().message());
    }
    exchange = std::move(*opened);
    auto finished = exchange->finish();
    got = finished ? exchange->read_head() : std::unexpected(finished.error());
    // A pooled connection the service had closed (the keep-alive race): the GET, which has no
    // body, goes once more on a new one, as a forwarded request would; no fault of the target.
    bool stale = !got && exchange->reused() && !fresh &&
                 (http::nothing_reached_upstream(got.error()) ||
                  got.error() == http::ExchangeErrc::kClosedBeforeResponse);
    if (stale) {
      fresh = true;
      continue;
    }
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
  if (answer.status == 101) {
    // The GET offered no upgrade: a switch is no answer, and never the client's to see.
    exchange->cancel();
    log_warn("forward_auth: service {}: a 101 to a request that offered no upgrade: answered 502",
             auth.service);
    return http::Response::error(502, "the authentication service switched protocols");
  }
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

}  // namespace spindle::proxy
