// One forwarded request, step by step (Proxy::forward): the head made for the upstream, the
// body read as far as it may be kept, attempts at the service's targets within the retry
// rules, and the answer streamed back, or the connection handed over as a tunnel.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <optional>

#include "proxy/request/client_identity.h"
#include "proxy/request/forward_head.h"
#include "proxy/request/route_middlewares.h"
#include "spindle/base/block_cache.h"
#include "spindle/base/log.h"
#include "spindle/fiber/buffer_pool.h"
#include "spindle/http/rules.h"
#include "spindle/http/status.h"
#include "spindle/http/websocket.h"
#include "spindle/proxy/gateway.h"
#include "targets.h"

namespace spindle::proxy {

using detail::apply_request_middlewares;
using detail::as_extended_connect;
using detail::build_head;
using detail::cookie_value;
using detail::counts_against_target;
using detail::edit_interim_fields;
using detail::edit_trailer_fields;
using detail::edits_responses;
using detail::extended_connect_as_upgrade;
using detail::ForwardHead;
using detail::note_client;
using detail::note_target_failure;
using detail::offer_upgrade;
using detail::pick_target;
using detail::switch_refused;
using detail::TriedTargets;
using detail::version_text;
using http::ExchangeErrc;

namespace {

// What one read or write of a streamed body moves.
constexpr std::size_t kPiece = 64 * 1024;
// The part of a response body read before its head is sent.
constexpr std::size_t kFirstPiece = 16 * 1024;
// How long a request with `Expect: 100-continue` waits for the upstream's 100 before its body
// goes anyway (curl waits as long).
constexpr std::chrono::seconds kContinueWait{1};

// The status the client gets when the exchange failed with `ec`.
int status_for(std::error_code ec) {
  if (ec == ExchangeErrc::kConnectTimeout || ec == ExchangeErrc::kFirstByteTimeout ||
      ec == ExchangeErrc::kReadTimeout || ec == ExchangeErrc::kWriteTimeout) {
    return 504;
  }
  if (ec == ExchangeErrc::kNoCapacity || ec == ExchangeErrc::kPreempted) return 503;
  if (ec == ExchangeErrc::kCancelled) return 499;  // the client went away (nginx's code)
  if (ec == ExchangeErrc::kHeadTooLarge) return 431;
  return 502;
}

// "0.412" for 412 microseconds.
std::string milliseconds_text(std::chrono::microseconds t) {
  auto us = static_cast<std::uint64_t>(std::max<std::int64_t>(t.count(), 0));
  char text[32];
  auto end = std::to_chars(text, text + 24, us / 1000).ptr;  // 20 digits at most; 4 follow
  *end++ = '.';
  unsigned fraction = us % 1000;
  *end++ = static_cast<char>('0' + fraction / 100);
  *end++ = static_cast<char>('0' + fraction / 10 % 10);
  *end++ = static_cast<char>('0' + fraction % 10);
  return std::string(text, end);
}

// Moves bytes both ways between a client and an upstream until either side closes, no byte
// has moved for `idle`, or `lifetime` has passed (0: no limit). Each side's close is passed on
// as a half-close; an error on either side ends both (abort).
void tunnel(http::TunnelEnd& client, http::TunnelEnd& upstream, std::string_view to_upstream,
            std::string_view to_client, std::chrono::milliseconds idle,
            std::chrono::milliseconds lifetime) {
  auto last = std::make_shared<Clock::time_point>(Clock::now());
  Deadline end = lifetime.count() > 0 ? Deadline::after(lifetime) : Deadline::never();
  if ((!to_upstream.empty() && !upstream.write(to_upstream, Deadline::after(idle))) ||
      (!to_client.empty() && !client.write(to_client, Deadline::after(idle)))) {
    client.abort();
    upstream.abort();
    return;
  }
  auto pump = [idle, last, end](http::TunnelEnd& from, http::TunnelEnd& to) {
    BufferPool::Buffer buffer = take_buffer();
    for (;;) {
      auto n = from.read(buffer.span(), earliest(Deadline::after(idle), end));
      if (!n && n.error() == std::errc::timed_out && Clock::now() - *last < idle &&
          !end.expired()) {
        continue;
      }
      if (n && *n == 0) break;
      if (!n || !to.write(std::string_view(buffer.span().data(), *n), Deadline::after(idle))) {
        // Idle too long, reset, or broken: the whole tunnel ends.
        from.abort();
        to.abort();
        return;
      }
      *last = Clock::now();
    }
    to.close_write();  // this side is done sending
  };
  auto back = spawn([&] { pump(upstream, client); });
  pump(client, upstream);
  back.join();
}

// The upstream's `trailers` to the client, with the route's response edits (the producer holds
// the snapshot `route` is part of).
void pass_trailers(const http::HeaderMap& trailers, const RouteConfig& route,
                   http::BodyWriter& writer) {
  if (!edits_responses(route)) {
    writer.set_trailers(trailers);
    return;
  }
  http::HeaderMap edited;
  for (const http::Field& f : trailers) edited.add_view(f);
  edit_trailer_fields(route, edited);
  if (!edited.empty()) writer.set_trailers(edited);
}

// The upstream's side of a tunnel on an HTTP/2 stream (an extended CONNECT answered 2xx): its
// END_STREAM is the half-close, its RST_STREAM the abort.
class ExchangeTunnelEnd final : public http::TunnelEnd {
 public:
  explicit ExchangeTunnelEnd(http::ClientExchange& exchange) : exchange_(exchange) {}
  Result<std::size_t> read(std::span<char> buffer, Deadline deadline) override {
    return exchange_.tunnel_read(buffer, deadline);
  }
  Result<void> write(std::string_view data, Deadline deadline) override {
    return exchange_.tunnel_write(data, deadline);
  }
  void close_write() override { (void)exchange_.finish(); }
  void abort() override { exchange_.cancel(); }

