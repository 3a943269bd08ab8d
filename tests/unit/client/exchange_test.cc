#include "spindle/client/exchange.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/worker.h"
#include "spindle/net/tcp_server.h"
#include "spindle/net/tls.h"
#include "spindle/server/server.h"
#include "spindle/sync/event.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;

namespace {

// An FNV-1a hash, to compare large bodies without keeping them.
std::uint64_t fnv(std::string_view data, std::uint64_t h = 14695981039346656037ull) {
  for (unsigned char c : data) h = (h ^ c) * 1099511628211ull;
  return h;
}

// A spindle server with routes that stream: /digest reads the body piece by piece and answers
// its size and hash; /bytes?N streams N bytes of a pattern; /slow answers after 1 s.
std::unique_ptr<HttpServer> start_upstream(Runtime& runtime) {
  Router router;
  router.post("/digest", [](Request& r) {
    std::uint64_t size = 0, hash = fnv("");
    std::string piece(7000, '\0');
    while (std::size_t n = r.read(piece)) {
      size += n;
      hash = fnv(std::string_view(piece).substr(0, n), hash);
    }
    return Response::text(std::to_string(size) + " " + std::to_string(hash));
  });
  router.get("/bytes", [](Request& r) {
    std::uint64_t n = std::stoull(std::string(r.query()));
    Response response;
    response.stream = [n](BodyWriter& w) {
      std::string piece(10000, 'b');
      for (std::uint64_t sent = 0; sent < n; sent += piece.size()) {
        if (!w.write(std::string_view(piece).substr(
                0, std::min<std::uint64_t>(piece.size(), n - sent)))) {
          return;
        }
      }
    };
    return response;
  });
  router.get("/hello", [](Request&) { return Response::text("hello"); });
  // /fields/N/SIZE: a response with N fields of SIZE bytes each.
  router.get("/fields/{n}/{size}", [](Request& r) {
    Response response = Response::text("fields");
    std::size_t size = std::stoul(std::string(r.param("size")));
    for (int i = 0, n = std::stoi(std::string(r.param("n"))); i < n; ++i) {
      response.headers.add("x-field-" + std::to_string(i), std::string(size, 'v'));
    }
    return response;
  });
  router.get("/slow", [](Request&) {
    (void)this_fiber::sleep_for(1s);
    return Response::text("late");
  });
  ServerOptions options;
  options.http2 = true;
  options.max_body = 64 << 20;
  auto server = HttpServer::start(runtime, Address::loopback_v4(0), std::move(router), options);
  EXPECT_TRUE(server.has_value());
  return std::move(*server);
}

Endpoint endpoint_of(const Address& address, WireProtocol protocol = WireProtocol::kHttp1) {
  Endpoint e;
  e.address = address;
  e.protocol = protocol;
  return e;
}

// A head for `method` `target`, with a body of `length` bytes (or of unknown length).
RequestHead head_for(std::string_view method, std::string_view target,
                     std::optional<std::uint64_t> length = std::nullopt, bool chunked = false) {
  RequestHead head;
  head.method = method;
  head.target = target;
  head.content_length = length;
  head.chunked = chunked;
  return head;
}

// Reads the rest of a response body; its size and hash, or the error that ended it.
Result<std::pair<std::uint64_t, std::uint64_t>> drain(ClientExchange& ex) {
  std::string buffer(16384, '\0');
  std::uint64_t size = 0, hash = fnv("");
  for (;;) {
    auto n = ex.read(buffer);
    if (!n) return fail(n.error());
    if (*n == 0) return std::pair{size, hash};
    size += *n;
    hash = fnv(std::string_view(buffer).substr(0, *n), hash);
  }
}

std::string body_of(ClientExchange& ex) {
  std::string all, buffer(4096, '\0');
  for (;;) {
    auto n = ex.read(buffer);
    if (!n || *n == 0) return all;
    all.append(buffer, 0, *n);
  }
}

// An upstream whose every connection runs `script` on the raw stream.
std::unique_ptr<TcpServer> scripted(Runtime& runtime, std::function<void(TcpStream&)> script) {
  auto server = TcpServer::start(runtime, Address::loopback_v4(0),
                                 [script](TcpStream stream) { script(stream); });
  EXPECT_TRUE(server.has_value());
  return std::move(*server);
}

// Reads one request head (up to the blank line) off `stream`.
std::string read_head(TcpStream& stream) {
  std::string in;
  char c;
  while (!in.ends_with("\r\n\r\n")) {
    auto n = stream.read({&c, 1}, Deadline::after(5s));
    if (!n || *n == 0) return in;
    in += c;
  }
  return in;
}

// Runs `body(pools, server)` in a fiber of a one-worker runtime, with the server `start` makes
// and a pool of upstream connections; drains the server after.
template <typename Start, typename Body>
void with_server(Start start, Body body) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = start(runtime);
  UpstreamConnections pools(runtime);
  runtime.block_on([&] { body(pools, *server); });
  server->drain(Deadline::after(5s));
}

class Exchange : public ::testing::TestWithParam<WireProtocol> {};

// A response head meets the same limits whichever protocol brings it (those of a request head
// at the server: 100 fields, 16 KiB): past them it is malformed, and the next exchange with the
// upstream goes on as before.
TEST_P(Exchange, AResponseHeadPastTheLimitsIsMalformedOnEitherProtocol) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    auto endpoint = endpoint_of(upstream.address(), GetParam());
    auto head_of = [&](std::string target) -> Result<int> {
      auto ex = pools.open(endpoint, head_for("GET", target), "u", {});
      if (!ex) return fail(ex.error());
      auto head = (*ex)->read_head();
      if (!head) return fail(head.error());
      return (*head)->status;
    };
    // Within: the server's own Date, Server, Content-Type and Content-Length come too.
    EXPECT_EQ(head_of("/fields/90/10").value_or(0), 200);
    EXPECT_EQ(head_of("/fields/6/2000").value_or(0), 200);
    auto too_many = head_of("/fields/101/10");
    ASSERT_FALSE(too_many.has_value());
    EXPECT_EQ(too_many.error(), ExchangeErrc::kProtocolError) << too_many.error().message();
    auto too_large = head_of("/fields/9/2000");
    ASSERT_FALSE(too_large.has_value());
    EXPECT_EQ(too_large.error(), ExchangeErrc::kProtocolError) << too_large.error().message();
    EXPECT_EQ(head_of("/hello").value_or(0), 200);
  });
}

