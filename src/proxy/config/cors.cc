// The origin patterns of `cors` (cors.h).
#include "spindle/proxy/cors.h"

#include <algorithm>

#include "spindle/http/canonical.h"
#include "spindle/http/header_map.h"

namespace spindle::proxy {

namespace {

// The length of the scheme and its "://" that `text` starts with (http or https, any case);
// 0 if it starts with neither.
std::size_t scheme_length(std::string_view text) {
  for (std::string_view scheme : {std::string_view("http://"), std::string_view("https://")}) {
    if (text.size() >= scheme.size() && http::iequals(text.substr(0, scheme.size()), scheme)) {
      return scheme.size();
    }
  }
  return 0;
}

// A letter, digit, '-' or '_': what a label of a host name is made of.
bool is_label_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

// True if `names` is one or more labels joined by single dots (no empty label: no leading,
// trailing or doubled dot).
bool is_labels(std::string_view names) {
  if (names.empty() || names.front() == '.' || names.back() == '.') return false;
  if (names.find("..") != std::string_view::npos) return false;
  return std::ranges::all_of(names, [](char c) { return c == '.' || is_label_char(c); });
}

// The domain[:port] after "*." of a wildcard pattern's authority.
std::string_view host_of(std::string_view authority) {
  return authority.substr(0, authority.find(':'));
}

}  // namespace

std::string origin_pattern_error(std::string_view pattern) {
  std::size_t scheme = scheme_length(pattern);
  if (scheme == 0) return "expected http:// or https:// then host[:port]";
  std::string_view authority = pattern.substr(scheme);
  if (!authority.starts_with("*.")) {
    if (!http::is_authority(authority)) return "expected scheme://host[:port], nothing after it";
    return "";
  }
  std::string_view domain = authority.substr(2);
  if (!http::is_authority(domain) || domain.starts_with('[') || !is_labels(host_of(domain))) {
    return "a wildcard is '*.' then a domain name[:port], as https://*.example.com";
  }
  return "";
}

bool origin_matches(std::string_view pattern, std::string_view origin) {
  std::size_t scheme = scheme_length(pattern);
  std::string_view authority = pattern.substr(scheme);
  if (!authority.starts_with("*.")) return http::iequals(pattern, origin);
  if (origin.size() < scheme || !http::iequals(origin.substr(0, scheme), pattern.substr(0, scheme)))
    return false;
  std::string_view suffix = authority.substr(1);  // ".example.com[:port]"
  std::string_view rest = origin.substr(scheme);
  if (rest.size() <= suffix.size() || !http::is_authority(rest)) return false;
  std::string_view front = rest.substr(0, rest.size() - suffix.size());
  return http::iequals(rest.substr(front.size()), suffix) && is_labels(front);
}

}  // namespace spindle::proxy
