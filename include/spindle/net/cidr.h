#pragma once
/// Cidr: an IPv4 or IPv6 network ("10.0.0.0/8", "::1/128", or one address, a /32 or /128),
/// for trusted-proxy and allow/deny lists. An IPv4-mapped IPv6 peer (::ffff:a.b.c.d) matches
/// the IPv4 networks.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "spindle/base/error.h"
#include "spindle/net/address.h"

namespace spindle {

class Cidr {
 public:
  /// Parses "ADDRESS[/BITS]". Fails with std::errc::invalid_argument for a malformed address,
  /// a prefix length beyond the family's, or host bits set below the prefix ("10.0.0.1/8"
  /// is refused: it is almost always a typo for a host or for 10.0.0.0/8).
  [[nodiscard]] static Result<Cidr> parse(std::string_view text);

  /// True if `address` (IPv4 or IPv6; never a Unix socket) lies in the network.
  bool contains(const Address& address) const;

  /// "10.0.0.0/8".
  std::string to_string() const;

 private:
  /// The network's bytes (IPv4 in the first 4).
  std::array<std::uint8_t, 16> bytes_{};
  /// Prefix length.
  unsigned bits_ = 0;
  /// True for IPv4.
  bool v4_ = true;
};

}  // namespace spindle
