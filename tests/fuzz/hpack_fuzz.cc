// libFuzzer driver: spindle's HPACK decoder against nghttp2's (the oracle). The input is cut
// into header blocks of one connection at each 0xff 0x00 pair. Each block is decoded by both;
// they must agree, block after block: the same fields, or both refuse it (then the connection
// would end: the rest is not compared). Every block both accept is then encoded by spindle's
// encoder and decoded by a fresh nghttp2 decoder of that direction: the same fields again,
// twice (the second block a repeat of the first). A third decoder keeps the values it decoded
// (enable_value_memo, as a client's does): it must give what the plain one gives.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_checks.h"
#include "spindle/h2/hpack.h"
#include "unit/h2/nghttp2_oracle.h"

using namespace spindle::h2::hpack;
using spindle::testing::FieldList;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  Decoder ours(4096, SIZE_MAX);
  Decoder memo(4096, SIZE_MAX);
  memo.enable_value_memo();
  spindle::testing::OracleInflater theirs;
  Encoder encoder;
  spindle::testing::OracleInflater round_trip;
  std::size_t at = 0;
  while (at <= input.size()) {
    std::size_t cut = input.find(std::string_view("\xff\x00", 2), at);
    if (cut == std::string_view::npos) cut = input.size();
    std::string block(input.substr(at, cut - at));
    at = cut + 2;
    FieldList mine;
    Status status =
        ours.decode({reinterpret_cast<const std::uint8_t*>(block.data()), block.size()},
                    [&](std::string_view n, std::string_view v) { mine.emplace_back(n, v); });
    FieldList remembered;
    Status memo_status =
        memo.decode({reinterpret_cast<const std::uint8_t*>(block.data()), block.size()},
                    [&](std::string_view n, std::string_view v) { remembered.emplace_back(n, v); });
    check(memo_status == status && remembered == mine);
    auto expected = theirs.inflate(block);
    check((status == Status::kOk) == expected.has_value());
    if (!expected) break;
    check(mine == *expected);
    std::vector<Field> fields;
    for (const auto& [n, v] : mine) fields.push_back({n, v});
    std::string encoded;
    encoder.encode(fields, encoded);
    auto back = round_trip.inflate(encoded);
    check(back.has_value() && *back == mine);
    // The same fields again (written from the last block when that one added nothing).
    encoded.clear();
    encoder.encode(fields, encoded);
    back = round_trip.inflate(encoded);
    check(back.has_value() && *back == mine);
    // And twice more with the values new in every message (request ids) changed, their
    // lengths kept: the first goes as a literal, the second is a copy of that block with the
    // new values written in their places.
    FieldList varied = mine;
    for (int turn = 0; turn < 2; ++turn) {
      for (auto& [n, v] : varied) {
        if (n == "x-request-id" || n == "traceparent") {
          if (turn == 0) std::reverse(v.begin(), v.end());
          if (turn == 1 && !v.empty()) std::rotate(v.begin(), v.begin() + 1, v.end());
        }
      }
      fields.clear();
      for (const auto& [n, v] : varied) fields.push_back({n, v});
      encoded.clear();
      encoder.encode(fields, encoded);
      back = round_trip.inflate(encoded);
      check(back.has_value() && *back == varied);
    }
  }
  return 0;
}
