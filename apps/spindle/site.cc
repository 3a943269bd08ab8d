#include "site.h"

#include <fmt/format.h>

#include "spindle/handlers/compression.h"
#include "spindle/handlers/static_files.h"

namespace spindle::app {
namespace {

constexpr const char* kWelcomePage = R"(<!DOCTYPE html>
<html>
<head><meta charset="utf-8"><title>Welcome to spindle</title></head>
<body>
<h1>Welcome to spindle</h1>
<p>If you see this page, the spindle web server is working.</p>
<p>Try <a href="/plaintext">/plaintext</a> and <a href="/json">/json</a>.</p>
</body>
</html>
)";

}  // namespace

std::expected<http::Router, std::string> build_site(const proxy::ServerConfig& server,
                                                    http::Middleware proxy) {
  http::Router router;
  // The proxy first: what a route forwards is the upstream's answer, untouched (an upstream
  // compresses its own responses).
  if (proxy) router.use(std::move(proxy));
  if (server.compression) router.use(http::compression());
  if (server.default_site) {
    // /plaintext and /json exactly as the TechEmpower benchmarks define them.
    router.get("/plaintext",
               [](http::Request&) { return http::Response(200, "Hello, World!", "text/plain"); });
    router.get("/json", [](http::Request&) {
      return http::Response(200, R"({"message":"Hello, World!"})", "application/json");
    });
    if (server.root.empty()) {
      router.get("/", [](http::Request&) { return http::Response::html(kWelcomePage); });
    }
  }
  if (!server.root.empty()) {
    auto files =
        http::StaticFiles::open(server.root, http::StaticOptions{.compress = server.compression});
    if (!files)
      return std::unexpected(fmt::format("root {}: {}", server.root, files.error().message()));
    router.get("/*path", [files = std::move(*files)](http::Request& r) { return files(r); });
  }
  return router;
}

}  // namespace spindle::app