TEST_P(Exchange, StreamsALargeBodyEachWayInPiecesAndReusesTheConnection) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    Endpoint endpoint = endpoint_of(upstream.address(), GetParam());
    // 8 MiB up, in 64 KiB pieces of unknown total length (chunked on HTTP/1.1).
    RequestHead up = head_for("POST", "/digest", std::nullopt, true);
    auto ex = pools.open(endpoint, up, "upstream.test", {});
    ASSERT_TRUE(ex.has_value()) << ex.error().message();
    std::string piece(64 * 1024, '\0');
    std::uint64_t hash = fnv("");
    for (int i = 0; i < 128; ++i) {
      std::fill(piece.begin(), piece.end(), static_cast<char>('a' + i % 26));
      hash = fnv(piece, hash);
      ASSERT_TRUE((*ex)->write(piece).has_value());
    }
    ASSERT_TRUE((*ex)->finish().has_value());
    auto head = (*ex)->read_head();
    ASSERT_TRUE(head.has_value()) << head.error().message();
    EXPECT_EQ((*head)->status, 200);
    EXPECT_EQ(body_of(**ex), std::to_string(8u << 20) + " " + std::to_string(hash));
    EXPECT_FALSE((*ex)->reused());
    ex->reset();

    // 8 MiB down, streamed by the upstream, read in pieces on the same connection.
    auto down = pools.open(endpoint, head_for("GET", "/bytes?8388608"), "upstream.test", {});
    ASSERT_TRUE(down.has_value());
    ASSERT_TRUE((*down)->finish().has_value());
    auto got = drain(**down);
    ASSERT_TRUE(got.has_value()) << got.error().message();
    EXPECT_EQ(got->first, 8u << 20);
    EXPECT_EQ(got->second, fnv(std::string(8u << 20, 'b')));
    EXPECT_EQ(pools.open_connections(endpoint), 1u) << "one connection carried both";
  });
}

TEST_P(Exchange, ASizedBodyGoesOutWithItsLength) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    auto ex = pools.open(endpoint_of(upstream.address(), GetParam()),
                         head_for("POST", "/digest", 5), "upstream.test", {});
    ASSERT_TRUE(ex.has_value());
    ASSERT_TRUE((*ex)->write("ab").has_value());
    ASSERT_TRUE((*ex)->write("cde").has_value());
    ASSERT_TRUE((*ex)->finish().has_value());
    ASSERT_TRUE((*ex)->read_head().has_value());
    EXPECT_EQ(body_of(**ex), "5 " + std::to_string(fnv("abcde")));
  });
}

TEST_P(Exchange, NoResponseWithinTheFirstByteTimeoutIsItsOwnError) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    auto ex = pools.open(endpoint_of(upstream.address(), GetParam()), head_for("GET", "/slow"),
                         "upstream.test", ExchangeTimeouts{.first_byte = 200ms});
    ASSERT_TRUE(ex.has_value());
    ASSERT_TRUE((*ex)->finish().has_value());
    auto head = (*ex)->read_head();
    ASSERT_FALSE(head.has_value());
    EXPECT_EQ(head.error(), ExchangeErrc::kFirstByteTimeout);
    EXPECT_EQ(head.error(), std::errc::timed_out) << "and it is a timeout for those who ask";
    EXPECT_FALSE(nothing_reached_upstream(head.error()));
  });
}

TEST_P(Exchange, CancelWakesTheFiberWaitingForTheResponse) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    auto ex = pools.open(endpoint_of(upstream.address(), GetParam()), head_for("GET", "/slow"),
                         "upstream.test", {});
    ASSERT_TRUE(ex.has_value());
    ASSERT_TRUE((*ex)->finish().has_value());
    ClientExchange* exchange = ex->get();
    auto canceller = spawn([exchange] {
      (void)this_fiber::sleep_for(100ms);
      exchange->cancel();
    });
    auto started = Clock::now();
    auto head = exchange->read_head();
    canceller.join();
    ASSERT_FALSE(head.has_value());
    EXPECT_EQ(head.error(), ExchangeErrc::kCancelled);
    EXPECT_LT(Clock::now() - started, 800ms) << "woken by the cancel, not by the answer";
  });
}

INSTANTIATE_TEST_SUITE_P(Protocols, Exchange,
                         ::testing::Values(WireProtocol::kHttp1, WireProtocol::kH2c),
                         [](const auto& info) {
                           return info.param == WireProtocol::kHttp1 ? "Http1" : "H2c";
                         });

TEST(ExchangeErrors, ARefusedConnectionReachedNothing) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    auto ex = pools.open(endpoint_of(Address::loopback_v4(1)), head_for("POST", "/", 3),
                         "upstream.test", {});
    ASSERT_FALSE(ex.has_value());
    EXPECT_EQ(ex.error(), ExchangeErrc::kRefused);
    EXPECT_TRUE(nothing_reached_upstream(ex.error()));
    EXPECT_TRUE(is_connect_failure(ex.error()));
  });
}

