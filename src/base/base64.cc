#include "spindle/base/base64.h"

namespace spindle {

std::optional<std::string> base64url_decode(std::string_view in, Base64Mode mode) {
  bool strict = mode == Base64Mode::kStrict;
  if (strict && in.size() % 4 == 1) return std::nullopt;  // no whole byte in the last group
  std::string out;
  out.reserve(in.size() / 4 * 3 + 2);
  unsigned bits = 0;
  int count = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') {
      v = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      v = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      v = c - '0' + 52;
    } else if (c == '-' || (c == '+' && !strict)) {
      v = 62;
    } else if (c == '_' || (c == '/' && !strict)) {
      v = 63;
    } else if (c == '=' && !strict) {
      break;
    } else {
      return std::nullopt;
    }
    bits = (bits << 6) | static_cast<unsigned>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out += static_cast<char>((bits >> count) & 0xff);
    }
  }
  if (strict && (bits & ((1u << count) - 1)) != 0) return std::nullopt;
  return out;
}

}  // namespace spindle
