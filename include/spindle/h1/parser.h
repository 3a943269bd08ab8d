#pragma once
/// The HTTP/1 request-head parser: a pure function over bytes (no I/O, no allocation for up to
/// 24 header fields), incremental, zero-copy (the parsed head points into the input), strict to
/// RFC 9110/9112. Every rejection carries the status to answer with; after any of them the
/// connection's framing can no longer be trusted and it must be closed.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "spindle/http/head.h"
#include "spindle/http/rules.h"

namespace spindle::http {

/// Size limits of a request head.
struct ParserLimits {
  /// Longest request line (method, target, version); longer gets 414.
  std::size_t max_request_line = 8 * 1024;
  /// Longest head (request line and all header lines); longer gets 431.
  std::size_t max_head = 16 * 1024;
  /// Most header fields; more get 431.
  std::size_t max_headers = 100;
};

/// The outcome of RequestParser::parse.
struct ParseResult {
  /// What happened.
  enum class State { kIncomplete, kComplete, kError };
  /// kComplete: the head was parsed; kIncomplete: more bytes are needed; kError: rejected.
  State state = State::kIncomplete;
  /// kComplete: the bytes the head took (the body, if any, starts there).
  std::size_t consumed = 0;
  /// kError: the status to answer with (400, 414, 417, 431, 501, 505).
  int status = 0;
  /// kError: a short reason for the log and the error page.
  std::string_view reason;
};

/// Parses one request head at a time.
class RequestParser {
 public:
  /// A parser with `limits`.
  explicit RequestParser(ParserLimits limits = {}) : limits_(limits) {}

  /// Parses the head at the start of `input`. After kIncomplete call again with the same bytes
  /// plus more (it does not rescan what it has seen). After kComplete or kError call reset()
  /// before the next request. `head` is filled only on kComplete.
  ParseResult parse(std::string_view input, RequestHead& head);
  /// Forgets the progress of the current request.
  void reset() { scanned_ = 0; }

 private:
  /// Parses the head at the start of `message` (leading empty lines skipped) in one pass;
  /// kIncomplete if it has not all arrived.
  ParseResult parse_head(std::string_view message, RequestHead& head) const;
  /// After kIncomplete: rejects what is already wrong or too long, and notes how far `input`
  /// has been searched for the end of the head.
  ParseResult wait_for_more(std::string_view input, std::size_t start);

  /// The limits in force.
  ParserLimits limits_;
  /// Bytes of the current input already known not to hold the end of the head (0 before the
  /// first call for a request).
  std::size_t scanned_ = 0;
};

/// Parses response heads (RFC 9112 section 4): the status line, the fields, and what they say
/// about framing. Incremental like RequestParser; kError's status is 502 (a bad upstream).
class ResponseParser {
 public:
  explicit ResponseParser(ParserLimits limits = {}) : limits_(limits) {}
  /// Parses the head at the start of `input`.
  ParseResult parse(std::string_view input, ResponseHead& head);

 private:
  ParserLimits limits_;
};

}  // namespace spindle::http
