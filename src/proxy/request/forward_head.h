#pragma once
// The request as it goes to the upstream (private to src/proxy): the client's fields less the
// hop-by-hop ones, the X-Forwarded-* family, Via, X-Request-Id and traceparent, the route's
// rewrites, and the upgrade it may offer. Built by the forwarded request and by a mirror copy.

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "spindle/client/exchange.h"
#include "spindle/proxy/config.h"
#include "spindle/server/message.h"

namespace spindle::proxy::detail {

/// Text of at most N characters kept in place: ids made per request need no allocation.
template <std::size_t N>
struct InlineText {
  std::array<char, N> text;  ///< the characters, `size` of them in use
  std::size_t size = 0;      ///< how many of `text` are in use
  /// The text.
  std::string_view view() const { return {text.data(), size}; }
  /// Takes `s`, cut to N characters.
  void assign(std::string_view s) {
    size = std::min(s.size(), N);
    std::memcpy(text.data(), s.data(), size);
  }
};

/// Counts a request in flight to a target on this worker while it lives. The count is part of
/// a snapshot (Gateway::WorkerState), which it shares the ownership of: whatever holds the
/// request (a streamed answer's producer, a tunnel) holds the snapshot as long, however many
/// reloads retire it meanwhile.
class InFlight {
 public:
  /// Adds one to `*count` until destroyed; `count` owns a share of the snapshot it is in.
  explicit InFlight(std::shared_ptr<std::size_t> count) : count_(std::move(count)) { ++*count_; }
  ~InFlight() { --*count_; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::shared_ptr<std::size_t> count_;  ///< the worker's count for the target
};

/// The X-Forwarded-For, -Proto and -Host of a request: the upstream, a mirror target and a
/// forward_auth service are told the same (forwarded_fields).
struct ForwardedFields {
  /// The client, then each trusted proxy between it and this gateway (note_client).
  std::string for_list;
  /// A trusted proxy's X-Forwarded-Proto, else the scheme the client used here.
  std::string proto;
  /// A trusted proxy's X-Forwarded-Host, else the authority of the request ("" for none).
  std::string host;
};

/// The request as it goes to the upstream. Shared with the response's producer (or a tunnel),
/// which also keeps the request counted in flight to its target until it ends.
struct ForwardHead {
  // User-provided, so that make_shared does not zero the whole object (the head's inline
  // field storage is 2 KiB) before constructing it.
  ForwardHead() {}

