// A complete spindle web application: two routes, a middleware, graceful stop on Ctrl-C.
#include <csignal>

#include "spindle/net/signal_set.h"
#include "spindle/server/server.h"

using namespace spindle;

int main() {
  SignalSet signals{SIGINT, SIGTERM};  // before the runtime: its threads inherit the mask
  Runtime runtime;                     // one worker per core

  http::Router router;
  router.get("/", [](http::Request&) { return http::Response::text("Hello, World!"); });
  router.get("/hello/{name}", [](http::Request& request) {
    return http::Response::text("Hello, " + std::string(request.param("name")) + "!");
  });
  router.use([](http::Request& request, const http::Next& next) {
    http::Response response = next(request);
    response.headers.add(std::string_view("X-Powered-By"), "spindle");
    return response;
  });

  auto server = http::HttpServer::start(runtime, Address::loopback_v4(8081), std::move(router));
  if (!server) return 1;
  (void)runtime.block_on([&] { return signals.wait(); });
  (*server)->drain(Deadline::after(std::chrono::seconds(10)));
}
