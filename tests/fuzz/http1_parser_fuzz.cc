// libFuzzer driver for the HTTP/1 request parser and the canonical request made of what it
// parses. Checks, beyond "no crash, no sanitizer report": a complete head consumes no more than
// it was given, its views lie inside the input, and feeding the same bytes in two pieces gives
// the same verdict as feeding them at once; a head made canonical has one authority (valid, and
// Host says it), an origin-form target, no field that may come once twice, at most one Cookie,
// and is canonical already when made so again.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fuzz_checks.h"
#include "spindle/h1/parser.h"
#include "spindle/http/canonical.h"

namespace {

using spindle::http::RequestHead;

// The invariants of a canonical request.
void check_canonical(const RequestHead& head) {
  using namespace spindle::http;
  check(canonical_method(head.method) == head.method);
  const bool tunnel = head.method == "CONNECT";
  check(head.target.starts_with('/') || (head.target == "*" && head.method == "OPTIONS") ||
        (tunnel && head.target == head.authority));
  check(head.authority.empty() || is_authority(head.authority));
  std::size_t hosts = 0, cookies = 0;
  for (const Field& f : head.headers) {
    hosts += f.token == &token::kHost ? 1 : 0;
    cookies += f.token == &token::kCookie ? 1 : 0;
    if (f.token == &token::kHost) check(f.value == head.authority);
    if (f.token == nullptr || (f.token->flags & field_flag::kSingleton) == 0) continue;
    check(head.headers.count(*f.token) == 1);
  }
  check(hosts == (head.authority.empty() ? hosts : 1) && hosts <= 1 && cookies <= 1);
}

// Makes the parsed `head` canonical (its target in `buffer`) and checks it, and that it is a
// fixed point.
void canonical_twice(RequestHead& head, std::string& buffer) {
  using namespace spindle::http;
  char* target = buffer.data() + (head.target.data() - buffer.data());
  if (canonicalize_request(head, target, PathRules{})) return;
  check_canonical(head);
  std::string again_target(head.target);
  RequestHead again;
  again.method = head.method;
  again.target = again_target;
  for (const Field& f : head.headers) again.headers.add_view(f);
  check(!canonicalize_request(again, again_target.data(), PathRules{}));
  check(again.method == head.method && again.target == head.target &&
        again.authority == head.authority && again.headers.size() == head.headers.size());
}

}  // namespace

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

  // Canonical, over a writable copy (the driver rewrites its read buffer the same way).
  if (once.state == ParseResult::State::kComplete) {
    std::string buffer(input);
    RequestParser writable(limits);
    RequestHead head3;
    check(writable.parse(buffer, head3).state == ParseResult::State::kComplete);
    canonical_twice(head3, buffer);
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
