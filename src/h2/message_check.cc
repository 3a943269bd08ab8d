// RFC 9113 §8's checks of a message's header block: see message_check.h.
#include "message_check.h"

#include <charconv>

#include "spindle/http/rules.h"

namespace spindle::h2::detail {
namespace token = http::token;

namespace {

// Fields that belong to one HTTP/1.1 connection, never to an HTTP/2 message (RFC 9113 §8.2.2).
bool connection_specific(const http::Token* token) {
  return token == &token::kConnection || token == &token::kKeepAlive ||
         token == &token::kProxyConnection || token == &token::kTransferEncoding ||
         token == &token::kUpgrade;
}

// A decoded field passes RFC 9113 §8.2.1 (the decoder has checked table entries already).
bool valid_field(const hpack::Decoded& d) {
  return d.checked || ((d.name_checked || valid_name(d.field.name)) && valid_value(d.field.value));
}

// A Content-Length value into `length` (which holds an earlier one, or -1): false if it is not
// a number, or differs from the earlier one.
bool take_content_length(std::string_view value, std::int64_t& length) {
  std::int64_t n = -1;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < 0 ||
      (length >= 0 && length != n)) {
    return false;
  }
  length = n;
  return true;
}

}  // namespace

void HeadCheck::field(const hpack::Decoded& d, bool trailers, bool connect_protocol) {
  if (!valid_field(d)) {
    malformed = true;
    return;
  }
  const auto& [name, value, token] = d.field;
  if (name.front() == ':') {
    if (trailers || regular_seen) {
      malformed = true;
      return;
    }
    bool* seen = token == &token::kMethod                         ? &method
                 : token == &token::kScheme                       ? &scheme
                 : token == &token::kPath                         ? &path
                 : token == &token::kAuthority                    ? &authority
                 : token == &token::kProtocol && connect_protocol ? &protocol
                                                                  : nullptr;
    if (seen == nullptr || *seen) {
      malformed = true;  // unknown, or twice
      return;
    }
    *seen = true;
    // What HTTP/1.1 would take as a method and a target (a tab in one, a space or DEL in the
    // other would change the request line an HTTP/1.1 upstream reads).
    if (token == &token::kMethod) {
      if (!http::is_method(value)) malformed = true;
      connect = value == "CONNECT";
      options = value == "OPTIONS";
    }
    if (token == &token::kPath) {
      if (value.empty() || http::target_prefix_length(value) != value.size()) malformed = true;
      asterisk = value == "*";
    }
    return;
  }
  regular_seen = true;
  if (connection_specific(token) || (token == &token::kTe && value != "trailers")) {
    malformed = true;
  }
  if (token == &token::kContentLength && !trailers && !take_content_length(value, content_length)) {
    malformed = true;
  }
}

bool HeadCheck::complete() const {
  if (malformed || !method) return false;
  if (connect && !protocol) return authority && !scheme && !path;  // RFC 9113 §8.5
  if (protocol && !connect) return false;                          // RFC 8441 §4
  if (asterisk && !options) return false;                          // RFC 9113 §8.3.1
  return scheme && path;
}

void ResponseCheck::field(const hpack::Decoded& d, bool trailers) {
  if (!valid_field(d)) {
    malformed = true;
    return;
  }
  const auto& [name, value, token] = d.field;
  if (name.front() == ':') {
    if (trailers || regular_seen || status_seen || token != &token::kStatus) {
      malformed = true;
      return;
    }
    status_seen = true;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), status);
    if (value.size() != 3 || ec != std::errc() || end != value.data() + value.size() ||
        status < 100 || status > 599) {
      malformed = true;
    }
    return;
  }
  regular_seen = true;
  if (connection_specific(token)) malformed = true;
  if (token == &token::kContentLength && !trailers && !take_content_length(value, content_length)) {
    malformed = true;
  }
}

}  // namespace spindle::h2::detail
