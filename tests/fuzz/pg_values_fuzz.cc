// libFuzzer driver for the readers of PostgreSQL's text form of values (pg/result.cc): what a
// server, or whatever answers in its place, sends back is read as bool, integer, double, bytea
// and timestamp. Beyond "no crash, no sanitizer report": a value read is written back the way
// the server would write it and read again to the same value (integers, timestamps), and bytea
// read from its hex form has half the hex digits' bytes.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_checks.h"
#include "spindle/pg/result.h"

using namespace spindle::pg;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)parse_bool(text);
  (void)parse_double(text);
  if (auto n = parse_int(text)) {
    auto again = parse_int(std::to_string(*n));
    check(again && *again == *n);
  }
  if (auto bytes = parse_bytea(text); bytes && text.starts_with("\\x")) {
    check(bytes->size() * 2 == text.size() - 2);
  }
  if (auto time = parse_timestamp(text)) {
    auto again = parse_timestamp(format_timestamp(*time));
    check(again && *again == *time);
  }
  return 0;
}
