#include "spindle/net/cidr.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>

namespace spindle {
namespace {

// The address bytes of `address` (IPv4: 4, IPv6: 16, an IPv4-mapped IPv6 address: its IPv4
// 4), or 0 for anything else.
std::size_t bytes_of(const Address& address, std::uint8_t* out) {
  const sockaddr* sa = address.data();
  if (sa->sa_family == AF_INET) {
    std::memcpy(out, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
    return 4;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* a6 = &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a6)) {
      std::memcpy(out, a6->s6_addr + 12, 4);
      return 4;
    }
    std::memcpy(out, a6->s6_addr, 16);
    return 16;
  }
  return 0;
}

bool prefix_equal(const std::uint8_t* a, const std::uint8_t* b, unsigned bits) {
  unsigned whole = bits / 8, rest = bits % 8;
  if (std::memcmp(a, b, whole) != 0) return false;
  if (rest == 0) return true;
  auto mask = static_cast<std::uint8_t>(0xff << (8 - rest));
  return (a[whole] & mask) == (b[whole] & mask);
}

}  // namespace

Result<Cidr> Cidr::parse(std::string_view text) {
  Cidr cidr;
  std::string_view host = text;
  std::size_t slash = text.find('/');
  if (slash != std::string_view::npos) host = text.substr(0, slash);
  std::string host_text(host);
  if (::inet_pton(AF_INET, host_text.c_str(), cidr.bytes_.data()) == 1) {
    cidr.v4_ = true;
  } else if (::inet_pton(AF_INET6, host_text.c_str(), cidr.bytes_.data()) == 1) {
    cidr.v4_ = false;
  } else {
    return fail(std::errc::invalid_argument);
  }
  const unsigned max_bits = cidr.v4_ ? 32 : 128;
  cidr.bits_ = max_bits;
  if (slash != std::string_view::npos) {
    std::string_view digits = text.substr(slash + 1);
    unsigned bits = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), bits);
    if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size() ||
        bits > max_bits) {
      return fail(std::errc::invalid_argument);
    }
    cidr.bits_ = bits;
  }
  // Host bits below the prefix must be zero.
  std::array<std::uint8_t, 16> masked = cidr.bytes_;
  for (unsigned bit = cidr.bits_; bit < max_bits; ++bit) {
    masked[bit / 8] &= static_cast<std::uint8_t>(~(0x80 >> (bit % 8)));
  }
  if (masked != cidr.bytes_) return fail(std::errc::invalid_argument);
  return cidr;
}

bool Cidr::contains(const Address& address) const {
  std::uint8_t bytes[16];
  std::size_t n = bytes_of(address, bytes);
  if (n != (v4_ ? 4u : 16u)) return false;
  return prefix_equal(bytes, bytes_.data(), bits_);
}

std::string Cidr::to_string() const {
  char text[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(v4_ ? AF_INET : AF_INET6, bytes_.data(), text, sizeof text);
  return fmt::format("{}/{}", text, bits_);
}

}  // namespace spindle
