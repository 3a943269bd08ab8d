#pragma once
/// HTTP status codes and their reason phrases (RFC 9110 section 15).

#include <string_view>

namespace spindle::http {

/// The registered reason phrase of `status` ("OK", "Not Found", "Early Hints", ...), or ""
/// for a code the IANA registry does not name (299, say): HTTP/1.1 allows an empty one.
std::string_view reason_phrase(int status);

/// "HTTP/1.1 <status> <reason>\r\n", built once per status from 100 to 599. A status outside
/// that range gets the 500 line; the server never sends one, as call_router answers a handler's
/// out-of-range status with a logged 500 (refuse_unsendable).
std::string_view status_line(int status);

/// True for statuses whose responses never have a body (1xx, 204, 304).
constexpr bool status_has_no_body(int status) {
  return (status >= 100 && status < 200) || status == 204 || status == 304;
}

/// True if a response with `status` makes the HTTP/1.1 connection a tunnel once its head is
/// through: a 101 (Switching Protocols, RFC 9110 §15.2.2), or any 2xx answering CONNECT
/// (`answers_connect`, RFC 9110 §9.3.6). Neither has body framing. The one place this is decided
/// (the server, the client and the framing rules ask it). (HTTP/2 has no 101, and its CONNECT
/// makes a stream a tunnel, not the connection.)
constexpr bool opens_tunnel(int status, bool answers_connect) {
  return status == 101 || (answers_connect && status >= 200 && status < 300);
}

}  // namespace spindle::http