TEST(ExchangeErrors, APooledConnectionTheUpstreamClosedIsNotReused) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  std::atomic<int> connections{0};
  // Answers one request per connection, keeps it open a moment, then closes it.
  auto upstream = scripted(runtime, [&](TcpStream& s) {
    ++connections;
    read_head(s);
    (void)s.write_all(std::string_view("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
                      Deadline::after(5s));
    (void)this_fiber::sleep_for(50ms);
  });
  UpstreamConnections pools(runtime);
  Endpoint endpoint = endpoint_of(upstream->address());
  runtime.block_on([&] {
    for (int i = 0; i < 3; ++i) {
      auto ex = pools.open(endpoint, head_for("POST", "/", 1), "upstream.test", {});
      ASSERT_TRUE(ex.has_value());
      EXPECT_FALSE((*ex)->reused()) << "request " << i << " went on a closed connection";
      ASSERT_TRUE((*ex)->write("x").has_value());
      ASSERT_TRUE((*ex)->finish().has_value());
      ASSERT_TRUE((*ex)->read_head().has_value());
      EXPECT_EQ(body_of(**ex), "ok");
      ex->reset();
      EXPECT_EQ(pools.idle(endpoint), 1u);
      (void)this_fiber::sleep_for(150ms);  // the upstream closes it meanwhile
    }
  });
  EXPECT_EQ(connections.load(), 3);
}

TEST(ExchangeErrors, AnIdleConnectionPastItsIdleTimeoutIsClosedNotReused) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    Endpoint endpoint = endpoint_of(upstream.address());
    PoolLimits limits{.idle_timeout = 100ms};
    for (int i = 0; i < 2; ++i) {
      auto ex = pools.open(endpoint, head_for("GET", "/hello"), "u", {}, limits);
      ASSERT_TRUE(ex.has_value());
      EXPECT_EQ((*ex)->reused(), i == 1) << "the second request reuses the first connection";
      ASSERT_TRUE((*ex)->read_head().has_value());
      EXPECT_EQ(body_of(**ex), "hello");
    }
    EXPECT_EQ(pools.idle(endpoint), 1u);
    (void)this_fiber::sleep_for(200ms);
    auto late = pools.open(endpoint, head_for("GET", "/hello"), "u", {}, limits);
    ASSERT_TRUE(late.has_value());
    EXPECT_FALSE((*late)->reused()) << "kept past its idle timeout";
  });
}

// The error read_head gives for a GET to an upstream that runs `script` on each connection
// (it must fail: a test of what the head cannot be).
std::error_code head_error_from(std::function<void(TcpStream&)> script) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto upstream = scripted(runtime, std::move(script));
  UpstreamConnections pools(runtime);
  std::error_code error;
  runtime.block_on([&] {
    auto ex = pools.open(endpoint_of(upstream->address()), head_for("GET", "/"), "u", {});
    ASSERT_TRUE(ex.has_value());
    ASSERT_TRUE((*ex)->finish().has_value());
    auto head = (*ex)->read_head();
    ASSERT_FALSE(head.has_value());
    error = head.error();
  });
  return error;
}

TEST(ExchangeErrors, ACloseAfterTheRequestWentOutMayHaveReachedTheUpstream) {
  // Reads the request, then closes.
  std::error_code error = head_error_from([](TcpStream& s) { read_head(s); });
  EXPECT_EQ(error, ExchangeErrc::kClosedBeforeResponse);
  EXPECT_FALSE(nothing_reached_upstream(error));
}

// A request without a body has its head written by the worker at the end of the round of
// fibers (queue_head). A head larger than the socket takes at once: what the worker's write
// leaves, the exchange writes itself, and the answer comes.
TEST(ExchangeQueuedHead, AHeadTheSocketCannotTakeAtOnceGoesWhole) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  const std::string big(8 << 20, 'v');  // past any socket buffer an unread peer leaves
  std::atomic<std::size_t> got_bytes{0};
  std::atomic<bool> got_whole{false};
  auto upstream = scripted(runtime, [&](TcpStream& s) {
    (void)this_fiber::sleep_for(200ms);  // the client's write fills the socket meanwhile
    std::string in;
    std::string piece(1 << 16, '\0');
    while (!in.ends_with("\r\n\r\n")) {
      auto n = s.read(piece, Deadline::after(10s));
      if (!n || *n == 0) break;
      in.append(piece, 0, *n);
    }
    got_bytes = in.size();
    got_whole = in.starts_with("GET /big HTTP/1.1\r\n") && in.find(big) != std::string::npos;
    (void)s.write_all(std::string_view("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
                      Deadline::after(5s));
  });
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    RequestHead head = head_for("GET", "/big");
    head.headers.add("x-big", big);
    ExchangeTimeouts timeouts{.first_byte = 5s};
    auto ex = pools.open(endpoint_of(upstream->address()), head, "u", timeouts);
    ASSERT_TRUE(ex.has_value());
    ASSERT_TRUE((*ex)->finish().has_value());
    auto answer = (*ex)->read_head();
    ASSERT_TRUE(answer.has_value()) << answer.error().message();
    EXPECT_EQ((*answer)->status, 200);
    EXPECT_EQ(body_of(**ex), "ok");
  });
  EXPECT_TRUE(got_whole.load()) << "the upstream got " << got_bytes.load() << " bytes";
}

// A request finished and let go before its queued head was written still reaches the upstream
// (as it did when finish() wrote it), the connection then closing.
TEST(ExchangeQueuedHead, AFinishedRequestLetGoBeforeTheRoundsEndStillGoesOut) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  std::atomic<bool> got{false};
  Event done;
  auto upstream = scripted(runtime, [&](TcpStream& s) {
    got = read_head(s).starts_with("GET /dropped HTTP/1.1\r\n");
    done.set();
  });
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    auto ex = pools.open(endpoint_of(upstream->address()), head_for("GET", "/dropped"), "u", {});
    ASSERT_TRUE(ex.has_value());
    ASSERT_TRUE((*ex)->finish().has_value());
    ex->reset();  // in the same round: the head was still queued
    EXPECT_FALSE(done.wait(Deadline::after(5s)));
  });
  EXPECT_TRUE(got.load());
}

