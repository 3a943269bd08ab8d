#include "spindle/base/siphash.h"

#include <sys/random.h>

#include <cstring>
#include <stdexcept>

namespace spindle {
namespace {

constexpr std::uint64_t rotl(std::uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

struct State {
  std::uint64_t v0, v1, v2, v3;
  void round() {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  }
  void absorb(std::uint64_t m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};

std::uint64_t little_endian(const char* p, std::size_t n) {
  std::uint64_t m = 0;
  for (std::size_t i = 0; i < n; ++i)
    m |= std::uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return m;
}

}  // namespace

SipKey SipKey::random() {
  SipKey key;
  std::uint64_t words[2];
  if (::getrandom(words, sizeof words, 0) != static_cast<ssize_t>(sizeof words)) {
    throw std::runtime_error("getrandom failed: no key for SipHash");
  }
  key.k0 = words[0];
  key.k1 = words[1];
  return key;
}

std::uint64_t siphash(const SipKey& key, std::string_view data) {
  State s{key.k0 ^ 0x736f6d6570736575ull, key.k1 ^ 0x646f72616e646f6dull,
          key.k0 ^ 0x6c7967656e657261ull, key.k1 ^ 0x7465646279746573ull};
  std::size_t whole = data.size() & ~std::size_t{7};
  for (std::size_t i = 0; i < whole; i += 8) s.absorb(little_endian(data.data() + i, 8));
  std::uint64_t last = std::uint64_t{data.size() & 0xff} << 56;
  last |= little_endian(data.data() + whole, data.size() - whole);
  s.absorb(last);
  s.v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

}  // namespace spindle
