// Serves "installed" on 127.0.0.1 (a free port, printed), for one request, then exits.
#include <cstdio>

#include "spindle/server/server.h"
#include "spindle/sync/event.h"

using namespace spindle;

int main() {
  Runtime runtime;
  Event served;
  http::Router router;
  router.get("/", [&](http::Request&) {
    served.set();
    return http::Response::text("installed");
  });
  auto server = http::HttpServer::start(runtime, Address::loopback_v4(0), std::move(router));
  if (!server) return 1;
  std::printf("%u\n", static_cast<unsigned>((*server)->address().port()));
  std::fflush(stdout);
  (void)served.wait(Deadline::after(std::chrono::seconds(30)));
  (*server)->drain(Deadline::after(std::chrono::seconds(2)));
  return 0;
}
