// What an idle HTTP/2 connection holds at the server: no read buffer (it goes back to the
// worker's pool once the connection has nothing open and nothing left to read).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "spindle/client/exchange.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/worker.h"
#include "spindle/server/server.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;

namespace {

TEST(Http2Idle, AnIdleConnectionGivesItsReadBufferBackToTheWorker) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  Router router;
  router.get("/hello", [](Request&) { return Response::text("hello"); });
  auto server = HttpServer::start(runtime, Address::loopback_v4(0), std::move(router),
                                  ServerOptions{.http2 = true});
  ASSERT_TRUE(server.has_value());
  constexpr std::size_t kConnections = 10;
  // One pool of upstream connections each: ten HTTP/2 connections to the server (the client
  // reads into buffers of its own, not the worker's).
  std::vector<std::unique_ptr<UpstreamConnections>> clients;
  for (std::size_t i = 0; i < kConnections; ++i) {
    clients.push_back(std::make_unique<UpstreamConnections>(runtime));
  }
  Endpoint endpoint;
  endpoint.address = (*server)->address();
  endpoint.protocol = WireProtocol::kH2c;
  runtime.block_on([&] {
    std::size_t before = Worker::current()->buffers().cached();
    for (auto& client : clients) {
      RequestHead head;
      head.method = "GET";
      head.target = "/hello";
      auto ex = client->open(endpoint, head, "u", {});
      ASSERT_TRUE(ex.has_value());
      auto got = (*ex)->read_head();
      ASSERT_TRUE(got.has_value());
      EXPECT_EQ((*got)->status, 200);
    }
    // The connections stay open, idle, and their buffers are back in the pool (checked within
    // the second before the pool trims what is not taken again): one connection after another
    // took the one the last had given back. Held while idle, each would have taken one of its
    // own and the pool would hold none of them.
    (void)this_fiber::sleep_for(100ms);
    std::size_t after = Worker::current()->buffers().cached();
    EXPECT_GT(after, before);
    EXPECT_LT(after, before + kConnections);
    for (auto& client : clients) EXPECT_EQ(client->open_connections(endpoint), 1u);
  });
  (*server)->drain(Deadline::after(5s));
}

}  // namespace