  /// The request counted in flight to the target of the attempt under way.
  std::optional<InFlight> in_flight;
  /// The head sent upstream (its fields are views into the client's request and below).
  http::RequestHead head;
  /// The target, once a middleware has rewritten it (head.target points here then).
  std::string target;
  /// The authority the request is for (CONNECT's target, Host, or the local address).
  std::string authority;
  /// The client's request id (one worth keeping), or one made here.
  InlineText<128> request_id;
  /// The W3C traceparent sent upstream.
  InlineText<55> traceparent;
  /// X-Forwarded-For, -Proto and -Host (the head's views point into them).
  ForwardedFields forwarded;
  /// Via (the head's view points into it).
  std::string via;
  /// The Upgrade offered upstream: the client's tokens the route allows ("" for none).
  std::string upgrade;
  /// The Sec-WebSocket-Key sent upstream, made here for an HTTP/2 client's extended CONNECT.
  std::string websocket_key;
  /// The upgrade as an HTTP/2 upstream takes it, an extended CONNECT (RFC 8441): made for an
  /// upgrade to an HTTP/2 service only (as_extended_connect); `head` is then the HTTP/1.1
  /// upgrade that goes where the upstream allows none.
  std::unique_ptr<http::RequestHead> extended;
  /// Its :protocol: the first protocol `upgrade` offers.
  std::string extended_protocol;
};

/// The request attribute that holds the request's id once noted (note_route): logged.
inline constexpr std::string_view kRequestIdAttribute = "request_id";

/// The id of `request`: the one noted (note_route), else the client's X-Request-Id if it is
/// worth keeping (1 to 128 of [A-Za-z0-9._-]), else a new one.
void request_id_of(const http::Request& request, InlineText<128>& out);

/// Notes the id of `request` (request_id_of) on it, if not yet: every copy made of it after
/// (to a forward_auth service, a mirror target, the upstream) carries that id. Returns it (a
/// view of the attribute, valid until another attribute is set).
std::string_view note_request_id(http::Request& request);

/// Notes, for the access log, the route a request took and its id, as soon as it is routed:
/// the line of a request a middleware answers says them too.
void note_route(http::Request& request, const RouteConfig& route);

/// "1.1" for the HTTP version of a message (major * 10 + minor).
std::string_view version_text(int version);

/// The authority `request` is for: the canonical request's (CONNECT's target, an extended
/// CONNECT's :authority, Host: they never differ), else the address the client connected to.
std::string authority_of(const http::Request& request);

/// The X-Forwarded-* fields `request` (for `authority`: authority_of) goes on with, into
/// `out`: a trusted proxy's X-Forwarded-Proto and -Host kept, anyone else's replaced;
/// X-Forwarded-For as note_client derived it. The one place they are computed: the upstream,
/// a mirror target and the auth service are told alike.
void forwarded_fields(const http::Request& request, const ServerConfig& server,
                      std::string_view authority, ForwardedFields& out);

/// Adds `fields` to `headers` (views into `fields`).
void add_forwarded_fields(const ForwardedFields& fields, http::HeaderMap& headers);

/// The method `request` goes upstream as: an extended CONNECT (RFC 8441) is the GET upgrade it
/// stands for (and goes so over HTTP/1.1; over HTTP/2 as the CONNECT that means it).
std::string_view forwarded_method(const http::Request& request);

/// The head of `request` for the upstream, into `out`: the method, the target, the framing,
/// the fields that may go on (http::forwardable), then X-Forwarded-For, -Proto and -Host, Via,
/// X-Request-Id and traceparent (a trusted proxy's X-Forwarded-* kept, anyone else's replaced).
void build_head(const http::Request& request, const ServerConfig& server, ForwardHead& out);

/// A headers middleware's edits on `headers`: removes, then sets, then adds.
void apply_edits(const HeaderEdits& edits, http::HeaderMap& headers);

/// One middleware's edits of the fields that go upstream: the fields forward_auth and jwt write
/// from what they verified (the client's of those names removed), a headers middleware's
/// request edits; nothing for the other kinds. The forwarded head and the request forward_auth
/// makes of its service both take them, in the route's order.
void apply_field_edits(const http::Request& request, const MiddlewareConfig& m,
                       http::HeaderMap& headers);

/// True if `m` edits the fields that go upstream (apply_field_edits changes something).
bool edits_request_fields(const MiddlewareConfig& m);

/// Removes from `headers` the fields `m` writes on the way up (those forward_auth and jwt
/// write, those a headers middleware sets or adds): what the client sent under those names is
/// not what the upstream gets.
void erase_written_fields(const MiddlewareConfig& m, http::HeaderMap& headers);

/// The route's middlewares, in order, on the request as it will go upstream: forward_auth's
/// and jwt's fields, header edits, and the target's rewrites (strip_prefix, add_prefix,
/// replace_path, replace_path_regex).
void apply_request_middlewares(const http::Request& request, const RouteConfig& route,
                               ForwardHead& out);

/// True if a headers middleware of `route` edits responses.
bool edits_responses(const RouteConfig& route);

/// The route's response edits (its headers middlewares', in reverse order, as on the way back)
/// on the fields of an interim response (103 Early Hints, ...): every head the client gets
/// carries them.
void edit_interim_fields(const RouteConfig& route, http::HeaderMap& fields);

/// The route's response edits on trailers: a field one removes or sets is not in them (the
/// head says what the set says; a trailer of its name would say otherwise).
void edit_trailer_fields(const RouteConfig& route, http::HeaderMap& fields);

/// The client's Upgrade tokens the route allows (RFC 9110 7.8: "name[/version]", a list over
/// any number of field lines), into out.upgrade and an Upgrade field of the forwarded head. The
/// others go nowhere: the request goes on as a plain one without them (h2c, above all, which
/// would carry the client's HTTP/2 streams past every route).
void offer_upgrade(const http::Request& request, const RouteConfig& route, ForwardHead& out);

/// Why a 101 must not be passed on (nullopt: it may). It must switch to a protocol the request
/// offered, and for WebSocket prove it read the request's key (RFC 6455 4.1): anything else
/// would join the client to an upstream that speaks who knows what.
std::optional<std::string_view> switch_refused(const ForwardHead& out,
                                               const http::ClientResponseHead& answer);

/// The upgrade `out.head` offers (out.upgrade, its first protocol) as an HTTP/2 upstream takes
/// it, into out.extended: an extended CONNECT (RFC 8441) to the same target and authority, with
/// the same fields less Upgrade and Sec-WebSocket-Key (a key is proved by HTTP/1.1's 101 only,
/// RFC 8441 §5). Nothing if no upgrade is offered.
void as_extended_connect(ForwardHead& out);

/// An HTTP/2 client's extended CONNECT (RFC 8441) as the HTTP/1.1 upgrade it stands for: GET,
/// with Upgrade and, for WebSocket, a key made here (the 101's Accept is checked against it).
/// False if the route does not allow the protocol.
bool extended_connect_as_upgrade(const http::Request& request, const RouteConfig& route,
                                 ForwardHead& out);

}  // namespace spindle::proxy::detail