 private:
  http::ClientExchange& exchange_;
};

// Writes a small body whole, or streams a large one from the client. `first` keeps the piece
// read but not yet accepted by the upstream, so that an attempt that failed before it took
// any byte can be made again with it.
struct BodyState {
  bool unread = false;           // the client waits for 100 Continue: its body is not read yet
  bool replayable = true;        // the whole body is in `kept`
  std::string kept;              // the whole body (replayable) or the piece not yet sent
  bool streamed_beyond = false;  // bytes beyond `kept` went to an upstream: no retry
  bool complete = false;         // the client's whole body has been read
};

// Reads the client's body into `into` until it ends or holds more than `limit` bytes; true if
// it ended (throws HttpError as Request::read does).
bool read_up_to(http::Request& request, std::uint64_t limit, std::string& into) {
  std::string piece(kPiece, '\0');
  while (into.size() <= limit) {
    std::size_t n = request.read(piece);
    if (n == 0) return true;
    into.append(piece, 0, n);
  }
  return false;
}

Result<void> send_body(http::Request& request, const RouteConfig& route,
                       http::ClientExchange& exchange, BodyState& body, bool has_body,
                       std::optional<std::uint64_t> max_body) {
  auto too_large = [&] { throw http::HttpError(413, "request body larger than the route allows"); };
  if (!has_body) return exchange.finish();
  if (body.unread) {
    // The client's body comes only after a 100 Continue, and that goes only if the upstream
    // wants the body: a refusal (401, 413, 417) then costs no upload.
    auto go = exchange.await_continue(kContinueWait);
    if (!go) return fail(go.error());
    if (!*go) return {};  // its final answer came first: read_head() has it
    // The client's 100 is a head it gets: the route's response edits are on it, as on a 103.
    // (Not sent, the server's bare one goes when the body is read: an HTTP/1.1 client that
    // sent its body unasked needs none.)
    http::HeaderMap fields;
    edit_interim_fields(route, fields);
    (void)request.send_interim(100, fields);
    if (body.replayable) {
      body.kept = request.body();  // the server's 100 goes out here
      body.complete = true;
    }
    body.unread = false;
  }
  if (max_body && body.kept.size() > *max_body) too_large();
  if (body.replayable) {
    if (auto w = exchange.write(body.kept); !w) return w;
    return exchange.finish();
  }
  if (!body.kept.empty()) {
    if (auto w = exchange.write(body.kept); !w) return w;
  }
  std::string piece(kPiece, '\0');
  std::uint64_t total = body.kept.size();
  for (;;) {
    std::size_t n = request.read(piece);  // throws HttpError: the client's body failed
    if (n == 0) {
      body.complete = true;
      break;
    }
    total += n;
    if (max_body && total > *max_body) too_large();  // a chunked body, past the limit
    body.streamed_beyond = true;
    if (auto w = exchange.write(std::string_view(piece).substr(0, n)); !w) return w;
  }
  return exchange.finish();
}

// One request on its way through Proxy::forward, and the steps of its way: the head made for
// the upstream (prepare), the body read as far as it may be kept (take_body), then attempts
// until a target answers or the retries run out (run): each picks a target, exchanges with it
// (exchange_with) and either answers the client (open_tunnel, pass_response) or tries again
// (retry_allowed); when none answered, give_up says why.
class Forwarding {
 public:
  Forwarding(http::Request& request, const std::shared_ptr<Gateway>& gateway,
             const Gateway::Server& server, const RouteConfig& route,
             const Gateway::Service& service, http::UpstreamConnections& connections,
             Metrics* metrics)
      : request_(request),
        gateway_(gateway),
        server_(server),
        route_(route),
        service_(service),
        upstream_(*service.upstream),
        retries_(service.config->retries),
        worker_(gateway->worker_state()),
        budget_(worker_.budgets[service.index]),
        connections_(connections),
        metrics_(metrics) {}

