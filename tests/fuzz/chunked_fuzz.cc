// libFuzzer driver for the chunked body decoder. Feeds the input in pieces whose sizes come
// from the first byte and checks: the payload handed out never exceeds the limit, every data
// view lies inside the bytes given, and the decoded body does not depend on how it was split.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "spindle/h1/chunked.h"

using spindle::http::ChunkedDecoder;
using Kind = ChunkedDecoder::Step::Kind;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

// Decodes `input` fed `piece` bytes at a time; returns the body and the final kind.
std::pair<std::string, Kind> decode(std::string_view input, std::size_t piece) {
  constexpr std::uint64_t kLimit = 1 << 16;
  ChunkedDecoder decoder(kLimit);
  std::string pending, body;
  std::size_t fed = 0;
  for (;;) {
    auto step = decoder.next(pending);
    if (step.kind == Kind::kError) return {body, Kind::kError};
    check(step.consumed <= pending.size());
    if (!step.data.empty()) {
      check(step.data.data() >= pending.data() &&
            step.data.data() + step.data.size() <= pending.data() + pending.size());
    }
    body.append(step.data);
    check(body.size() <= kLimit);
    pending.erase(0, step.consumed);
    if (step.kind == Kind::kDone) return {body, Kind::kDone};
    if (step.kind == Kind::kNeedMore) {
      if (fed == input.size()) return {body, Kind::kNeedMore};
      std::size_t n = std::min(piece, input.size() - fed);
      pending.append(input.substr(fed, n));
      fed += n;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto whole = decode(input, input.size() + 1);
  auto pieces = decode(input, 1 + data[0] % 17);
  check(whole.second == pieces.second);
  if (whole.second == Kind::kDone) check(whole.first == pieces.first);
  return 0;
}
