#pragma once
/// The origins a `cors` middleware lets in: patterns written in its `origins` list, and the
/// Origin fields they match. Pure: no I/O.
///
/// A pattern is an origin, scheme://host[:port] (http or https; no path, user information,
/// query or fragment), or one whose host is `*.` then a domain: any name with one or more
/// labels in front of the domain ("https://*.example.com" matches https://a.example.com and
/// https://a.b.example.com, never https://example.com, https://evil-example.com or
/// https://example.com.evil.com). Scheme and host match without regard to case; the port
/// matches exactly (none in the pattern: none in the origin, as browsers send the default
/// port).

#include <string>
#include <string_view>

namespace spindle::proxy {

/// Why `pattern` can match no Origin a browser sends, or "" if it is an origin pattern.
std::string origin_pattern_error(std::string_view pattern);

/// True if the Origin field value `origin` is one `pattern` (a valid origin pattern) names.
bool origin_matches(std::string_view pattern, std::string_view origin);

}  // namespace spindle::proxy
