#pragma once
/// The parsed heads of requests and responses, whichever protocol carried them: the HTTP/1
/// parsers (h1/parser.h) and the HTTP/2 drivers fill the same structures, and everything above
/// (the server, the client, the handlers) reads them.

#include <cstdint>
#include <optional>
#include <string_view>

#include "spindle/http/header_map.h"
#include "spindle/http/rules.h"

namespace spindle::http {

/// A parsed request head. The views point into the parsed input and live as long as it does.
struct RequestHead {
  /// The method token, e.g. "GET" (case-sensitive, as RFC 9110 says).
  std::string_view method;
  /// The request target as sent: origin-form "/a?b", absolute-form "http://h/a",
  /// authority-form "h:443" (CONNECT) or "*" (OPTIONS). In the canonical request (canonical.h)
  /// never absolute-form, and its path normalised.
  std::string_view target;
  /// The authority the request is for, host[:port]: set by canonicalize_request (from an
  /// absolute-form or CONNECT target, HTTP/2's :authority, or Host; validated), or by an
  /// HTTP/2 driver with the :authority it received before; "" if the request names none.
  std::string_view authority;
  /// The minor version: 0 for HTTP/1.0, 1 for HTTP/1.1 (and later 1.x, answered as 1.1).
  int minor_version = 1;
  /// All header fields, in order.
  HeaderMap headers;
  /// The body length from Content-Length, if present.
  std::optional<std::uint64_t> content_length;
  /// True if the body is chunked (Transfer-Encoding: chunked); on HTTP/2, true for a body
  /// without Content-Length (its end is END_STREAM): a body of unknown length either way.
  bool chunked = false;
  /// True if the connection may carry another request after this one.
  bool keep_alive = true;
  /// True if the client sent "Expect: 100-continue" (HTTP/1.1).
  bool expect_continue = false;
  /// HTTP/2's extended CONNECT (RFC 8441): the protocol its `:protocol` names ("websocket"),
  /// with `method` CONNECT and `target` a path; "" for every other request.
  std::string_view protocol;

  /// Clears everything for the next request.
  void clear();
};

/// A parsed response head (for clients). Views point into the parsed input.
struct ResponseHead {
  /// The status code (100-599).
  int status = 0;
  /// The reason phrase as sent.
  std::string_view reason;
  /// 0 for HTTP/1.0, 1 for HTTP/1.1.
  int minor_version = 1;
  HeaderMap headers;
  /// From Content-Length, if present.
  std::optional<std::uint64_t> content_length;
  /// Transfer-Encoding: chunked.
  bool chunked = false;
  /// How the body is delimited, as for a GET (rules.h: response_framing; callers that sent
  /// HEAD or CONNECT decide again with the method).
  BodyFraming framing;
  /// The connection may carry another request after this response.
  bool keep_alive = true;

  void clear();
};

}  // namespace spindle::http
