// What an idle HTTP/2 connection holds at the server, and how it wakes. Idle (no stream open,
// nothing to read or write), a connection keeps its session (settings, windows, HPACK tables)
// and nothing else: no fiber, no stack, no read buffer. It waits in the reactor as an idle
// HTTP/1 connection does; bytes, its keep-alive timeout or the server draining run it again.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "spindle/client/exchange.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/worker.h"
#include "spindle/server/server.h"
#include "testing/http_testing.h"
#include "testing/raw_h2.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;
using spindle::testing::RawH2;

namespace {

Router hello_router() {
  Router router;
  router.get("/hello", [](Request&) { return Response::text("hello"); });
  router.get("/slow", [](Request&) {
    (void)this_fiber::sleep_for(300ms);
    return Response::text("slow");
  });
  return router;
}

// Waits up to a second for the worker's live fibers to be `n`.
bool live_fibers_become(std::size_t n) {
  for (int i = 0; i < 100 && Worker::current()->live_fibers() != n; ++i) {
    (void)this_fiber::sleep_for(10ms);
  }
  return Worker::current()->live_fibers() == n;
}

TEST(Http2Idle, AnIdleConnectionGivesItsReadBufferBackToTheWorker) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server =
      spindle::testing::start_http_server(runtime, hello_router(), ServerOptions{.http2 = true});
  ASSERT_NE(server, nullptr);
  constexpr std::size_t kConnections = 10;
  // One pool of upstream connections each: ten HTTP/2 connections to the server (the client
  // reads into buffers of its own, not the worker's).
  std::vector<std::unique_ptr<UpstreamConnections>> clients;
  for (std::size_t i = 0; i < kConnections; ++i) {
    clients.push_back(std::make_unique<UpstreamConnections>(runtime));
  }
  Endpoint endpoint;
  endpoint.address = server->address();
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
  server->drain(Deadline::after(5s));
}

TEST(Http2Idle, AnIdleConnectionKeepsNoFiberAndItsHpackTablesAcrossWakes) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server =
      spindle::testing::start_http_server(runtime, hello_router(), ServerOptions{.http2 = true});
  ASSERT_NE(server, nullptr);
  runtime.block_on([&] {
    const std::size_t before = Worker::current()->live_fibers();
    constexpr std::size_t kConnections = 10;
    std::vector<RawH2> clients;
    std::vector<std::size_t> first_block;
    for (std::size_t i = 0; i < kConnections; ++i) {
      auto c = RawH2::connect(server->address());
      ASSERT_TRUE(c.has_value());
      first_block.push_back(c->get(1, "/hello"));
      auto r = c->response(1);
      EXPECT_EQ(r.status, 200);
      EXPECT_EQ(r.body, "hello");
      clients.push_back(std::move(*c));
    }
    // Ten connections open and idle: not one fiber more than before they came (a reader and a
    // writer each, before idle connections were parked).
    EXPECT_TRUE(live_fibers_become(before))
        << Worker::current()->live_fibers() << " fibers, " << before << " before the connections";
    EXPECT_EQ(server->connections(), kConnections);
    // Woken by their next request, each answers it, twice; the request's fields refer to the
    // entries the first one put in the server's table, and the answers to the entries the
    // server's encoder made (each side decodes what the other's table says).
    for (std::uint32_t id : {3u, 5u}) {
      for (std::size_t i = 0; i < kConnections; ++i) {
        std::size_t block = clients[i].get(id, "/hello");
        EXPECT_LT(block * 3, first_block[i]);
        auto r = clients[i].response(id);
        EXPECT_EQ(r.status, 200);
        EXPECT_EQ(r.body, "hello");
      }
      EXPECT_TRUE(live_fibers_become(before))
          << Worker::current()->live_fibers() << " fibers, " << before << " before";
    }
  });
  EXPECT_TRUE(server->drain(Deadline::after(5s)));
}