  // Why a request cannot go on this route: the error the client is answered.
  struct Refusal {
    int status;
    std::string detail;
  };
  // The head for the upstream, with the route's middlewares and upgrades applied; a refusal
  // instead when the request cannot go on this route. (Not a Response: a Response is 2 KiB,
  // and every proxied request's fiber would carry room for one more on its stack.)
  std::optional<Refusal> prepare();
  // Reads a body up to request_buffering before any target is chosen: it can be sent again,
  // and a client that dawdles costs no upstream anything. A chunked one is read that far to
  // see whether it ends within it.
  void take_body();
  // Attempts until a target answers (what the client then gets) or none may be tried again.
  http::Response run();

 private:
  // What one attempt got: the upstream's response head (on `exchange`), or why not.
  struct Attempt {
    std::shared_ptr<http::ClientExchange> exchange;
    const http::ClientResponseHead* head = nullptr;
    std::error_code failure;
    // The upgrade went as an extended CONNECT (RFC 8441): a 2xx opens the stream's tunnel.
    bool extended = false;
  };
  // Opens the exchange of an attempt at `target`: an upgrade to an HTTP/2 target as an
  // extended CONNECT, or over HTTP/1.1 where the target allows none.
  Result<std::unique_ptr<http::ClientExchange>> open_at(const Gateway::Target& target,
                                                        Attempt& attempt);
  Attempt exchange_with(const Gateway::Target& target);
  // True if an attempt that failed or was answered 502/503 is tried again: `safe` to send
  // again, attempts left, and a retry in the budget (spent here).
  bool retry_allowed(bool safe, unsigned attempt);
  // 101 (or CONNECT's 2xx): the connection becomes a tunnel between client and upstream.
  http::Response open_tunnel(const Gateway::Target& target, Attempt& attempt);
  // An extended CONNECT's 2xx: the client's connection (after its 101) or stream (after its
  // 200) becomes a tunnel to the upstream's stream.
  http::Response open_stream_tunnel(const Gateway::Target& target, Attempt& attempt);
  // The upstream's response: its fields and its body, streamed to the client as it comes.
  http::Response pass_response(const Gateway::Target& target, Attempt& attempt,
                               Clock::duration first_byte_time);
  // No target answered: the last failure, as a status.
  http::Response give_up();

  http::Request& request_;
  const std::shared_ptr<Gateway>& gateway_;
  const Gateway::Server& server_;
  const RouteConfig& route_;
  const Gateway::Service& service_;
  const Gateway::Upstream& upstream_;
  const RetryPolicy& retries_;
  Gateway::WorkerState& worker_;
  Gateway::WorkerState::Budget& budget_;
  http::UpstreamConnections& connections_;
  Metrics* metrics_;

