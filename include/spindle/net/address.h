#pragma once
/// Address: an IPv4, IPv6 or Unix-domain socket address, parsed from and formatted to text.

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "spindle/base/error.h"

namespace spindle {

/// A socket address. A value type; copying it copies a sockaddr_storage.
class Address {
 public:
  /// The address family.
  enum class Family { kIpv4, kIpv6, kUnix };

  /// Parses "1.2.3.4:80", "[::1]:8080" or "unix:/path/to.sock". Host names are not resolved
  /// (see Resolver). Fails with std::errc::invalid_argument on anything else: a missing or
  /// non-numeric port, a port above 65535, an IPv6 host without brackets, an empty or over-long
  /// Unix path.
  [[nodiscard]] static Result<Address> parse(std::string_view text);
  /// Parses a numeric host ("1.2.3.4" or "::1", brackets optional) with a separate port.
  [[nodiscard]] static Result<Address> from_host_port(std::string_view host, std::uint16_t port);
  /// Parses a host as forwarding fields write one (X-Forwarded-For): "192.0.2.1",
  /// "192.0.2.1:4711", "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:443". The port is
  /// dropped (0) and an IPv4-mapped IPv6 address (::ffff:192.0.2.1) becomes the IPv4 one, so
  /// that one host is one Address whatever the spelling. Fails with
  /// std::errc::invalid_argument on anything else ("unknown", a name, garbage).
  [[nodiscard]] static Result<Address> parse_host(std::string_view text);
  /// Copies a kernel-provided address. Fails with std::errc::address_family_not_supported.
  [[nodiscard]] static Result<Address> from_sockaddr(const sockaddr* sa, socklen_t length);
  /// 127.0.0.1:`port`.
  static Address loopback_v4(std::uint16_t port);

  /// The family.
  Family family() const;
  /// The port (0 for Unix addresses).
  std::uint16_t port() const;
  /// The same address with another port (IP families only).
  Address with_port(std::uint16_t port) const;
  /// The Unix socket path (empty for IP families).
  std::string_view unix_path() const;

  /// Text that parse() accepts: "1.2.3.4:80", "[::1]:80", "unix:/path".
  std::string to_string() const;
  /// The host alone, canonical (RFC 5952 for IPv6): "192.0.2.1", "2001:db8::1", or for a Unix
  /// address its to_string().
  std::string host_text() const;
  /// True for an IPv4-mapped IPv6 address (::ffff:a.b.c.d).
  bool is_v4_mapped() const;
  /// The same host without its IPv6 wrapping if it is an IPv4-mapped address, else a copy.
  Address unmapped() const;

  /// For the socket calls.
  const sockaddr* data() const { return reinterpret_cast<const sockaddr*>(&storage_); }
  /// For the socket calls.
  socklen_t size() const { return length_; }
  /// The socket domain (AF_INET, AF_INET6, AF_UNIX).
  int domain() const { return storage_.ss_family; }

  friend bool operator==(const Address& a, const Address& b);

 private:
  Address() = default;

  /// The raw address.
  sockaddr_storage storage_{};
  /// Meaningful bytes of storage_.
  socklen_t length_ = 0;
};

}  // namespace spindle
