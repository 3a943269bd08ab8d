#pragma once
// The HTTP/1.1 exchange (private to src/client): one request and its response on a connection
// of a target's, given back to the target's idle ones when both ended cleanly.

#include <memory>
#include <string_view>

#include "connections.h"
#include "spindle/client/exchange.h"

namespace spindle::http::detail {

/// An exchange of `head` on `stream` (a new connection, or an idle one of `target`'s when
/// `reused`), holding `permit` (one of max_connections, if any) until it ends. Nothing is
/// written before the first write() or finish().
std::unique_ptr<ClientExchange> start_http1_exchange(
    std::shared_ptr<TargetState> target, Stream stream, bool reused, const ClientRequestHead& head,
    std::string_view authority, const ExchangeTimeouts& timeouts, Permit permit);

}  // namespace spindle::http::detail