TEST(ExchangeErrors, ABodyCutShortIsAnErrorNotAShortBody) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto sized = scripted(runtime, [](TcpStream& s) {
    read_head(s);
    (void)s.write_all(std::string_view("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this"),
                      Deadline::after(5s));
  });
  auto chunked = scripted(runtime, [](TcpStream& s) {
    read_head(s);
    (void)s.write_all(
        std::string_view("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"),
        Deadline::after(5s));
  });
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    for (auto* upstream : {sized.get(), chunked.get()}) {
      auto ex = pools.open(endpoint_of(upstream->address()), head_for("GET", "/"), "u", {});
      ASSERT_TRUE(ex.has_value());
      ASSERT_TRUE((*ex)->finish().has_value());
      ASSERT_TRUE((*ex)->read_head().has_value());
      auto got = drain(**ex);
      ASSERT_FALSE(got.has_value());
      EXPECT_EQ(got.error(), ExchangeErrc::kResponseCut);
    }
  });
}

TEST(ExchangeErrors, AMalformedResponseIsAProtocolError) {
  std::error_code error = head_error_from([](TcpStream& s) {
    read_head(s);
    (void)s.write_all(std::string_view("HTTP/1.1 200 OK\r\nBad Field: x\r\n\r\n"),
                      Deadline::after(5s));
    (void)this_fiber::sleep_for(500ms);
  });
  EXPECT_EQ(error, ExchangeErrc::kProtocolError);
}

// On HTTP/1.1 a 101, or any 2xx to CONNECT (a 204 too), and nothing else hands the connection
// over as a tunnel, with the bytes that came after the head (RFC 9110 §15.2.2, §9.3.6); every
// other answer to every method is a response whose connection stays the exchange's.
TEST(ExchangeTunnel, A101OrA2xxToConnectAndNothingElseGivesTheConnection) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto upstream = scripted(runtime, [](TcpStream& s) {
    std::string head = read_head(s);
    std::size_t at = head.find("x-status: ");
    std::string status = at == std::string::npos ? "500" : head.substr(at + 10, 3);
    (void)s.write_all(fmt::format("HTTP/1.1 {} X\r\nContent-Length: 0\r\n\r\nafter", status),
                      Deadline::after(5s));
    (void)this_fiber::sleep_for(300ms);
  });
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    for (std::string_view method : {"GET", "HEAD", "POST", "CONNECT"}) {
      for (int status : {101, 200, 204, 299, 300, 404, 502}) {
        SCOPED_TRACE(fmt::format("{} answered {}", method, status));
        RequestHead head = head_for(method, method == "CONNECT" ? "backend.test:443" : "/");
        head.headers.add("x-status", std::to_string(status));
        auto ex = pools.open(endpoint_of(upstream->address()), head, "u", {});
        ASSERT_TRUE(ex.has_value());
        ASSERT_TRUE((*ex)->finish().has_value());
        auto answer = (*ex)->read_head();
        ASSERT_TRUE(answer.has_value());
        EXPECT_EQ((*answer)->status, status);
        std::string early;
        auto tunnel = (*ex)->take_connection(early);
        bool expected = status == 101 || (method == "CONNECT" && status / 100 == 2);
        ASSERT_EQ(tunnel.has_value(), expected);
        if (!expected) continue;
        while (early.size() < 5) {
          char more[5];
          auto n = tunnel->read(more, Deadline::after(5s));
          if (!n || *n == 0) break;
          early.append(more, *n);
        }
        EXPECT_EQ(early, "after");
      }
    }
  });
}

TEST(ExchangeErrors, AnHttp2StreamTheUpstreamRefusedReachedNothing) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    Endpoint endpoint = endpoint_of(upstream.address(), WireProtocol::kH2c);
    // Opens the connection first, so that the upstream's next stream fails to spawn.
    auto first = pools.open(endpoint, head_for("GET", "/hello"), "u", {});
    ASSERT_TRUE(first.has_value());
    ASSERT_TRUE((*first)->read_head().has_value());
    EXPECT_EQ(body_of(**first), "hello");
    // A slow stream keeps the upstream's connection busy (an idle one has no fiber: waking it
    // would be the spawn that fails, answered by GOAWAY), so its only spawn is the handler's.
    auto busy = pools.open(endpoint, head_for("GET", "/slow"), "u", {});
    ASSERT_TRUE(busy.has_value());
    (void)this_fiber::sleep_for(50ms);
    Worker::current()->stacks().fail_next_allocations(1);
    auto refused = pools.open(endpoint, head_for("GET", "/hello"), "u", {});
    ASSERT_TRUE(refused.has_value());
    auto head = (*refused)->read_head();
    Worker::current()->stacks().fail_next_allocations(0);
    ASSERT_FALSE(head.has_value());
    EXPECT_EQ(head.error(), ExchangeErrc::kRefusedStream);
    EXPECT_TRUE(nothing_reached_upstream(head.error()));
    auto slow = (*busy)->read_head();
    ASSERT_TRUE(slow.has_value());
    EXPECT_EQ((*slow)->status, 200);
  });
}

TEST(ExchangeErrors, AnIdleHttp2UpstreamWithNoFiberToWakeItReachedNothing) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    Endpoint endpoint = endpoint_of(upstream.address(), WireProtocol::kH2c);
    auto first = pools.open(endpoint, head_for("GET", "/hello"), "u", {});
    ASSERT_TRUE(first.has_value());
    ASSERT_TRUE((*first)->read_head().has_value());
    EXPECT_EQ(body_of(**first), "hello");
    (void)this_fiber::sleep_for(50ms);  // the upstream's connection is idle: parked
    // Waking it needs a fiber, which cannot start: the upstream says GOAWAY naming the streams
    // it processed, and the new one is known not to have reached it (a retry is safe).
    Worker::current()->stacks().fail_next_allocations(1);
    auto refused = pools.open(endpoint, head_for("GET", "/hello"), "u", {});
    ASSERT_TRUE(refused.has_value());
    auto head = (*refused)->read_head();
    Worker::current()->stacks().fail_next_allocations(0);
    ASSERT_FALSE(head.has_value());
    EXPECT_EQ(head.error(), ExchangeErrc::kAboveGoaway);
    EXPECT_TRUE(nothing_reached_upstream(head.error()));
  });
}

