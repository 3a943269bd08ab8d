// libFuzzer driver for the HTTP/1 request parser. Checks, beyond "no crash, no sanitizer
// report": a complete head consumes no more than it was given, its views lie inside the input,
// and feeding the same bytes in two pieces gives the same verdict as feeding them at once.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz_checks.h"
#include "spindle/h1/parser.h"

using spindle::http::ParseResult;
using spindle::http::ParserLimits;
using spindle::http::RequestHead;
using spindle::http::RequestParser;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  ParserLimits limits{.max_request_line = 512, .max_head = 2048, .max_headers = 32};

  RequestParser whole(limits);
  RequestHead head;
  ParseResult once = whole.parse(input, head);
  if (once.state == ParseResult::State::kComplete) {
    check(once.consumed <= size);
    check(inside(head.method, input) && inside(head.target, input));
    for (const auto& field : head.headers)
      check(inside(field.name, input) && inside(field.value, input));
  }

  // The same bytes in two pieces, split where the first byte says.
  std::size_t split = size == 0 ? 0 : data[0] % (size + 1);
  RequestParser pieces(limits);
  RequestHead head2;
  ParseResult first = pieces.parse(input.substr(0, split), head2);
  ParseResult second = first;
  if (first.state == ParseResult::State::kIncomplete) second = pieces.parse(input, head2);
  if (first.state != ParseResult::State::kError) {
    check(second.state == once.state);
    if (once.state == ParseResult::State::kComplete) check(second.consumed == once.consumed);
  }
  return 0;
}
