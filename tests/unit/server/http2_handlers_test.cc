// How an HTTP/2 connection runs its streams' handlers: on the connection's handler fibers, one
// after another, with another fiber started whenever a handler parks while more wait, so that
// a handler that parks holds up no other stream and a batch that does not park costs one fiber,
// not one each.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/server/server.h"
#include "testing/http_testing.h"
#include "testing/raw_h2.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;
using spindle::testing::RawH2;

namespace {

TEST(Http2Handlers, HandlersThatDoNotParkShareTheirFibers) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  std::set<FiberId> fibers;
  FiberId probe = 0;
  Router router;
  router.get("/which", [&](Request&) {
    fibers.insert(this_fiber::id());
    return Response::text("ok");
  });
  auto server =
      spindle::testing::start_http_server(runtime, std::move(router), ServerOptions{.http2 = true});
  ASSERT_NE(server, nullptr);
  runtime.block_on([&] {
    auto c = RawH2::connect(server->address());
    ASSERT_TRUE(c.has_value());
    // Twenty requests in one write: one read, twenty handlers due at once.
    std::string batch;
    for (std::uint32_t id = 1; id <= 39; id += 2) c->get(id, "/which", &batch);
    ASSERT_TRUE(c->send(batch));
    for (std::uint32_t id = 1; id <= 39; id += 2) EXPECT_EQ(c->response(id).body, "ok") << id;
    // Fiber ids count up on a worker: a fiber started now gets the next one after the handler
    // fiber's, if no other fiber was started to stand by.
    probe = spawn([] { return this_fiber::id(); }).join();
  });
  // One fiber ran them all: none parked, so no other was started.
  ASSERT_EQ(fibers.size(), 1u);
  EXPECT_EQ(probe, *fibers.begin() + 1);
  EXPECT_TRUE(server->drain(Deadline::after(5s)));
}

TEST(Http2Handlers, AHandlerThatParksHoldsUpNoOtherStream) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  Router router;
  router.get("/slow", [](Request&) {
    (void)this_fiber::sleep_for(500ms);
    return Response::text("slow");
  });
  router.get("/fast", [](Request&) { return Response::text("fast"); });
  auto server =
      spindle::testing::start_http_server(runtime, std::move(router), ServerOptions{.http2 = true});
  ASSERT_NE(server, nullptr);
  runtime.block_on([&] {
    auto c = RawH2::connect(server->address());
    ASSERT_TRUE(c.has_value());
    // Slow and fast ones in one batch, then a slow one and a fast one on their own: each fast
    // one is answered while every slow handler before it sleeps (no frame of a slow stream has
    // come when the fast one's answer is complete).
    auto slow_answered = [&] {
      for (const auto& f : c->others) {
        if (f.stream_id == 1 || f.stream_id == 5 || f.stream_id == 9) return true;
      }
      return false;
    };
    c->get(1, "/slow");
    c->get(3, "/fast");
    c->get(5, "/slow");
    c->get(7, "/fast");
    EXPECT_EQ(c->response(3).body, "fast");
    EXPECT_EQ(c->response(7).body, "fast");
    EXPECT_FALSE(slow_answered());
    c->get(9, "/slow");
    (void)this_fiber::sleep_for(50ms);  // its handler parked: the next one comes on its own
    c->get(11, "/fast");
    EXPECT_EQ(c->response(11).body, "fast");
    EXPECT_FALSE(slow_answered());
    for (std::uint32_t id : {1u, 5u, 9u}) EXPECT_EQ(c->response(id).body, "slow") << id;
  });
  EXPECT_TRUE(server->drain(Deadline::after(5s)));
}

}  // namespace