// 20 fibers each open a stream to an upstream that allows 2 at once on a connection (after a
// first request has told its SETTINGS): what the upstream saw at most at once on one
// connection, the connections the pool made, and that every request was answered.
struct ConcurrencyRun {
  std::size_t most_on_one = 0;
  std::size_t connections = 0;
  std::size_t answered = 0;
  /// After twice the idle timeout (when it is below a second), and one more request.
  std::size_t connections_later = 0;
};
ConcurrencyRun twenty_streams_two_allowed(const PoolLimits& limits, bool tls = false) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  Router router;
  std::map<std::uint16_t, std::size_t> running;  // by the client's port: by connection
  ConcurrencyRun run;
  router.get("/slow", [&](Request& request) {
    std::size_t& here = running[request.context().peer->port()];
    run.most_on_one = std::max(run.most_on_one, ++here);
    (void)this_fiber::sleep_for(20ms);
    --here;
    return Response::text("done");
  });
  ServerOptions options;
  options.http2 = true;
  options.http2_limits.max_concurrent_streams = 2;
  const std::string& certs = spindle::testing::test_cert_dir();
  if (tls) {
    auto ctx = TlsServerContext::create(
        TlsServerOptions{.certificates = {{certs + "/localhost.pem", certs + "/localhost.key", {}}},
                         .alpn = {"h2"}});
    EXPECT_TRUE(ctx.has_value());
    options.tls = *ctx;
  }
  auto upstream = HttpServer::start(runtime, Address::loopback_v4(0), std::move(router), options);
  EXPECT_TRUE(upstream.has_value());
  if (!upstream) return run;
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    Endpoint endpoint =
        endpoint_of((*upstream)->address(), tls ? WireProtocol::kHttp2 : WireProtocol::kH2c);
    if (tls) {
      auto ctx =
          TlsClientContext::create(TlsClientOptions{.ca_file = certs + "/ca.pem", .alpn = {"h2"}});
      ASSERT_TRUE(ctx.has_value());
      endpoint.tls = *ctx;
      endpoint.server_name = "localhost";
    }
    auto warm = pools.open(endpoint, head_for("GET", "/slow"), "u", {}, limits);
    ASSERT_TRUE(warm.has_value());
    EXPECT_EQ(body_of(**warm), "done");
    std::vector<JoinHandle<void>> fibers;
    for (int i = 0; i < 20; ++i) {
      fibers.push_back(spawn([&] {
        auto ex = pools.open(endpoint, head_for("GET", "/slow"), "u", {}, limits);
        if (!ex) return;
        if (auto head = (*ex)->read_head(); head && (*head)->status == 200) {
          if (body_of(**ex) == "done") ++run.answered;
        }
      }));
    }
    for (auto& f : fibers) f.join();
    run.connections = pools.open_connections(endpoint);
    if (limits.idle_timeout < 1s) {
      (void)this_fiber::sleep_for(2 * limits.idle_timeout);
      auto later = pools.open(endpoint, head_for("GET", "/slow"), "u", {}, limits);
      ASSERT_TRUE(later.has_value());
      EXPECT_EQ(body_of(**later), "done");
      run.connections_later = pools.open_connections(endpoint);
    }
  });
  (*upstream)->drain(Deadline::after(5s));
  return run;
}

TEST(ExchangeErrors, StreamsPastTheUpstreamsConcurrencyLimitGoOnAnotherConnection) {
  // Each connection full, another is made (one at a time, each taken to allow the 2 the first
  // learned until its own SETTINGS come): none refused, never more than 2 on one.
  ConcurrencyRun run = twenty_streams_two_allowed({});
  EXPECT_EQ(run.answered, 20u);
  EXPECT_EQ(run.most_on_one, 2u);
  EXPECT_GE(run.connections, 5u);
  EXPECT_LE(run.connections, 11u);
}

TEST(ExchangeErrors, ABurstMakesTheUpstreamConnectionsItNeedsNotOneARequest) {
  // Over TLS (the handshake makes a fiber wait while it connects), those who find every
  // connection full wait for one being made while it is expected to have room for them (2
  // here), rather than each making their own: 20 would then be made for 20 requests.
  ConcurrencyRun run = twenty_streams_two_allowed({}, true);
  EXPECT_EQ(run.answered, 20u);
  EXPECT_EQ(run.most_on_one, 2u);
  EXPECT_GE(run.connections, 5u);
  EXPECT_LE(run.connections, 11u);
}

TEST(ExchangeErrors, UpstreamConnectionsMadeForABurstCloseOnceIdle) {
  // The first connection stays; those made for the burst go once idle for the idle timeout.
  ConcurrencyRun run = twenty_streams_two_allowed({.idle_timeout = 100ms});
  EXPECT_EQ(run.answered, 20u);
  EXPECT_GE(run.connections, 5u);
  EXPECT_EQ(run.connections_later, 1u) << run.connections;
}

TEST(ExchangeErrors, AnUpstreamThatAllowsNoStreamGetsNoMoreConnections) {
  // SETTINGS_MAX_CONCURRENT_STREAMS 0: another connection would allow none either. The
  // requests wait on the one there is, and give up at their write timeout.
  Runtime runtime(RuntimeOptions{.workers = 1});
  Router router;
  router.get("/hello", [](Request&) { return Response::text("hello"); });
  ServerOptions options;
  options.http2 = true;
  options.http2_limits.max_concurrent_streams = 0;
  auto upstream = HttpServer::start(runtime, Address::loopback_v4(0), std::move(router), options);
  ASSERT_TRUE(upstream.has_value());
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    Endpoint endpoint = endpoint_of((*upstream)->address(), WireProtocol::kH2c);
    ExchangeTimeouts timeouts{.write = 200ms};
    // The first goes out before the server's SETTINGS come, and is refused.
    auto first = pools.open(endpoint, head_for("GET", "/hello"), "u", timeouts);
    ASSERT_TRUE(first.has_value());
    EXPECT_FALSE((*first)->read_head().has_value());
    std::vector<JoinHandle<bool>> fibers;
    for (int i = 0; i < 5; ++i) {
      fibers.push_back(spawn([&] {
        return pools.open(endpoint, head_for("GET", "/hello"), "u", timeouts).has_value();
      }));
    }
    for (auto& f : fibers) EXPECT_FALSE(f.join());
    EXPECT_EQ(pools.open_connections(endpoint), 1u);
  });
  (*upstream)->drain(Deadline::after(5s));
}