TEST(Http2Idle, TheKeepAliveTimeoutEndsAnIdleConnectionWithGoaway) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = spindle::testing::start_http_server(
      runtime, hello_router(), ServerOptions{.keepalive_timeout = 200ms, .http2 = true});
  ASSERT_NE(server, nullptr);
  runtime.block_on([&] {
    auto c = RawH2::connect(server->address());
    ASSERT_TRUE(c.has_value());
    c->get(1, "/hello");
    EXPECT_EQ(c->response(1).status, 200);
    auto started = Clock::now();
    std::optional<RawH2::Received> goaway;
    while (auto f = c->next(3s)) {
      if (f->kind() == h2::FrameType::kGoaway) goaway = std::move(f);
    }
    ASSERT_TRUE(goaway.has_value()) << "the connection ended without GOAWAY";
    EXPECT_EQ(goaway->error_code, static_cast<std::uint32_t>(h2::ErrorCode::kNoError));
    EXPECT_EQ(goaway->other_stream, 1u);  // stream 1 was processed
    EXPECT_GE(Clock::now() - started, 150ms);
    EXPECT_LT(Clock::now() - started, 2500ms);  // then it closed (next() saw the end)
    for (int i = 0; i < 100 && server->connections() != 0; ++i) {
      (void)this_fiber::sleep_for(10ms);
    }
    EXPECT_EQ(server->connections(), 0u);
  });
  EXPECT_TRUE(server->drain(Deadline::after(5s)));
}

TEST(Http2Idle, DrainingWakesAnIdleConnectionToSayGoaway) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server =
      spindle::testing::start_http_server(runtime, hello_router(), ServerOptions{.http2 = true});
  ASSERT_NE(server, nullptr);
  std::atomic<bool> drained{false};
  std::thread drainer;
  runtime.block_on([&] {
    auto c = RawH2::connect(server->address());
    ASSERT_TRUE(c.has_value());
    c->get(1, "/hello");
    EXPECT_EQ(c->response(1).status, 200);
    (void)this_fiber::sleep_for(50ms);  // idle: parked
    drainer = std::thread([&] { drained = server->drain(Deadline::after(5s)); });
    // The notice (a GOAWAY refusing nothing yet, and a PING, answered by next()), then the
    // final GOAWAY naming stream 1, then the end.
    std::vector<std::uint32_t> goaways;
    bool pinged = false;
    while (auto f = c->next(3s)) {
      if (f->kind() == h2::FrameType::kGoaway) goaways.push_back(f->other_stream);
      if (f->kind() == h2::FrameType::kPing && (f->flags & h2::flag::kAck) == 0) {
        pinged = true;
        std::string ack;
        h2::write::ping(ack,
                        std::span<const std::uint8_t, 8>(
                            reinterpret_cast<const std::uint8_t*>(f->payload.data()), 8),
                        true);
        EXPECT_TRUE(c->send(ack));
      }
    }
    EXPECT_TRUE(pinged);
    ASSERT_EQ(goaways.size(), 2u);
    EXPECT_EQ(goaways[0], h2::kMaxWindow);
    EXPECT_EQ(goaways[1], 1u);
  });
  drainer.join();
  EXPECT_TRUE(drained);
}

TEST(Http2Idle, NoFiberToWakeAnIdleConnectionGetsItAGoawayNamingWhatWasDone) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server =
      spindle::testing::start_http_server(runtime, hello_router(), ServerOptions{.http2 = true});
  ASSERT_NE(server, nullptr);
  runtime.block_on([&] {
    auto c = RawH2::connect(server->address());
    ASSERT_TRUE(c.has_value());
    c->get(1, "/hello");
    EXPECT_EQ(c->response(1).status, 200);
    (void)this_fiber::sleep_for(50ms);  // idle: parked
    // Its next request finds no fiber to run it (the runner cannot start): the client is told
    // that nothing after stream 1 was processed, so it may send stream 3 again elsewhere.
    Worker::current()->stacks().fail_next_allocations(1);
    c->get(3, "/hello");
    std::optional<RawH2::Received> goaway;
    while (auto f = c->next(3s)) {
      EXPECT_NE(f->stream_id, 3u) << "stream 3 was answered";
      if (f->kind() == h2::FrameType::kGoaway) goaway = std::move(f);
    }
    ASSERT_TRUE(goaway.has_value());
    EXPECT_EQ(goaway->other_stream, 1u);
    EXPECT_EQ(goaway->error_code, static_cast<std::uint32_t>(h2::ErrorCode::kInternalError));
    // The worker goes on.
    auto again = RawH2::connect(server->address());
    ASSERT_TRUE(again.has_value());
    again->get(1, "/hello");
    EXPECT_EQ(again->response(1).body, "hello");
  });
  EXPECT_TRUE(server->drain(Deadline::after(5s)));
}

}  // namespace
