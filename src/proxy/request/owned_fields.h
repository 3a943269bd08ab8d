#pragma once
// The fields a server's routes judge or write (private to src/proxy): a route's match on
// fields, a rate limit's key, the fields jwt and forward_auth write from what they verified,
// those forward_auth sends its service and those a headers middleware edits. A request may have
// such a field once, and only in the spelling the configuration gives it: a second one, or a
// spelling with '_' (which CGI, WSGI and PHP read as the same field), would let the upstream
// read a value the gateway never judged. (The fields every gateway owns are the token
// table's: http/canonical.h refuses their other spellings for every request.)

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "spindle/http/header_map.h"
#include "spindle/proxy/route_table.h"

namespace spindle::proxy::detail {

/// The fields the routes of `routes` judge or write, each once.
std::vector<OwnedField> owned_fields(const RouteTable& routes);

/// Why `headers` are ambiguous about one of `owned` (a second field of its name, or a field
/// spelt otherwise), if they are: the request is then refused (400).
std::optional<std::string_view> ambiguous_owned_field(const http::HeaderMap& headers,
                                                      const std::vector<OwnedField>& owned);

}  // namespace spindle::proxy::detail
