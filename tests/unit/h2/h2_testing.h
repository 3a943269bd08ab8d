#pragma once
// What the h2/ tests share.
#include <cstdint>
#include <span>
#include <string_view>

namespace spindle::testing {

/// The bytes of `s`, as the protocol code takes them.
inline std::span<const std::uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

}  // namespace spindle::testing
