#pragma once
// What RFC 9113 §8 asks of a message's header block, field by field as HPACK decodes them
// (private to src/h2: the session's): a request's pseudo-fields (§8.3.1), a response's :status
// (§8.3.2), no connection-specific field (§8.2.2), one Content-Length.
#include <cstdint>

#include "spindle/h2/hpack.h"

namespace spindle::h2::detail {

/// What one request head has shown so far (RFC 9113 §8.3.1).
struct HeadCheck {
  bool regular_seen = false;
  bool method = false, scheme = false, path = false, authority = false, protocol = false;
  bool connect = false;
  /// :method is OPTIONS, and :path is "*": the asterisk is an OPTIONS request's only (a GET of
  /// "*" would go on as `GET * HTTP/1.1`).
  bool options = false, asterisk = false;
  bool malformed = false;
  std::int64_t content_length = -1;

  /// Takes one decoded field of the head (or of its trailers).
  void field(const hpack::Decoded& d, bool trailers, bool connect_protocol);
  /// The head is whole and well-formed.
  bool complete() const;
};

/// What one response head has shown so far (RFC 9113 §8.3.2): one :status of three digits,
/// first; no request pseudo-field; no connection-specific field. 101 has no place in HTTP/2
/// (§8.6), and an interim head does not end the stream.
struct ResponseCheck {
  bool regular_seen = false;
  bool status_seen = false;
  bool malformed = false;
  int status = 0;
  std::int64_t content_length = -1;

  /// Takes one decoded field of the head (or of its trailers).
  void field(const hpack::Decoded& d, bool trailers);
  bool informational() const { return status >= 100 && status < 200; }
  /// The head is whole and well-formed (`end_stream`: it ends the stream).
  bool complete(bool end_stream) const {
    return !malformed && status_seen && status != 101 && !(informational() && end_stream);
  }
};

}  // namespace spindle::h2::detail