TEST(ExchangeErrors, StreamsPastTheUpstreamsConcurrencyLimitWaitTheirTurnAtMaxConnections) {
  // At max_connections, the streams past the limit wait for one to end instead.
  ConcurrencyRun run = twenty_streams_two_allowed({.max_connections = 2});
  EXPECT_EQ(run.answered, 20u);
  EXPECT_EQ(run.most_on_one, 2u);
  EXPECT_EQ(run.connections, 2u);
}

TEST(ExchangeErrors, AtTheConnectionLimitARequestWaitsForAConnectionThenGivesUp) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    PoolLimits limits{.max_connections = 1, .max_pending = 1};
    ExchangeTimeouts timeouts{.connect = 300ms};
    Endpoint endpoint = endpoint_of(upstream.address());
    auto first = pools.open(endpoint, head_for("GET", "/hello"), "u", timeouts, limits);
    ASSERT_TRUE(first.has_value());
    // Held past the connect timeout: the second gives up.
    auto started = Clock::now();
    auto second = pools.open(endpoint, head_for("GET", "/hello"), "u", timeouts, limits);
    ASSERT_FALSE(second.has_value());
    EXPECT_EQ(second.error(), ExchangeErrc::kNoCapacity);
    EXPECT_GE(Clock::now() - started, 250ms) << "it waited for a connection first";
    // Released meanwhile: the waiting request gets that very connection.
    ClientExchange* held = first->get();
    auto releaser = spawn([&] {
      (void)this_fiber::sleep_for(50ms);
      ASSERT_TRUE(held->finish().has_value());
      ASSERT_TRUE(held->read_head().has_value());
      EXPECT_EQ(body_of(*held), "hello");
      first->reset();
    });
    // (A third request meanwhile finds the one waiting place taken: refused at once.)
    auto waiting = spawn(
        [&] { return pools.open(endpoint, head_for("GET", "/hello"), "u", timeouts, limits); });
    (void)this_fiber::sleep_for(10ms);
    auto third = pools.open(endpoint, head_for("GET", "/hello"), "u", timeouts, limits);
    ASSERT_FALSE(third.has_value());
    EXPECT_EQ(third.error(), ExchangeErrc::kNoCapacity);
    auto got = waiting.join();
    releaser.join();
    ASSERT_TRUE(got.has_value()) << got.error().message();
    EXPECT_TRUE((*got)->reused());
    EXPECT_EQ(pools.open_connections(endpoint), 1u);
  });
}

TEST(ExchangeErrors, AtTheConnectionLimitAnExchangeLeftAloneGivesWayToAWaitingRequest) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    PoolLimits limits{.max_connections = 1, .preempt_stalled = 200ms};
    ExchangeTimeouts timeouts{.connect = 3s};
    Endpoint endpoint = endpoint_of(upstream.address());
    // The first has its head and then is left alone, as by a client that takes nothing.
    auto first = pools.open(endpoint, head_for("GET", "/bytes?100000"), "u", timeouts, limits);
    ASSERT_TRUE(first.has_value());
    ASSERT_TRUE((*first)->read_head().has_value());
    auto started = Clock::now();
    auto second = pools.open(endpoint, head_for("GET", "/hello"), "u", timeouts, limits);
    ASSERT_TRUE(second.has_value()) << second.error().message();
    auto waited = Clock::now() - started;
    EXPECT_GE(waited, 100ms) << "it waited for the first to be left alone long enough";
    EXPECT_LT(waited, 2s) << "and did not wait for the connect timeout";
    ASSERT_TRUE((*second)->read_head().has_value());
    EXPECT_EQ(body_of(**second), "hello");
    // The first gave its connection up: its next call says so.
    char piece[100];
    auto read = (*first)->read(piece);
    ASSERT_FALSE(read.has_value());
    EXPECT_EQ(read.error(), ExchangeErrc::kPreempted);
  });
}

TEST(ExchangeErrors, AnExchangeWaitingOnItsUpstreamIsNeverPreempted) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    PoolLimits limits{.max_connections = 1, .preempt_stalled = 50ms};
    ExchangeTimeouts timeouts{.connect = 400ms};
    Endpoint endpoint = endpoint_of(upstream.address());
    auto first = pools.open(endpoint, head_for("GET", "/slow"), "u", timeouts, limits);
    ASSERT_TRUE(first.has_value());
    // Its caller is in read_head for the second the upstream takes: not away from it.
    auto reader = spawn([&] { return body_of(**first); });
    (void)this_fiber::sleep_for(10ms);
    auto second = pools.open(endpoint, head_for("GET", "/hello"), "u", timeouts, limits);
    ASSERT_FALSE(second.has_value());
    EXPECT_EQ(second.error(), ExchangeErrc::kNoCapacity);
    EXPECT_EQ(reader.join(), "late");
  });
}

TEST(ExchangeErrors, WithoutPreemptionAnExchangeLeftAloneKeepsItsConnection) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    PoolLimits limits{.max_connections = 1};  // preempt_stalled 0: never
    ExchangeTimeouts timeouts{.connect = 300ms};
    Endpoint endpoint = endpoint_of(upstream.address());
    auto first = pools.open(endpoint, head_for("GET", "/bytes?100000"), "u", timeouts, limits);
    ASSERT_TRUE(first.has_value());
    ASSERT_TRUE((*first)->read_head().has_value());
    auto second = pools.open(endpoint, head_for("GET", "/hello"), "u", timeouts, limits);
    ASSERT_FALSE(second.has_value());
    EXPECT_EQ(second.error(), ExchangeErrc::kNoCapacity);
    auto got = drain(**first);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->first, 100000u);
  });
}

