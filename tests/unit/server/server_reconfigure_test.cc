// HttpServer::reconfigure: a new router and options on the same listening socket. New
// connections get the new ones; connections open at the switch keep the old ones and end as
// in a drain (idle: closed; busy: their request answered with Connection: close).
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/server/server.h"
#include "testing/http_testing.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;
using spindle::testing::read_response;

namespace {

// A router whose every answer says `version`; /slow answers after 300 ms.
Router versioned(std::string version) {
  Router router;
  router.get("/which", [version](Request&) { return Response::text(version); });
  router.get("/slow", [version](Request&) {
    (void)this_fiber::sleep_for(300ms);
    return Response::text(version);
  });
  return router;
}

// One GET on `stream` (which stays open), the raw response back.
std::string get(TcpStream& stream, std::string_view path) {
  std::string request = "GET " + std::string(path) + " HTTP/1.1\r\nHost: x\r\n\r\n";
  if (!stream.write_all(request, Deadline::after(2s))) return "";
  return read_response(stream, 2s);
}

// A GET /slow on a new connection, from a fiber of worker 0 (still running on return).
JoinHandle<std::string> slow_request(Runtime& runtime, Address address) {
  return spawn_on(runtime.worker(0), [address] {
    auto b = TcpStream::connect(address, Deadline::after(5s));
    if (!b) return std::string();
    return get(*b, "/slow");
  });
}

bool ends_with_body(const std::string& response, std::string_view body) {
  return response.ends_with("\r\n\r\n" + std::string(body));
}

}  // namespace

TEST(ServerReconfigure, NewConnectionsGetTheNewRouterWhileOpenOnesFinishOnTheOld) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  auto server = spindle::testing::start_http_server(runtime, versioned("one"));
  ASSERT_TRUE(server);
  // An idle keep-alive connection, and one whose request is in flight at the switch.
  std::optional<TcpStream> idle;
  runtime.block_on([&] {
    auto a = TcpStream::connect(server->address(), Deadline::after(5s));
    ASSERT_TRUE(a.has_value());
    EXPECT_TRUE(ends_with_body(get(*a, "/which"), "one"));
    idle = std::move(*a);
  });
  auto busy = slow_request(runtime, server->address());
  std::this_thread::sleep_for(100ms);
  server->reconfigure(versioned("two"), ServerOptions{});

  std::string slow = busy.join();
  EXPECT_TRUE(ends_with_body(slow, "one")) << slow;
  EXPECT_NE(slow.find("Connection: close"), std::string::npos) << slow;
  runtime.block_on([&] {
    // The connection idle at the switch is not closed under its client (which may be sending
    // at that moment): its next request is answered by the old router, with Connection: close.
    std::string last = get(*idle, "/which");
    EXPECT_TRUE(ends_with_body(last, "one")) << last;
    EXPECT_NE(last.find("Connection: close"), std::string::npos) << last;
    char byte;
    auto n = idle->read({&byte, 1}, Deadline::after(2s));
    EXPECT_TRUE(n.has_value() && *n == 0) << "the old router's connection stayed open";
    idle.reset();
    // A new connection is served by the new router, and kept alive.
    auto c = TcpStream::connect(server->address(), Deadline::after(5s));
    ASSERT_TRUE(c.has_value());
    for (int i = 0; i < 2; ++i) {
      std::string got = get(*c, "/which");
      EXPECT_TRUE(ends_with_body(got, "two")) << got;
      EXPECT_EQ(got.find("Connection: close"), std::string::npos) << got;
    }
  });
  EXPECT_TRUE(server->drain(Deadline::after(2s)));
  EXPECT_EQ(server->connections(), 0u);
}

TEST(ServerReconfigure, DrainWaitsForConnectionsOfEarlierConfigurations) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = spindle::testing::start_http_server(runtime, versioned("one"));
  ASSERT_TRUE(server);
  auto busy = slow_request(runtime, server->address());
  std::this_thread::sleep_for(100ms);
  server->reconfigure(versioned("two"), ServerOptions{});
  EXPECT_EQ(server->connections(), 1u);  // the old configuration's request, still running
  EXPECT_TRUE(server->drain(Deadline::after(2s)));
  EXPECT_EQ(server->connections(), 0u);
  EXPECT_TRUE(ends_with_body(busy.join(), "one"));
}
