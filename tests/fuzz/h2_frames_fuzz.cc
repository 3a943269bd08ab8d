// libFuzzer driver for the HTTP/2 frame reader: the input (after its first byte) read whole and
// cut in pieces of the first byte's size must give the same frames and the same error; every
// view a frame holds lies inside the frame's bytes; payloads never pass the frame size limit.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_checks.h"
#include "spindle/h2/frame.h"

using namespace spindle::h2;

namespace {

struct Seen {
  std::uint8_t type, flags;
  std::uint32_t stream, length;
  std::string payload;
  bool operator==(const Seen&) const = default;
};

std::pair<std::vector<Seen>, int> read(std::span<const std::uint8_t> in, std::size_t piece) {
  FrameReader reader;
  std::vector<Seen> frames;
  int error = -1;
  for (std::size_t at = 0; at < in.size() && error < 0; at += piece) {
    auto chunk = in.subspan(at, std::min(piece, in.size() - at));
    auto e = reader.feed(chunk, [&](const Frame& f) {
      check(f.payload.size() <= f.length && f.length <= kDefaultMaxFrameSize);
      frames.push_back(
          {f.type, f.flags, f.stream_id, f.length,
           std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size())});
      return true;
    });
    if (e) error = static_cast<int>(e->code);
  }
  return {frames, error};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::span<const std::uint8_t> in(data + 1, size - 1);
  auto whole = read(in, in.size() + 1);
  auto pieces = read(in, 1 + data[0] % 32);
  check(whole == pieces);
  return 0;
}
