#pragma once
// Who a request comes from, as the gateway sees it (private to src/proxy): derived once per
// request, then used by ip_allow, ip_deny, rate_limit's client_ip and the X-Forwarded-For sent
// upstream alike.

#include <string>
#include <vector>

#include "spindle/net/cidr.h"
#include "spindle/proxy/config.h"
#include "spindle/server/message.h"

namespace spindle::proxy::detail {

/// The client of a request.
struct ClientIdentity {
  /// It as text, canonical: "192.0.2.1", "2001:db8::1" (or the peer's own text otherwise).
  std::string text;
  /// The X-Forwarded-For to send on: the client, then each trusted proxy between it and this
  /// gateway, ending with the peer, all canonical. What lies left of the client in the fields
  /// received is nobody's word worth passing on.
  std::string forwarded_for;
};

/// The peer, unless it is one of `trusted`: then every X-Forwarded-For field line, as one list
/// (RFC 9110 5.3), is walked from the right past the trusted proxies to the first address that
/// is not one. Entries may be "IP", "IP:port", "[IPv6]" or "[IPv6]:port"; an entry that is not
/// an address stops the walk, and the hop that sent it is the client (as nginx's realip).
ClientIdentity identify_client(const http::Request& request, const std::vector<Cidr>& trusted);

/// True when identify_client would name the peer itself, in the text the connection already
/// has for it (`context.remote`: canonical unless the peer is an IPv4-mapped IPv6 address) —
/// an untrusted peer, a Unix one or none: then no field need be read nor any text made.
bool client_is_the_peer(const http::RequestContext& context, const std::vector<Cidr>& trusted);

/// Derives the client of `request` (identify_client) once, and keeps it with the request:
/// ip_allow, ip_deny, rate limits by client_ip and the X-Forwarded-For sent upstream all read
/// it. When it is the peer as the connection names it (most requests), nothing is kept: each
/// reader falls back to the connection's text.
void note_client(http::Request& request, const ServerConfig& server);

/// The client of `request` as text, canonical (the peer's own text if note_client has not run).
std::string_view client_text(const http::Request& request);

/// The X-Forwarded-For that note_client kept for `request` ("" if it kept none: the peer's
/// own text is the whole list then).
std::string_view noted_forwarded_for(const http::Request& request);

}  // namespace spindle::proxy::detail
