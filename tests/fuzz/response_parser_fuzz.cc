// libFuzzer driver for the HTTP/1 response parser (the client's). Checks, beyond "no crash, no
// sanitizer report": a complete head consumes no more than it was given, its views lie inside
// the input, its status is a three-digit code, and framing is never both chunked and sized.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz_checks.h"
#include "spindle/h1/parser.h"

using spindle::http::ParseResult;
using spindle::http::ParserLimits;
using spindle::http::ResponseHead;
using spindle::http::ResponseParser;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  ResponseParser parser(ParserLimits{.max_request_line = 512, .max_head = 2048, .max_headers = 32});
  ResponseHead head;
  ParseResult r = parser.parse(input, head);
  if (r.state == ParseResult::State::kComplete) {
    check(r.consumed <= size);
    check(head.status >= 100 && head.status <= 999);
    check(inside(head.reason, input));
    check(!(head.chunked && head.content_length));
    for (const auto& field : head.headers)
      check(inside(field.name, input) && inside(field.value, input));
  } else if (r.state == ParseResult::State::kError) {
    check(r.status == 502);
  }
  return 0;
}
