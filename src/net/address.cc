#include "spindle/net/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/un.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstring>
#include <optional>

namespace spindle {
namespace {

constexpr std::string_view kUnixPrefix = "unix:";

Result<std::uint16_t> parse_port(std::string_view text) {
  unsigned value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value > 65535) {
    return fail(std::errc::invalid_argument);
  }
  return static_cast<std::uint16_t>(value);
}

Result<Address> parse_unix(std::string_view path) {
  sockaddr_un un{};
  if (path.empty() || path.size() >= sizeof un.sun_path) return fail(std::errc::invalid_argument);
  un.sun_family = AF_UNIX;
  std::memcpy(un.sun_path, path.data(), path.size());
  auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return Address::from_sockaddr(reinterpret_cast<const sockaddr*>(&un), length);
}

}  // namespace

Result<Address> Address::parse(std::string_view text) {
  if (text.starts_with(kUnixPrefix)) return parse_unix(text.substr(kUnixPrefix.size()));
  std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return fail(std::errc::invalid_argument);
  std::string_view host = text.substr(0, colon);
  auto port = parse_port(text.substr(colon + 1));
  if (!port) return fail(port.error());
  // A bare IPv6 host ("::1:80") is ambiguous: require brackets.
  if (host.find(':') != std::string_view::npos && !host.starts_with('[')) {
    return fail(std::errc::invalid_argument);
  }
  return from_host_port(host, *port);
}

Result<Address> Address::from_host_port(std::string_view host, std::uint16_t port) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  char buffer[INET6_ADDRSTRLEN];
  if (host.empty() || host.size() >= sizeof buffer) return fail(std::errc::invalid_argument);
  std::memcpy(buffer, host.data(), host.size());
  buffer[host.size()] = '\0';

  Address address;
  if (host.find(':') == std::string_view::npos) {
    auto* in = reinterpret_cast<sockaddr_in*>(&address.storage_);
    if (::inet_pton(AF_INET, buffer, &in->sin_addr) != 1) return fail(std::errc::invalid_argument);
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    address.length_ = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&address.storage_);
    if (::inet_pton(AF_INET6, buffer, &in6->sin6_addr) != 1) {
      return fail(std::errc::invalid_argument);
    }
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    address.length_ = sizeof(sockaddr_in6);
  }
  return address;
}

Result<Address> Address::parse_host(std::string_view text) {
  std::string_view host = text;
  std::optional<std::string_view> port;
  if (host.starts_with('[')) {
    std::size_t close = host.find(']');
    if (close == std::string_view::npos) return fail(std::errc::invalid_argument);
    std::string_view after = host.substr(close + 1);
    host = host.substr(1, close - 1);
    if (!after.empty()) {
      if (after.front() != ':') return fail(std::errc::invalid_argument);
      port = after.substr(1);
    }
  } else if (std::size_t colon = host.find(':');
             colon != std::string_view::npos &&
             host.find(':', colon + 1) == std::string_view::npos) {
    port = host.substr(colon + 1);  // "192.0.2.1:4711" (an IPv6 address has two colons or more)
    host = host.substr(0, colon);
  }
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (port && (port->empty() || port->size() > 5 || !std::ranges::all_of(*port, digit))) {
    return fail(std::errc::invalid_argument);
  }
  if (host.empty()) return fail(std::errc::invalid_argument);
  auto address = from_host_port(host, 0);
  if (!address) return address;
  return address->unmapped();
}

bool Address::is_v4_mapped() const {
  return storage_.ss_family == AF_INET6 &&
         IN6_IS_ADDR_V4MAPPED(&reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr);
}

Address Address::unmapped() const {
  if (!is_v4_mapped()) return *this;
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage_);
  Address v4;
  auto* in = reinterpret_cast<sockaddr_in*>(&v4.storage_);
  in->sin_family = AF_INET;
  in->sin_port = in6->sin6_port;
  std::memcpy(&in->sin_addr, in6->sin6_addr.s6_addr + 12, 4);
  v4.length_ = sizeof(sockaddr_in);
  return v4;
}

std::string Address::host_text() const {
  char buffer[INET6_ADDRSTRLEN] = {};
  switch (storage_.ss_family) {
    case AF_INET: {
      // Dotted decimal, by hand: inet_ntop formats IPv4 with sprintf (a proxied request asks
      // for its client's address at least once).
      const auto* bytes = reinterpret_cast<const std::uint8_t*>(
          &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr);
      char* p = buffer;
      for (int i = 0; i < 4; ++i) {
        if (i > 0) *p++ = '.';
        p = std::to_chars(p, p + 3, bytes[i]).ptr;  // at most 3 digits: room for all 15
      }
      return std::string(buffer, p);
    }
    case AF_INET6:
      ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, buffer,
                  sizeof buffer);
      return buffer;
    default:
      return to_string();
  }
}

Result<Address> Address::from_sockaddr(const sockaddr* sa, socklen_t length) {
  if (length > static_cast<socklen_t>(sizeof(sockaddr_storage)) ||
      (sa->sa_family != AF_INET && sa->sa_family != AF_INET6 && sa->sa_family != AF_UNIX)) {
    return fail(std::errc::address_family_not_supported);
  }
  Address address;
  std::memcpy(&address.storage_, sa, length);
  address.length_ = length;
  return address;
}

Address Address::loopback_v4(std::uint16_t port) {
  Address address;
  auto* in = reinterpret_cast<sockaddr_in*>(&address.storage_);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  in->sin_port = htons(port);
  address.length_ = sizeof(sockaddr_in);
  return address;
}

Address::Family Address::family() const {
  switch (storage_.ss_family) {
    case AF_INET:
      return Family::kIpv4;
    case AF_INET6:
      return Family::kIpv6;
    default:
      return Family::kUnix;
  }
}

std::uint16_t Address::port() const {
  switch (storage_.ss_family) {
    case AF_INET:
      return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
    case AF_INET6:
      return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
    default:
      return 0;
  }
}

Address Address::with_port(std::uint16_t port) const {
  Address copy = *this;
  if (storage_.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&copy.storage_)->sin_port = htons(port);
  } else if (storage_.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&copy.storage_)->sin6_port = htons(port);
  }
  return copy;
}

std::string_view Address::unix_path() const {
  if (storage_.ss_family != AF_UNIX) return {};
  const auto* un = reinterpret_cast<const sockaddr_un*>(&storage_);
  std::size_t max =
      length_ > offsetof(sockaddr_un, sun_path) ? length_ - offsetof(sockaddr_un, sun_path) : 0;
  return std::string_view(un->sun_path, strnlen(un->sun_path, max));
}

std::string Address::to_string() const {
  switch (storage_.ss_family) {
    case AF_INET:
      return host_text() + ":" + std::to_string(port());
    case AF_INET6:
      return "[" + host_text() + "]:" + std::to_string(port());
    default:
      return std::string(kUnixPrefix) + std::string(unix_path());
  }
}

bool operator==(const Address& a, const Address& b) {
  return a.length_ == b.length_ && std::memcmp(&a.storage_, &b.storage_, a.length_) == 0;
}

}  // namespace spindle
