#pragma once
// Reading the gateway sections of the configuration (routes, services, upstreams) and
// checking that they refer to each other (private to src/proxy).

#include "config_reader.h"

namespace spindle::proxy::detail {

/// Reads `routes`, `services` and `upstreams` of the top-level mapping into `config` (whose
/// servers are already read), checking every reference: a route naming a missing service or
/// server, a service naming a missing upstream, an invalid regular expression.
void read_gateway(const ConfigReader& top, Config& config);

/// One entry of a route's `middlewares` list ({NAME: SETTINGS}, at `path`), checked; fails
/// (ConfigError) on an unknown name or a bad setting.
MiddlewareConfig read_middleware(const ConfigReader& list, const YAML::Node& node,
                                 const std::string& path);

/// Splits "HOST:PORT" ("[IPv6]:PORT" for IPv6) into a host (lower case, brackets removed) and
/// a port from 1 to 65535; nullopt if malformed.
std::optional<std::pair<std::string, std::uint16_t>> split_host_port(std::string_view text);

}  // namespace spindle::proxy::detail
