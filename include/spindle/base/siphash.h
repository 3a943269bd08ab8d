#pragma once
/// SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed 64-bit hash. With a secret key, nobody
/// who does not know it can choose inputs that land together, which is what a table exposed to
/// clients' keys needs (a rate limit's slots, say).

#include <cstdint>
#include <string_view>

namespace spindle {

/// A 128-bit SipHash key.
struct SipKey {
  std::uint64_t k0 = 0, k1 = 0;
  /// A key from the system's random source (getrandom(2)).
  static SipKey random();
};

/// SipHash-2-4 of `data` under `key`.
std::uint64_t siphash(const SipKey& key, std::string_view data);

}  // namespace spindle
