#include "spindle/h1/parser.h"

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>

#include "spindle/http/rules.h"

namespace spindle::http {
namespace {

using State = ParseResult::State;

constexpr std::string_view kCrlf = "\r\n";

ParseResult error(int status, std::string_view reason) {
  return {State::kError, 0, status, reason};
}

// Request line: method SP request-target SP HTTP-version (without CRLF), in one pass.
ParseResult parse_request_line(std::string_view line, RequestHead& head) {
  std::size_t sp1 = 0;
  while (sp1 < line.size() && is_tchar(line[sp1])) ++sp1;
  if (sp1 < line.size() && line[sp1] != ' ') return error(400, "invalid character in method");
  if (sp1 == 0 || sp1 == line.size()) return error(400, "malformed request line");
  head.method = line.substr(0, sp1);
  std::string_view rest = line.substr(sp1 + 1);
  std::size_t sp2 = target_prefix_length(rest);
  if (sp2 < rest.size() && rest[sp2] != ' ') {
    return error(400, "invalid character in request target");
  }
  if (sp2 == 0 || sp2 == rest.size()) return error(400, "malformed request line");
  head.target = rest.substr(0, sp2);
  std::string_view version = rest.substr(sp2 + 1);
  if (version.size() != 8 || !version.starts_with("HTTP/") || version[6] != '.' ||
      version[5] < '0' || version[5] > '9' || version[7] < '0' || version[7] > '9') {
    return error(400, "malformed HTTP version");
  }
  if (version[5] != '1') return error(505, "HTTP version not supported");
  head.minor_version = version[7] == '0' ? 0 : 1;

  // The four target forms, each only where it belongs (origin-form, the common one, first).
  std::string_view t = head.target;
  if (t.front() == '/') return {State::kComplete, 0, 0, {}};
  bool absolute = t.find("://") != std::string_view::npos && is_tchar(t.front());
  bool asterisk = t == "*" && head.method == "OPTIONS";
  bool authority = head.method == "CONNECT" && t.find('/') == std::string_view::npos;
  if (!absolute && !asterisk && !authority) return error(400, "invalid request target");
  return {State::kComplete, 0, 0, {}};
}

// The request line of nearly every request, judged in one pass: a method, a space, an
// origin-form target, a space, "HTTP/1.1" or "HTTP/1.0" and CRLF, within `max_line`. Returns the
// offset of its CR with `head`'s line set (`head` cleared first), or 0 for any other line, or
// one not all arrived: parse_request_line then judges it (so every error is its, as before).
std::size_t quick_request_line(std::string_view message, std::size_t max_line, RequestHead& head) {
  std::size_t sp1 =
      message.starts_with("GET ") ? 3 : detail::token_run(message.data(), message.size());
  if (sp1 == 0 || sp1 >= message.size() || message[sp1] != ' ') return 0;
  std::size_t target = sp1 + 1;
  if (target == message.size() || message[target] != '/') return 0;
  std::size_t sp2 = target + target_prefix_length(message.substr(target));
  // " HTTP/1.x\r\n"
  if (message.size() - sp2 < 11 || message[sp2] != ' ') return 0;
  const std::size_t cr = sp2 + 9;
  if (cr > max_line || message[cr] != '\r' || message[cr + 1] != '\n') return 0;
  std::uint64_t version = detail::word_at(message.data() + sp2 + 1);
  int minor;
  if (version == detail::word_at("HTTP/1.1")) {
    minor = 1;
  } else if (version == detail::word_at("HTTP/1.0")) {
    minor = 0;
  } else {
    return 0;
  }
  head.clear();
  head.method = message.substr(0, sp1);
  head.target = message.substr(target, sp2 - target);
  head.minor_version = minor;
  return cr;
}

// Notes which of "close" and "keep-alive" a Connection value lists.
void note_connection_tokens(std::string_view value, bool& close, bool& keep_alive) {
  for_each_list_item(value, [&](std::string_view token) {
    close = close || iequals(token, "close");
    keep_alive = keep_alive || iequals(token, "keep-alive");
  });
}

// The flags of the fields interpret_headers looks at: a field with none of them is not one.
constexpr std::uint16_t kInterpreted = token::kHost.flags | token::kExpect.flags |
                                       token::kConnection.flags | token::kContentLength.flags |
                                       token::kTransferEncoding.flags;
static_assert(token::kHost.flags != 0 && token::kExpect.flags != 0 &&
                  token::kConnection.flags != 0 && token::kContentLength.flags != 0 &&
                  token::kTransferEncoding.flags != 0,
              "each field interpret_headers reads needs a flag to be found by");

// What the header fields mean for framing and the connection: one pass over them, by their
// tokens; the framing rules themselves are rules.h's.
ParseResult interpret_headers(RequestHead& head) {
  FramingFields framing;
  bool close = false;
  bool keep_alive = false;
  std::size_t hosts = 0;
  std::optional<std::string_view> expect;
  for (const Field& f : head.headers) {
    // Most fields are none of the five: one test of their token's flags passes them by.
    if (f.token == nullptr || (f.token->flags & kInterpreted) == 0) continue;
    if (f.token == &token::kHost) {
      ++hosts;
    } else if (f.token == &token::kExpect) {
      if (!expect) expect = f.value;
    } else if (f.token == &token::kConnection) {
      note_connection_tokens(f.value, close, keep_alive);
    } else if (f.token == &token::kContentLength) {
      framing.note_content_length(f.value);
    } else if (f.token == &token::kTransferEncoding) {
      framing.transfer_encoding = true;
    }
  }
  BodyFraming body;
  if (auto e = request_framing(head.headers, framing, head.minor_version, body)) {
    return error(e->status, e->reason);
  }
  head.chunked = body.kind == BodyFraming::Kind::kChunked;
  if (framing.content_length) head.content_length = framing.content_length;
  if (hosts > 1) return error(400, "more than one Host");
  if (hosts == 0 && head.minor_version == 1) return error(400, "missing Host");

  if (head.minor_version == 1) {
    head.keep_alive = !close;
    if (expect) {
      if (!iequals(*expect, "100-continue")) return error(417, "unsupported expectation");
      head.expect_continue = true;
    }
  } else {
    head.keep_alive = keep_alive && !close;
  }
  return {State::kComplete, 0, 0, {}};
}

// Where the parts of a field line are (offsets into the input).
struct FieldLine {
  std::size_t colon;        // the end of the name
  std::size_t value_begin;  // the value, without the spaces and tabs around it
  std::size_t value_end;
  std::size_t cr;  // the line's end
};

// The common case of a field line in one pass: if the line from `pos` is a token, ':' and a value
// of field-value characters ended by a CR, returns true with `line` set; otherwise false (an
// invalid line, or its CR has not arrived), and the caller takes the careful way, which finds
// the same CR and says what is wrong. Saves each valid line a search for its CR, a second pass
// over its value and one to trim it. Inlined into each parser's loop over the lines.
[[gnu::always_inline]] inline bool valid_field_line(std::string_view in, std::size_t pos,
                                                    FieldLine& line) {
  const char* p = in.data();
  const std::size_t n = in.size();
  std::size_t i = pos + detail::token_run(p + pos, n - pos);
  if (i == pos || i == n || p[i] != ':') return false;
  line.colon = i++;
  if (i < n && p[i] == ' ') ++i;  // the one space nearly every line has
  while (i < n && (p[i] == ' ' || p[i] == '\t')) ++i;
  line.value_begin = i;
  // The value up to its first control byte (reading past the line's end, within `in`): a tab
  // goes on, a CR ends the line, anything else makes it invalid.
  i += detail::first_control(p + i, n - i);
  while (i < n && p[i] == '\t') {
    ++i;
    i += detail::first_control(p + i, n - i);
  }
  if (i == n || p[i] != '\r') return false;
  line.cr = i;
  while (i > line.value_begin && (p[i - 1] == ' ' || p[i - 1] == '\t')) --i;
  line.value_end = i;
  return true;
}

// Adds the field of a line valid_field_line found valid.
[[gnu::always_inline]] inline void add_field(std::string_view in, std::size_t pos,
                                             const FieldLine& line, HeaderMap& headers) {
  const std::string_view name(in.data() + pos, line.colon - pos);
  headers.add_view(Field{
      .name = name,
      .value = std::string_view(in.data() + line.value_begin, line.value_end - line.value_begin),
      .token = find_token(name)});
}

// One header line (without CRLF), added to `headers`.
ParseResult parse_field(std::string_view line, HeaderMap& headers) {
  if (line.front() == ' ' || line.front() == '\t') return error(400, "obsolete line folding");
  std::size_t colon = 0;
  while (colon < line.size() && is_tchar(line[colon])) ++colon;
  if (colon == line.size() || line[colon] != ':') {
    return error(400, colon == line.size() ? "header line without colon"
                                           : "invalid character in header name");
  }
  if (colon == 0) return error(400, "empty header name");
  if (!is_field_value(line.substr(colon + 1))) {
    return error(400, "invalid character in header value");
  }
  headers.add_view(line.substr(0, colon), trim_ows(line.substr(colon + 1)));
  return {State::kComplete, 0, 0, {}};
}

}  // namespace

ParseResult RequestParser::parse(std::string_view input, RequestHead& head) {
  // RFC 9112 2.2: ignore empty lines before the request line.
  std::size_t start = 0;
  while (input.substr(start, 2) == kCrlf) start += 2;
  std::string_view message = input.substr(start);
  if (message.empty() || message == "\r") return {State::kIncomplete, 0, 0, {}};
  // Called again after kIncomplete: the head is parsed once its end has arrived, which only
  // the new bytes can hold (a client sending a byte at a time costs no rescan).
  if (scanned_ != 0) {
    std::size_t from = scanned_ > start + 3 ? scanned_ - start - 3 : 0;
    if (message.find("\r\n\r\n", from) == std::string_view::npos) {
      return wait_for_more(input, start);
    }
  }
  ParseResult r = parse_head(message, head);
  // A head that has not all arrived gets only wait_for_more's early verdicts, even where
  // parse_head found an error in a line that is complete: how the bytes were split must not
  // change the answer (the fuzz driver checks it). Errors are rare; the search is cheap then.
  if (r.state == State::kIncomplete ||
      (r.state == State::kError && message.find("\r\n\r\n") == std::string_view::npos)) {
    return wait_for_more(input, start);
  }
  r.consumed += start;
  return r;
}

ParseResult RequestParser::parse_head(std::string_view message, RequestHead& head) const {
  // One pass, line by line: each line ends at its first CR, which must begin a CRLF.
  std::size_t line_end = quick_request_line(message, limits_.max_request_line, head);
  if (line_end == 0) {
    line_end = message.find('\r');
    if (line_end == std::string_view::npos) return {State::kIncomplete, 0, 0, {}};
    if (line_end > limits_.max_request_line) return error(414, "request line too long");
    if (line_end + 1 == message.size()) return {State::kIncomplete, 0, 0, {}};
    if (message[line_end + 1] != '\n') return error(400, "bare CR in request line");
    head.clear();
    if (auto r = parse_request_line(message.substr(0, line_end), head); r.state == State::kError) {
      return r;
    }
  }
  std::size_t pos = line_end + 2;
  for (;;) {
    if (message.size() - pos < 2) return {State::kIncomplete, 0, 0, {}};
    if (message[pos] == '\r') {  // the empty line: the end of the head
      if (message[pos + 1] != '\n') return error(400, "bare CR in header");
      if (pos + 2 > limits_.max_head) return error(431, "request header too large");
      if (auto r = interpret_headers(head); r.state == State::kError) return r;
      return {State::kComplete, pos + 2, 0, {}};
    }
    if (FieldLine line; valid_field_line(message, pos, line) && line.cr + 1 < message.size() &&
                        message[line.cr + 1] == '\n' && line.cr + 4 <= limits_.max_head &&
                        head.headers.size() < limits_.max_headers) {
      add_field(message, pos, line, head.headers);
      pos = line.cr + 2;
      continue;
    }
    std::size_t eol = message.find('\r', pos);
    if (eol == std::string_view::npos || eol + 1 == message.size()) {
      return {State::kIncomplete, 0, 0, {}};
    }
    if (message[eol + 1] != '\n') return error(400, "bare CR in header");
    // The head holds at least this line, its CRLF and the empty line's.
    if (eol + 4 > limits_.max_head) return error(431, "request header too large");
    if (head.headers.size() == limits_.max_headers) return error(431, "too many header fields");
    if (auto r = parse_field(message.substr(pos, eol - pos), head.headers);
        r.state == State::kError) {
      return r;
    }
    pos = eol + 2;
  }
}

ParseResult RequestParser::wait_for_more(std::string_view input, std::size_t start) {
  std::string_view message = input.substr(start);
  std::size_t line_end = message.find(kCrlf);
  if (line_end == std::string_view::npos) {
    // Fail early on a request line that is already too long or already wrong.
    if (message.size() > limits_.max_request_line) return error(414, "request line too long");
    // Not even a method (a TLS handshake sent to a plain port, say): no need to wait.
    for (char c : message.substr(0, message.find(' '))) {
      if (!is_tchar(c)) return error(400, "invalid character in method");
    }
  } else if (scanned_ <= start + line_end + 2) {
    // The request line arrived whole since the last call (or in this first one): check it
    // once.
    if (line_end > limits_.max_request_line) return error(414, "request line too long");
    RequestHead probe;
    auto r = parse_request_line(message.substr(0, line_end), probe);
    if (r.state == State::kError) return r;
  }
  if (message.size() > limits_.max_head) return error(431, "request header too large");
  scanned_ = input.size();
  return {State::kIncomplete, 0, 0, {}};
}

ParseResult ResponseParser::parse(std::string_view input, ResponseHead& head) {
  std::size_t end = input.find("\r\n\r\n");
  if (end == std::string_view::npos) {
    if (input.size() > limits_.max_head) return error(502, "response header too large");
    return {State::kIncomplete, 0, 0, {}};
  }
  if (end + 4 > limits_.max_head) return error(502, "response header too large");
  head.clear();
  // Line by line, as a request's head: each line ends at its first CR, which must begin a
  // CRLF (one search a line; the head's end above guarantees a CR at or before it).
  std::size_t line_end = input.find('\r');
  if (input[line_end + 1] != '\n') return error(502, "bare CR in status line");
  std::string_view line = input.substr(0, line_end);
  // HTTP/1.x SP 3DIGIT SP reason
  if (line.size() < 12 || !line.starts_with("HTTP/1.") || line[8] != ' ' ||
      (line.size() > 12 && line[12] != ' ')) {
    return error(502, "malformed status line");
  }
  if (line[7] != '0' && line[7] != '1') return error(502, "unsupported HTTP version");
  head.minor_version = line[7] - '0';
  int status = 0;
  for (std::size_t i = 9; i < 12; ++i) {
    if (line[i] < '0' || line[i] > '9') return error(502, "malformed status code");
    status = status * 10 + (line[i] - '0');
  }
  // RFC 9110 15: a status code is 100 to 599; anything else is not HTTP.
  if (status < 100 || status > 599) return error(502, "malformed status code");
  head.status = status;
  head.reason = line.size() > 13 ? line.substr(13) : std::string_view();
  std::size_t pos = line_end + 2;
  while (pos < end + 2) {
    if (FieldLine line; valid_field_line(input, pos, line) && input[line.cr + 1] == '\n' &&
                        head.headers.size() < limits_.max_headers) {
      // (A CR at or before the head's end: the one that begins its empty line at the latest.)
      add_field(input, pos, line, head.headers);
      pos = line.cr + 2;
      continue;
    }
    std::size_t eol = input.find('\r', pos);
    if (input[eol + 1] != '\n') return error(502, "bare CR in header");
    std::string_view field = input.substr(pos, eol - pos);
    if (head.headers.size() == limits_.max_headers) return error(502, "too many header fields");
    if (auto r = parse_field(field, head.headers); r.state == State::kError) {
      return error(502, r.reason);
    }
    pos = eol + 2;
  }
  FramingFields framing = collect_framing_fields(head.headers);
  // The method is not known here: a HEAD or CONNECT caller re-decides with response_framing.
  if (auto e = response_framing(head.headers, framing, head.status, "GET", head.framing)) {
    return error(502, e->reason);
  }
  head.content_length = framing.content_length;
  head.chunked = head.framing.kind == BodyFraming::Kind::kChunked;
  if (framing.transfer_encoding) head.content_length.reset();  // the coding overrides it
  if (head.framing.kind == BodyFraming::Kind::kUntilClose) head.keep_alive = false;
  if (head.minor_version == 1) {
    head.keep_alive = head.keep_alive && !head.headers.has_token(token::kConnection, "close");
  } else {
    head.keep_alive = head.headers.has_token(token::kConnection, "keep-alive");
  }
  return {State::kComplete, end + 4, 0, {}};
}

}  // namespace spindle::http