TEST(ExchangeErrors, AtTheBodysEndTheConnectionAndPermitGoBackBeforeTheExchangeDoes) {
  with_server(start_upstream, [&](UpstreamConnections& pools, HttpServer& upstream) {
    PoolLimits limits{.max_connections = 1, .max_pending = 1};
    ExchangeTimeouts timeouts{.connect = 300ms};
    Endpoint endpoint = endpoint_of(upstream.address());
    auto first = pools.open(endpoint, head_for("GET", "/hello"), "u", timeouts, limits);
    ASSERT_TRUE(first.has_value());
    ASSERT_TRUE((*first)->read_head().has_value());
    EXPECT_EQ(body_of(**first), "hello");
    // The first is still there (its caller relaying the last piece, say), but done with its
    // connection: the next request gets that connection at once, without waiting.
    auto started = Clock::now();
    auto second = pools.open(endpoint, head_for("GET", "/hello"), "u", timeouts, limits);
    ASSERT_TRUE(second.has_value()) << second.error().message();
    EXPECT_LT(Clock::now() - started, 200ms);
    EXPECT_TRUE((*second)->reused());
    ASSERT_TRUE((*second)->read_head().has_value());
    EXPECT_EQ(body_of(**second), "hello");
    first->reset();  // and its going changes nothing more
    EXPECT_EQ(pools.open_connections(endpoint), 1u);
  });
}

}  // namespace

namespace {

// The server side of what a proxy relies on: a streamed body of announced length, trailers,
// and the request context.
std::unique_ptr<HttpServer> start_streaming_server(Runtime& runtime) {
  Router router;
  router.get("/short", [](Request&) {
    Response response(200);
    response.stream_length = 10;
    response.stream = [](BodyWriter& w) { (void)w.write("12345"); };  // half of what it said
    return response;
  });
  router.get("/sized", [](Request&) {
    Response response(200);
    response.stream_length = 10;
    response.stream = [](BodyWriter& w) {
      (void)w.write("12345");
      (void)w.write("67890");
    };
    return response;
  });
  router.get("/trailers", [](Request&) {
    Response response(200);
    response.stream = [](BodyWriter& w) {
      (void)w.write("body");
      // Only the first may go on: the others are framing, routing or hop-by-hop fields, or
      // a value that could end the field early.
      w.set_trailers(HeaderMap{{"grpc-status", "0"},
                               {"Content-Length", "5"},
                               {"Host", "elsewhere"},
                               {"Connection", "close"},
                               {"x-split", "a\r\nb"}});
    };
    return response;
  });
  router.get("/context", [](Request& r) {
    const RequestContext& c = r.context();
    return Response::text(fmt::format("{} {} {} {}", c.remote, c.major_version, c.tls,
                                      c.peer != nullptr && c.local != nullptr));
  });
  ServerOptions options;
  options.http2 = true;
  auto server = HttpServer::start(runtime, Address::loopback_v4(0), std::move(router), options);
  EXPECT_TRUE(server.has_value());
  return std::move(*server);
}

TEST_P(Exchange, AStreamedBodyOfKnownLengthIsAnnouncedAndHeldToIt) {
  with_server(start_streaming_server, [&](UpstreamConnections& pools, HttpServer& server) {
    Endpoint endpoint = endpoint_of(server.address(), GetParam());
    auto whole = pools.open(endpoint, head_for("GET", "/sized"), "u", {});
    ASSERT_TRUE(whole.has_value());
    auto head = (*whole)->read_head();
    ASSERT_TRUE(head.has_value());
    EXPECT_EQ((*head)->content_length, 10u) << "announced, not chunked";
    EXPECT_EQ(body_of(**whole), "1234567890");
    // A producer that falls short: the client sees a cut, never a complete short body.
    // (HTTP/2 may reset the stream before its HEADERS went out: then the head fails.)
    auto cut = pools.open(endpoint, head_for("GET", "/short"), "u", {});
    ASSERT_TRUE(cut.has_value());
    auto cut_head = (*cut)->read_head();
    if (cut_head || GetParam() == WireProtocol::kHttp1) {
      ASSERT_TRUE(cut_head.has_value());
      auto got = drain(**cut);
      ASSERT_FALSE(got.has_value());
      EXPECT_EQ(got.error(), ExchangeErrc::kResponseCut);
    }
  });
}

TEST_P(Exchange, TheRequestContextSaysWhoAndHow) {
  with_server(start_streaming_server, [&](UpstreamConnections& pools, HttpServer& server) {
    auto ex =
        pools.open(endpoint_of(server.address(), GetParam()), head_for("GET", "/context"), "u", {});
    ASSERT_TRUE(ex.has_value());
    ASSERT_TRUE((*ex)->read_head().has_value());
    EXPECT_EQ(body_of(**ex), GetParam() == WireProtocol::kH2c ? "127.0.0.1 2 false true"
                                                              : "127.0.0.1 1 false true");
  });
}

TEST(ClientGone, AnHttp2ResetRunsTheHandlersCallback) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  Event gone;
  Router router;
  router.get("/wait", [&gone](Request& r) {
    r.on_client_gone([&gone] { gone.set(); });
    (void)gone.wait(Deadline::after(5s));
    return Response::text("done");
  });
  auto server = HttpServer::start(runtime, Address::loopback_v4(0), std::move(router),
                                  ServerOptions{.http2 = true});
  ASSERT_TRUE(server.has_value());
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    auto ex = pools.open(endpoint_of((*server)->address(), WireProtocol::kH2c),
                         head_for("GET", "/wait"), "u", {});
    ASSERT_TRUE(ex.has_value());
    ASSERT_TRUE((*ex)->finish().has_value());
    (void)this_fiber::sleep_for(100ms);
    auto started = Clock::now();
    ex->reset();  // abandoned: RST_STREAM(CANCEL)
    EXPECT_FALSE(gone.wait(Deadline::after(2s))) << "the callback never ran";
    EXPECT_LT(Clock::now() - started, 1s);
  });
  (*server)->drain(Deadline::after(5s));
}

