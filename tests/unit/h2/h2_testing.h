#pragma once
// What the h2/ tests share.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace spindle::testing {

/// The bytes of `s`, as the protocol code takes them.
inline std::span<const std::uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

/// The bytes written in `hex` (two digits each; spaces between them are skipped).
inline std::string from_hex(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    if (hex[i] == ' ') {
      --i;
      continue;
    }
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

}  // namespace spindle::testing