  std::shared_ptr<ForwardHead> forward_head_;
  // CONNECT becomes a tunnel through the upstream (an HTTP proxy) once it answers 2xx.
  bool connect_ = false;
  // An HTTP/2 client's extended CONNECT (RFC 8441), sent upstream as an HTTP/1.1 upgrade.
  bool extended_connect_ = false;
  // The upgrade of the last attempt went over HTTP/1.1 to a target that allows no extended
  // CONNECT (what give_up says of a failure).
  bool fell_back_ = false;
  // What the access log shows of the proxying: noted only for a server that writes one.
  bool logged_ = false;
  bool has_body_ = false;
  bool idempotent_ = false;
  // The smallest max_body of the route's middlewares, for a body without a length.
  std::optional<std::uint64_t> route_max_body_;
  BodyState body_;
  // The key consistent_hash hashes.
  std::uint64_t key_hash_ = 0;
  // The last attempt's failure and target, and whether its connection was a pooled one.
  std::error_code last_error_;
  std::string_view last_target_;
  bool last_reused_ = false;
};

std::optional<Forwarding::Refusal> Forwarding::prepare() {
  // Only an HTTP/1.1 connection can be taken over for CONNECT's tunnel.
  connect_ = request_.method() == "CONNECT" && request_.head().protocol.empty();
  if (connect_ && request_.context().major_version != 1) {
    return Refusal{501, "CONNECT is forwarded from HTTP/1.1 clients only"};
  }
  for (const MiddlewareConfig& m : route_.middlewares) {
    if (m.kind == MiddlewareConfig::Kind::kMaxBody) {
      route_max_body_ = std::min(route_max_body_.value_or(m.max_body), m.max_body);
    }
  }
  forward_head_ = std::allocate_shared<ForwardHead>(BlockAllocator<ForwardHead>());
  build_head(request_, *server_.config, *forward_head_);
  apply_request_middlewares(request_, route_, *forward_head_);
  // Upgrades go only where the route allows them.
  extended_connect_ = !request_.head().protocol.empty();
  if (extended_connect_) {
    if (!extended_connect_as_upgrade(request_, route_, *forward_head_)) {
      return Refusal{501,
                     fmt::format("no upgrade to '{}' on this route", request_.head().protocol)};
    }
  } else {
    offer_upgrade(request_, route_, *forward_head_);
  }
  // To an HTTP/2 service an upgrade goes as an extended CONNECT (or over HTTP/1.1 to a target
  // that allows none: exchange_with).
  if (upstream_.protocol != http::WireProtocol::kHttp1 && !forward_head_->upgrade.empty()) {
    as_extended_connect(*forward_head_);
    bool websocket = forward_head_->extended_protocol == "websocket";
    if (!extended_connect_ && websocket &&
        !request_.headers().contains(http::token::kSecWebsocketKey)) {
      return Refusal{400, "a WebSocket upgrade without Sec-WebSocket-Key"};
    }
  }
  logged_ = server_.config->access_log.enabled;
  if (logged_) {
    // (route and request_id were noted as the request was routed: Proxy::on_route)
    request_.set_attribute("trace_id", forward_head_->traceparent.view().substr(3, 32));
  }
  const http::RequestHead& head = forward_head_->head;
  has_body_ = head.chunked || head.content_length.value_or(0) > 0;
  idempotent_ = http::is_idempotent(head.method);
  if (upstream_.config->balancer == BalancerKind::kConsistentHash) {
    const HashKey& key = upstream_.config->hash;
    std::string_view value = request_.context().remote;
    if (key.by == HashKey::By::kHeader) {
      value = request_.header(key.key);
    } else if (key.by == HashKey::By::kCookie) {
      value = cookie_value(request_, key.key);
    }
    key_hash_ = hash_key(value);
  }
  return std::nullopt;
}

void Forwarding::take_body() {
  const http::RequestHead& head = forward_head_->head;
  const std::uint64_t buffering = service_.config->request_buffering;
  body_.replayable = !has_body_ || head.content_length.value_or(UINT64_MAX) <= buffering;
  body_.unread = has_body_ && request_.head().expect_continue;
  body_.complete = !has_body_;
  if (has_body_ && !body_.unread) {
    if (body_.replayable) {
      body_.kept = request_.body();
      body_.complete = true;
    } else if (head.chunked && buffering > 0) {
      body_.complete = body_.replayable = read_up_to(request_, buffering, body_.kept);
    }
  }
}

Result<std::unique_ptr<http::ClientExchange>> Forwarding::open_at(const Gateway::Target& target,
                                                                  Attempt& attempt) {
  fell_back_ = false;
  // After a pooled connection failed, a new one: the others idle as long may be closed too.
  if (forward_head_->extended == nullptr || !target.upgrade_endpoint) {
    return connections_.open(target.endpoint, forward_head_->head, forward_head_->authority,
                             service_.timeouts, upstream_.limits, last_reused_);
  }
  auto opened = connections_.open(target.endpoint, *forward_head_->extended,
                                  forward_head_->authority, service_.timeouts, upstream_.limits);
  attempt.extended = opened.has_value();
  if (opened || opened.error() != ExchangeErrc::kNoExtendedConnect) return opened;
  // The target did not announce SETTINGS_ENABLE_CONNECT_PROTOCOL: the upgrade goes over
  // HTTP/1.1 to the same address, as the route judged it (the same head, less the CONNECT).
  fell_back_ = true;
  log_info("route {}: {} allows no extended CONNECT: the upgrade to {} goes over HTTP/1.1",
           route_.name, target.label, forward_head_->extended_protocol);
  return connections_.open(*target.upgrade_endpoint, forward_head_->head, forward_head_->authority,
                           service_.timeouts, upstream_.limits, last_reused_);
}

Forwarding::Attempt Forwarding::exchange_with(const Gateway::Target& target) {
  Attempt attempt;
  auto opened = open_at(target, attempt);
  last_reused_ = false;
  if (!opened) {
    attempt.failure = opened.error();
    return attempt;
  }
  // Shared with the client-gone callback and a streamed body's producer. Its count comes from
  // the block cache: made from the unique_ptr, a shared_ptr takes it from malloc.
  attempt.exchange = std::shared_ptr<http::ClientExchange>(
      opened->release(), std::default_delete<http::ClientExchange>(), BlockAllocator<char>());
  http::ClientExchange& exchange = *attempt.exchange;
  last_reused_ = exchange.reused();
  // The client going away cancels the exchange (HTTP/2 RST_STREAM).
  request_.on_client_gone([weak = std::weak_ptr(attempt.exchange)] {
    if (auto e = weak.lock()) e->cancel();
  });
  // Interim answers (103 Early Hints) go on to the client as they come.
  exchange.on_informational([this](const http::ClientResponseHead& interim) {
    if (!edits_responses(route_)) {
      (void)request_.send_interim(interim.status, interim.headers);
      return;
    }
    http::HeaderMap edited;
    for (const http::Field& f : interim.headers) edited.add_view(f);
    edit_interim_fields(route_, edited);
    (void)request_.send_interim(interim.status, edited);
  });
  // (A tunnel's stream stays open our way: the tunnel ends it.)
  auto sent = attempt.extended
                  ? Result<void>()
                  : send_body(request_, route_, exchange, body_, has_body_, route_max_body_);
  // Even when the body could not all go out, the upstream may have answered (an early 413,
  // say): its answer is what the client should see.
  auto got = exchange.read_head();
  exchange.on_informational(nullptr);
  if (got) {
    attempt.head = *got;
  } else {
    attempt.failure = sent ? got.error() : sent.error();
  }
  return attempt;
}

bool Forwarding::retry_allowed(bool safe, unsigned attempt) {
  if (!safe || attempt >= retries_.attempts) return false;
  if (budget_.milli < 1000) {
    if (metrics_) metrics_->record_retry_denied(service_.series);
    return false;
  }
  budget_.milli -= 1000;
  if (metrics_) metrics_->record_retry(service_.series);
  return true;
}

http::Response Forwarding::run() {
  const http::RequestHead& head = forward_head_->head;
  TriedTargets tried;
  // A target that turned the request away unprocessed while closing a connection gracefully
  // gets it again (http::resend_turned_away): then no target is picked.
  std::optional<std::size_t> again;
  unsigned turned_away = 0;
  bool raced = false;  // a pooled connection was closed under the request once already
  for (unsigned number = 1;; ++number) {
    bool panic = false;
    auto pick = std::exchange(again, std::nullopt);
    if (!pick) {
      pick = pick_target(worker_, upstream_, tried, key_hash_, &panic);
      if (panic && metrics_) metrics_->record_panic(service_.series);
    }
    if (!pick && number > 1 && last_reused_ && upstream_.targets.size() == 1) {
      // Every target tried: the last failure stands. But a single target may be tried again
      // when the failure was a pooled connection it had closed: no fault of the target.
      pick = 0;
    }
    if (!pick) {
      if (number == 1) {
        log_warn("route {}: upstream {} has no healthy target: answered 503", route_.name,
                 upstream_.config->name);
        return http::Response::error(503, "no healthy upstream");
      }
      return give_up();
    }
    const Gateway::Target& target = upstream_.targets[*pick];
    tried.add(*pick);
    last_target_ = target.label;
    forward_head_->in_flight.reset();
    // (Aliasing the snapshot: the count keeps it for as long as anything holds the request.)
    forward_head_->in_flight.emplace(
        std::shared_ptr<std::size_t>(gateway_, &worker_.in_flight[upstream_.index][*pick]));
    auto started = Clock::now();
    Attempt attempt = exchange_with(target);
    if (attempt.head == nullptr) {
      last_error_ = attempt.failure;
      bool body_whole = body_.replayable || !body_.streamed_beyond;
      // Turned away unprocessed by an upstream closing a connection: routine, no failure of
      // the target's, so neither an attempt nor a retry (of the budget).
      if (body_whole && http::resend_turned_away(attempt.failure, turned_away)) {
        if (metrics_) metrics_->record_resend(service_.series);
        again = pick;
        --number;  // not an attempt
        continue;
      }
      // Safe to send again: nothing reached the upstream (whatever the method, if the body is
      // still whole or not yet begun), or an idempotent request whose body is kept and whose
      // connection closed before any answer.
      bool safe = (http::nothing_reached_upstream(attempt.failure) && body_whole) ||
                  (idempotent_ && body_.replayable &&
                   attempt.failure == ExchangeErrc::kClosedBeforeResponse);
      // A pooled connection the target had closed as the request went out (the keep-alive
      // race): no fault of the target's, so neither an attempt, nor a retry of the budget,
      // nor a failure of its health; once more to it, on a new connection (last_reused_).
      if (safe && last_reused_ && !raced) {
        raced = true;
        again = pick;
        --number;
        continue;
      }
      // A failure while the client's own body was still coming (stalled, cut, past the
      // upstream's read deadline) may be the client's doing: it is not the target's.
      if (counts_against_target(attempt.failure) && body_.complete) {
        note_target_failure(upstream_, *pick, metrics_, service_.series);
      }
      if (retry_allowed(safe, number)) {
        log_info("route {}: {} {} to {} failed ({}): trying again", route_.name, head.method,
                 head.target, target.label, attempt.failure.message());
        continue;
      }
      return give_up();
    }
    int status = attempt.head->status;
    if (attempt.extended && status >= 200 && status < 300) {
      return open_stream_tunnel(target, attempt);
    }
    if (http::opens_tunnel(status, connect_)) return open_tunnel(target, attempt);
    if (extended_connect_ && status >= 200 && status < 300) {
      // A 2xx opens the tunnel for an HTTP/2 client: an upstream that did not switch must not
      // be passed on as one that did.
      attempt.exchange->cancel();
      log_warn("route {}: {} upgrade to {}: answered {} without switching: answered 502",
               route_.name, head.target, target.label, status);
      return http::Response::error(502, "the upstream did not switch protocols");
    }
    bool could_retry = (status == 502 || status == 503) && idempotent_ && body_.replayable &&
                       upstream_.targets.size() > 1;
    if (retry_allowed(could_retry, number)) {
      last_error_ = {};
      continue;  // another target may do better
    }
    target.health->record_success();
    return pass_response(target, attempt, Clock::now() - started);
  }
}

http::Response Forwarding::open_tunnel(const Gateway::Target& target, Attempt& attempt) {
  const http::RequestHead& head = forward_head_->head;
  const http::ClientResponseHead& response_head = *attempt.head;
  if (logged_) request_.set_attribute("upstream", target.label);
  if (auto refused = response_head.status == 101 ? switch_refused(*forward_head_, response_head)
                                                 : std::nullopt) {
    attempt.exchange->cancel();  // its connection is closed, never pooled
    log_warn("route {}: {} {} to {}: {}: answered 502", route_.name, head.method, head.target,
             target.label, *refused);
    return http::Response::error(502, *refused);
  }
  target.health->record_success();
  auto early = std::make_shared<std::string>();
  auto taken = attempt.exchange->take_connection(*early);
  if (!taken) return http::Response::error(502, taken.error().message());
  // An HTTP/2 client's extended CONNECT is answered 200 (RFC 8441 5): its stream is the
  // tunnel. The 101's proof of the key was ours to check, not the client's.
  http::Response response(extended_connect_ ? 200 : response_head.status);
  for (const http::Field& f : response_head.headers) {
    if (extended_connect_ && f.token == &http::token::kSecWebsocketAccept) continue;
    response.headers.add(f);
  }
  auto upstream_stream = std::make_shared<Stream>(std::move(*taken));
  response.takeover = [upstream_stream, early, forward_head = forward_head_, gateway = gateway_,
                       timeouts = service_.config->timeouts](http::TunnelEnd& client,
                                                             std::string_view from_client) {
    http::StreamTunnelEnd upstream_end(*upstream_stream);
    tunnel(client, upstream_end, from_client, *early, timeouts.idle, timeouts.tunnel);
  };
  return response;
}

http::Response Forwarding::open_stream_tunnel(const Gateway::Target& target, Attempt& attempt) {
  if (logged_) request_.set_attribute("upstream", target.label);
  target.health->record_success();
  // An HTTP/2 client gets the 200 of its own extended CONNECT (RFC 8441 §5); an HTTP/1.1 one
  // the 101 its Upgrade asked for, with the proof of its own key (RFC 6455 4.2.2).
  http::Response response(extended_connect_ ? 200 : 101);
  const std::string& protocol = forward_head_->extended_protocol;
  if (!extended_connect_) {
    response.headers.add("Upgrade", protocol);
    response.headers.add("Connection", "Upgrade");
    if (protocol == "websocket") {
      auto key = request_.headers().get(http::token::kSecWebsocketKey).value_or("");
      response.headers.add("Sec-WebSocket-Accept", http::websocket_accept(key));
    }
  }
  for (const http::Field& f : attempt.head->headers) {
    if (f.token == &http::token::kContentLength || f.token == &http::token::kSecWebsocketAccept) {
      continue;
    }
    response.headers.add(f);
  }
  response.takeover = [exchange = attempt.exchange, forward_head = forward_head_,
                       gateway = gateway_, timeouts = service_.config->timeouts](
                          http::TunnelEnd& client, std::string_view from_client) {
    ExchangeTunnelEnd upstream_end(*exchange);
    tunnel(client, upstream_end, from_client, {}, timeouts.idle, timeouts.tunnel);
  };
  return response;
}

http::Response Forwarding::pass_response(const Gateway::Target& target, Attempt& attempt,
                                         Clock::duration first_byte_time) {
  const http::RequestHead& head = forward_head_->head;
  const http::ClientResponseHead& response_head = *attempt.head;
  std::shared_ptr<http::ClientExchange> exchange = attempt.exchange;
  if (metrics_) {
    metrics_->record_upstream(service_.series,
                              std::chrono::duration<double>(exchange->connect_time()).count(),
                              std::chrono::duration<double>(first_byte_time).count());
  }
  if (logged_) {
    auto first_byte = std::chrono::duration_cast<std::chrono::milliseconds>(first_byte_time);
    request_.set_attribute("upstream", target.label);
    request_.set_attribute("upstream_connect_ms", milliseconds_text(exchange->connect_time()));
    request_.set_attribute("upstream_first_byte_ms", std::to_string(first_byte.count()));
  }
  // The upstream's fields (the server drops hop-by-hop ones and sets the framing), with our
  // Via added to its. Every return below returns `response`, so it is built in the caller's
  // place (a response is a few KiB: a move of one shows per request).
  // To an HTTP/2 client names go in lower case (its encoder writes them so): a known one can be
  // its token's text rather than a copy of the upstream's spelling.
  const bool names_lower_cased = request_.context().major_version == 2;
  http::Response response(response_head.status);
  for (const http::Field& f : response_head.headers) {
    if (f.token == &http::token::kVia) continue;
    if (names_lower_cased) {
      response.headers.add_lower_case(f);
    } else {
      response.headers.add(f);
    }
  }
  if (response_head.headers.never_indexed()) response.headers.mark_never_indexed();
  auto via = response_head.headers.get(http::token::kVia);
  std::string our_via = via ? std::string(*via) + ", " : std::string();
  our_via.append(version_text(response_head.version)).append(" spindle");
  response.headers.add_with_static_name("Via", http::token::kVia, our_via);
  if (request_.method() == "HEAD" || response_head.no_body) {
    if (response_head.content_length) {
      response.stream = [](http::BodyWriter&) {};
      response.stream_length = response_head.content_length;
    }
    return response;
  }
  // The first piece is read here, before the head goes out: it then goes with the head in one
  // write, a body that is all there needs no producer at all, and an upstream that cuts before
  // its first byte still gets the client a 502.
  std::string& first = response.body;
  std::error_code failure;
  {
    BufferPool::Buffer piece = take_buffer();  // pooled: no 16 KiB allocation per request
    auto n = exchange->read(piece.span().first(std::min(kFirstPiece, piece.span().size())));
    if (n) {
      first.assign(piece.span().data(), *n);
    } else {
      failure = n.error();
    }
  }
  if (failure == ExchangeErrc::kCancelled) {
    log_info("route {}: {} {} to {}: the client went away: upstream exchange abandoned",
             route_.name, head.method, head.target, target.label);
    response = http::Response::error(499, failure.message());
    return response;
  }
  if (failure) {
    int status = failure == ExchangeErrc::kPreempted ? 503 : 502;
    log_warn("route {}: {} {} to {}: {} before the body: answered {}", route_.name, head.method,
             head.target, target.label, failure.message(), status);
    response = http::Response::error(status, failure.message());
    return response;
  }
  bool whole = first.empty() ||
               (response_head.content_length && *response_head.content_length == first.size());
  if (whole) {
    char end;
    auto n = exchange->read({&end, 1});  // the body's end: the connection goes back to the pool
    if (n && *n == 0) {
      if (exchange->trailers().empty()) return response;
      // Trailers need a producer to carry them.
      response.stream = [gateway = gateway_, exchange, route = &route_](http::BodyWriter& writer) {
        pass_trailers(exchange->trailers(), *route, writer);
      };
      return response;
    }
  }
  response.stream_length = response_head.content_length;
  // The producer keeps the snapshot, the exchange and the in-flight count until the body is
  // sent.
  response.stream = [gateway = gateway_, exchange, forward_head = forward_head_,
                     label = target.label, route = &route_](http::BodyWriter& writer) {
    BufferPool::Buffer buffer = take_buffer();
    for (;;) {
      auto n = exchange->read(buffer.span());
      if (!n) {
        // Cut mid-body: the client's connection or stream is aborted, never ended short.
        throw std::runtime_error(
            fmt::format("route {}: upstream {}: {}", route->name, label, n.error().message()));
      }
      if (*n == 0) break;
      if (!writer.write(std::string_view(buffer.span().data(), *n))) {
        exchange->cancel();  // the client is gone
        return;
      }
    }
    if (!exchange->trailers().empty()) pass_trailers(exchange->trailers(), *route, writer);
  };
  return response;
}

http::Response Forwarding::give_up() {
  const http::RequestHead& head = forward_head_->head;
  int status = status_for(last_error_);
  if (status == 499) {
    log_info("route {}: {} {} to {}: the client went away: upstream exchange abandoned",
             route_.name, head.method, head.target, last_target_);
  } else if (fell_back_) {
    log_warn(
        "route {}: {} {} to {}: allows no extended CONNECT (RFC 8441), and over HTTP/1.1: "
        "{}: answered {}",
        route_.name, head.method, head.target, last_target_, last_error_.message(), status);
  } else {
    log_warn("route {}: {} {} to {}: {}: answered {}", route_.name, head.method, head.target,
             last_target_, last_error_.message(), status);
  }
  if (logged_) request_.set_attribute("upstream", last_target_);
  return http::Response::error(status, last_error_.message());
}

}  // namespace

http::Response Proxy::forward(http::Request& request, const std::shared_ptr<Gateway>& gateway,
                              const Gateway::Server& server, const RouteConfig& route,
                              std::string_view service_name) {
  note_client(request, *server.config);
  const Gateway::Service* service =
      gateway->service(service_name.empty() ? std::string_view(route.service) : service_name);
  if (service == nullptr) return http::Response::error(502, "no such service");
  // A retry budget grows with every request (capped), and each retry spends one.
  auto& budget = gateway->worker_state().budgets[service->index];
  budget.milli = std::min<std::int64_t>(
      budget.milli + static_cast<std::int64_t>(service->config->retries.budget * 1000), 100'000);
  Forwarding forwarding(request, gateway, server, route, *service, connections_, metrics_);
  if (auto refused = forwarding.prepare()) {
    return http::Response::error(refused->status, refused->detail);
  }
  forwarding.take_body();
  return forwarding.run();
}

}  // namespace spindle::proxy