TEST(ExchangeTrailers, Http2TrailersReachTheClient) {
  with_server(start_streaming_server, [&](UpstreamConnections& pools, HttpServer& server) {
    auto ex = pools.open(endpoint_of(server.address(), WireProtocol::kH2c),
                         head_for("GET", "/trailers"), "u", {});
    ASSERT_TRUE(ex.has_value());
    ASSERT_TRUE((*ex)->read_head().has_value());
    EXPECT_EQ(body_of(**ex), "body");
    EXPECT_EQ((*ex)->trailers().get("grpc-status"), "0");
    EXPECT_EQ((*ex)->trailers().size(), 1u);  // nothing but what may be sent on
  });
}

}  // namespace

// ---- 1xx: 100-continue and interim responses -------------------------------------------------

// A request announcing a body with Expect: 100-continue, to a scripted upstream; what
// await_continue said, and the final status (after the body went, if it did).
struct ContinueOutcome {
  bool go = false;
  int status = 0;
  std::string upstream_saw;
};

ContinueOutcome expect_continue(std::function<void(TcpStream&, std::string&)> script,
                                std::chrono::milliseconds wait = 2s) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto saw = std::make_shared<std::string>();
  auto upstream = scripted(runtime, [script, saw](TcpStream& s) { script(s, *saw); });
  UpstreamConnections pools(runtime);
  ContinueOutcome outcome;
  runtime.block_on([&] {
    RequestHead head = head_for("POST", "/upload", 5);
    head.headers.add("Expect", "100-continue");
    auto ex = pools.open(endpoint_of(upstream->address()), head, "u", {});
    ASSERT_TRUE(ex.has_value());
    auto go = (*ex)->await_continue(wait);
    ASSERT_TRUE(go.has_value()) << go.error().message();
    outcome.go = *go;
    if (*go) {
      ASSERT_TRUE((*ex)->write("hello").has_value());
      ASSERT_TRUE((*ex)->finish().has_value());
    }
    auto final_head = (*ex)->read_head();
    ASSERT_TRUE(final_head.has_value()) << final_head.error().message();
    outcome.status = (*final_head)->status;
  });
  outcome.upstream_saw = *saw;
  return outcome;
}

// Reads `n` bytes of body off `s` into `out`.
void read_body(TcpStream& s, std::string& out, std::size_t n) {
  std::string body(n, '\0');
  if (s.read_exact(body, Deadline::after(5s))) out += body;
}

TEST(ExchangeContinue, TheBodyGoesAfterTheUpstreamSays100) {
  auto outcome = expect_continue([](TcpStream& s, std::string& saw) {
    saw = read_head(s);
    (void)s.write_all(std::string_view("HTTP/1.1 100 Continue\r\n\r\n"), Deadline::after(5s));
    read_body(s, saw, 5);
    (void)s.write_all(std::string_view("HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"),
                      Deadline::after(5s));
  });
  EXPECT_TRUE(outcome.go);
  EXPECT_EQ(outcome.status, 201);
  EXPECT_NE(outcome.upstream_saw.find("Expect: 100-continue\r\n"), std::string::npos);
  EXPECT_TRUE(outcome.upstream_saw.ends_with("\r\n\r\nhello"));
}

TEST(ExchangeContinue, AFinalAnswerInsteadOf100MeansNoBody) {
  auto outcome = expect_continue([](TcpStream& s, std::string& saw) {
    saw = read_head(s);
    (void)s.write_all(
        std::string_view("HTTP/1.1 417 Expectation Failed\r\nContent-Length: 0\r\n\r\n"),
        Deadline::after(5s));
    (void)this_fiber::sleep_for(300ms);
  });
  EXPECT_FALSE(outcome.go);
  EXPECT_EQ(outcome.status, 417);
}

TEST(ExchangeContinue, ASilentUpstreamGetsTheBodyAfterTheWait) {
  auto started = Clock::now();
  auto outcome = expect_continue(
      [](TcpStream& s, std::string& saw) {
        saw = read_head(s);
        read_body(s, saw, 5);  // no 100: the body comes anyway, after the wait
        (void)s.write_all(std::string_view("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
                          Deadline::after(5s));
      },
      200ms);
  EXPECT_TRUE(outcome.go);
  EXPECT_EQ(outcome.status, 200);
  EXPECT_TRUE(outcome.upstream_saw.ends_with("hello"));
  EXPECT_GE(Clock::now() - started, 150ms);
}

TEST(ExchangeInterim, EarlyHintsReachTheCallbackBeforeTheFinalHead) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto upstream = scripted(runtime, [](TcpStream& s) {
    read_head(s);
    (void)s.write_all(std::string_view("HTTP/1.1 103 Early Hints\r\nLink: </a.css>; "
                                       "rel=preload\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n"
                                       "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
                      Deadline::after(5s));
    (void)this_fiber::sleep_for(300ms);
  });
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    auto ex = pools.open(endpoint_of(upstream->address()), head_for("GET", "/"), "u", {});
    ASSERT_TRUE(ex.has_value());
    std::vector<std::pair<int, std::string>> interim;
    (*ex)->on_informational([&](const ClientResponseHead& h) {
      interim.emplace_back(h.status, std::string(h.headers.get("link").value_or("")));
    });
    ASSERT_TRUE((*ex)->finish().has_value());
    auto head = (*ex)->read_head();
    ASSERT_TRUE(head.has_value());
    EXPECT_EQ((*head)->status, 200);
    EXPECT_EQ(body_of(**ex), "ok");
    // The 100 is the exchange's own business; the 103 is passed on, with its fields.
    ASSERT_EQ(interim.size(), 1u);
    EXPECT_EQ(interim[0].first, 103);
    EXPECT_EQ(interim[0].second, "</a.css>; rel=preload");
  });
}
