#pragma once
// The routes a `servers` entry serves: the built-in site and static files.

#include <expected>
#include <string>

#include "spindle/proxy/config.h"
#include "spindle/server/router.h"

namespace spindle::app {

/// The router for one server: `proxy` (if set) for the requests a route takes, then the
/// built-in site (welcome page, /plaintext, /json) if enabled, static files from its root if
/// set. Fails with a message if the root is unusable.
std::expected<http::Router, std::string> build_site(const proxy::ServerConfig& server,
                                                    http::Middleware proxy = {});

}  // namespace spindle::app
