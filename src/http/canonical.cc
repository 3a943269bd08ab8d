#include "spindle/http/canonical.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "spindle/http/rules.h"

namespace spindle::http {
namespace {

// RFC 9110 §9.3's methods, and PATCH (RFC 5789).
constexpr std::array<std::string_view, 9> kStandardMethods = {
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"};

// The longest name the token table knows: longer names need no look there.
constexpr std::size_t kLongestKnownName = [] {
  std::size_t longest = 0;
  for (const Token& t : detail::kTokens) longest = std::max(longest, t.name.size());
  return longest;
}();
// Which singleton fields a request has shown, one bit per token.
static_assert(std::size(detail::kTokens) <= 128, "a token's bit must fit two words");

bool has_lower_case(std::string_view s) {
  return std::ranges::any_of(s, [](char c) { return c >= 'a' && c <= 'z'; });
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool is_host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '-' || c == '.' ||
         c == '_';
}

bool is_hex_digit(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// 1 to 5 digits, 1 to 65535 (port 0 names no service: nothing listens there).
bool is_port(std::string_view port) {
  if (port.empty() || port.size() > 5 || !std::ranges::all_of(port, is_digit)) return false;
  unsigned value = 0;
  for (char c : port) value = value * 10 + static_cast<unsigned>(c - '0');
  return value >= 1 && value <= 65535;
}

// "[" IPv6 "]": hex digits, ':' and '.' (an embedded IPv4), with a ':' among them.
bool is_ip_literal(std::string_view s) {
  std::string_view inside = s.substr(1, s.size() - 2);
  return s.size() > 3 && s.front() == '[' && s.back() == ']' &&
         inside.find(':') != std::string_view::npos && std::ranges::all_of(inside, [](char c) {
           return is_hex_digit(c) || c == ':' || c == '.';
         });
}

// True if `name` (with a '_') is a name the token table knows with '-' for its '_'.
bool spells_a_known_name(std::string_view name) {
  if (name.size() > kLongestKnownName) return false;
  std::array<char, kLongestKnownName> dashed;
  std::ranges::replace_copy(name, dashed.begin(), '_', '-');
  return find_token({dashed.data(), name.size()}) != nullptr;
}

// The authority of an absolute-form target ("http://h:1/p?q"), and the origin-form rest, made
// in place: a target with no path ("http://h?q") gets "/", written where the authority was,
// the authority moved back over the last '/' of "://".
std::optional<BadRequest> take_absolute_form(char* target, std::size_t size,
                                             std::string_view& authority,
                                             std::string_view& origin) {
  std::string_view whole(target, size);
  const std::size_t scheme_end = whole.find("://");
  std::string_view scheme = whole.substr(0, scheme_end);
  if (!iequals(scheme, "http") && !iequals(scheme, "https")) {
    return BadRequest{"absolute-form target of a scheme other than http and https"};
  }
  const std::size_t at = scheme_end + 3;
  const std::size_t end = std::min(whole.find_first_of("/?#", at), size);
  authority = whole.substr(at, end - at);
  if (authority.empty()) return BadRequest{"absolute-form target without an authority"};
  if (end < size && whole[end] == '#') return BadRequest{"fragment in request target"};
  if (end < size && whole[end] == '/') {
    origin = whole.substr(end);
    return std::nullopt;
  }
  std::memmove(target + at - 1, target + at, authority.size());
  target[end - 1] = '/';
  authority = std::string_view(target + at - 1, authority.size());
  origin = std::string_view(target + end - 1, size - end + 1);
  return std::nullopt;
}

// Normalises the origin-form target at [begin, begin + size) (target.h) into head.target.
std::optional<BadRequest> normalise_into(RequestHead& head, char* begin, std::size_t size,
                                         const PathRules& paths) {
  auto normal = normalize_target(begin, size, paths);
  if (!normal) return BadRequest{normal.error().reason};
  head.target = std::string_view(begin, *normal);
  return std::nullopt;
}

// Step 2: the target in its canonical form, and the authority it names ("" if none).
std::optional<BadRequest> canonical_target(RequestHead& head, char* target, const PathRules& paths,
                                           std::string_view& named) {
  std::string_view t(target, head.target.size());
  if (t.empty()) return BadRequest{"empty request target"};
  if (head.method == "CONNECT" && head.protocol.empty()) {
    if (t.front() == '/' || t.find("://") != std::string_view::npos) {
      return BadRequest{"CONNECT names host:port"};
    }
    named = t;
    return std::nullopt;
  }
  if (t.front() == '/') return normalise_into(head, target, t.size(), paths);
  if (t == "*") {
    if (head.method == "OPTIONS") return std::nullopt;
    return BadRequest{"'*' is a target of OPTIONS only"};
  }
  if (t.find("://") == std::string_view::npos) return BadRequest{"invalid request target"};
  std::string_view origin;
  if (auto bad = take_absolute_form(target, t.size(), named, origin)) return bad;
  return normalise_into(head, target + (origin.data() - target), origin.size(), paths);
}

// Step 3: the authority, from the target (`named`), :authority (head.authority) or Host; one
// Host field that says the same.
std::optional<BadRequest> canonical_authority(RequestHead& head, std::string_view named) {
  std::optional<std::string_view> host;
  for (const Field& f : head.headers) {
    if (f.token != &token::kHost) continue;
    if (host) return BadRequest{"more than one Host"};
    host = f.value;
  }
  std::string_view authority = named.empty() ? head.authority : named;
  if (!named.empty() && !head.authority.empty() && !iequals(named, head.authority)) {
    return BadRequest{"the target and :authority name different authorities"};
  }
  const bool given = !named.empty() || !head.authority.empty();
  if (host && !given) authority = *host;
  if (host && given && !iequals(*host, authority)) {
    return BadRequest{"Host names another authority than the request"};
  }
  if (!authority.empty() && !is_authority(authority)) return BadRequest{"invalid authority"};
  head.authority = authority;
  // One Host, saying the authority exactly (it may have differed in case).
  if (host && *host == authority) return std::nullopt;
  if (host) head.headers.erase(token::kHost);
  if (!authority.empty()) head.headers.add_view("host", token::kHost, authority);
  return std::nullopt;
}

// The Cookie fields as one, their pairs joined with "; ".
void join_cookies(HeaderMap& headers) {
  std::string joined;
  for (const Field& f : headers) {
    if (f.token != &token::kCookie || f.value.empty()) continue;
    if (!joined.empty()) joined += "; ";
    joined += f.value;
  }
  headers.erase(token::kCookie);
  headers.add_with_static_name("cookie", token::kCookie, joined);
}

// Step 4: singletons once, no '_' spelling of a known name, one Cookie field.
std::optional<BadRequest> canonical_fields(HeaderMap& headers) {
  std::array<std::uint64_t, 2> seen{};
  std::size_t cookies = 0;
  for (const Field& f : headers) {
    if (f.token == nullptr) {
      if (f.name.find('_') != std::string_view::npos && spells_a_known_name(f.name)) {
        return BadRequest{"a field name spelt with '_' for a field spindle knows with '-'"};
      }
      continue;
    }
    cookies += f.token == &token::kCookie ? 1 : 0;
    if ((f.token->flags & field_flag::kSingleton) == 0) continue;
    const auto index = static_cast<std::size_t>(f.token - detail::kTokens);
    const std::uint64_t bit = std::uint64_t{1} << (index % 64);
    if ((seen[index / 64] & bit) != 0)
      return BadRequest{"a field that may appear once is repeated"};
    seen[index / 64] |= bit;
  }
  if (cookies > 1) join_cookies(headers);
  return std::nullopt;
}

}  // namespace

std::optional<std::string_view> canonical_method(std::string_view method) {
  if (!has_lower_case(method)) return method;
  for (std::string_view standard : kStandardMethods) {
    if (iequals(standard, method)) return standard;
  }
  return std::nullopt;
}

bool is_authority(std::string_view authority) {
  std::string_view host = authority;
  std::optional<std::string_view> port;
  if (authority.starts_with('[')) {
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) return false;
    host = authority.substr(0, close + 1);
    std::string_view rest = authority.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return false;
    if (!rest.empty()) port = rest.substr(1);
    if (!is_ip_literal(host)) return false;
  } else {
    const std::size_t colon = authority.find(':');
    if (colon != std::string_view::npos) port = authority.substr(colon + 1);
    host = authority.substr(0, colon);
    if (host.empty() || !std::ranges::all_of(host, is_host_char)) return false;
  }
  return !port || is_port(*port);
}

bool names_same_field(std::string_view name, std::string_view known) {
  if (name.size() != known.size()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    if (c == '_') c = '-';
    if (c != known[i]) return false;
  }
  return true;
}

std::optional<BadRequest> canonicalize_request(RequestHead& head, char* target,
                                               const PathRules& paths) {
  auto method = canonical_method(head.method);
  if (!method) return BadRequest{"a method of no standard spelt in lower case"};
  head.method = *method;
  std::string_view named;
  if (auto bad = canonical_target(head, target, paths, named)) return bad;
  if (auto bad = canonical_authority(head, named)) return bad;
  return canonical_fields(head.headers);
}

}  // namespace spindle::http
