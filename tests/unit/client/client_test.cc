#include "spindle/client/client.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/net/tcp_server.h"
#include "spindle/server/server.h"
#include "spindle/sync/wait_group.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;

namespace {

const std::string& cert_dir() { return spindle::testing::test_cert_dir(); }

Router make_router() {
  Router router;
  router.get("/hello", [](Request&) { return Response::text("hello"); });
  router.post("/echo", [](Request& r) { return Response::text(r.body()); });
  router.get("/slow", [](Request&) {
    (void)this_fiber::sleep_for(2s);
    return Response::text("late");
  });
  router.get("/big", [](Request&) { return Response::text(std::string(3 << 20, 'q')); });
  // The client's address and port: which connection the request came on.
  router.get("/peer", [](Request& r) {
    return Response::text(r.context().peer ? r.context().peer->to_string() : "?");
  });
  return router;
}

// Our server on loopback: plain (HTTP/1.1 and h2c) or TLS (ALPN h2 and http/1.1).
std::unique_ptr<HttpServer> start_server(Runtime& runtime, bool tls,
                                         std::chrono::milliseconds keepalive = 60s,
                                         std::size_t max_requests_per_connection = 0) {
  ServerOptions options;
  options.http2 = true;
  options.keepalive_timeout = keepalive;
  options.max_requests_per_connection = max_requests_per_connection;
  options.max_body = 8 << 20;
  if (tls) {
    const std::string& d = cert_dir();
    auto ctx = TlsServerContext::create(
        TlsServerOptions{.certificates = {{d + "/localhost.pem", d + "/localhost.key", {}}},
                         .alpn = {"h2", "http/1.1"}});
    EXPECT_TRUE(ctx.has_value()) << ctx.error();
    options.tls = *ctx;
  }
  auto server = HttpServer::start(runtime, Address::loopback_v4(0), make_router(), options);
  EXPECT_TRUE(server.has_value());
  return std::move(*server);
}

std::string url(const HttpServer& server, bool tls, std::string_view path) {
  return std::string(tls ? "https://localhost:" : "http://127.0.0.1:") +
         std::to_string(server.address().port()) + std::string(path);
}

// The error a send ended with; none if it succeeded (so a check compares, never calls
// error() on a result that holds a response).
template <typename T>
std::error_code error_of(const Result<T>& result) {
  return result.has_value() ? std::error_code{} : result.error();
}

// An HTTP/1.1 upstream that answers the first request of each connection and closes the
// connection, unanswered, when a second one arrives on it: a pooled connection that looks
// alive and fails after the request was written. Counts connections and requests.
struct ClosingUpstream {
  std::atomic<int> connections{0}, requests{0};
  std::unique_ptr<TcpServer> server;

  explicit ClosingUpstream(Runtime& runtime) {
    auto started = TcpServer::start(runtime, Address::loopback_v4(0), [this](TcpStream stream) {
      ++connections;
      for (int answered = 0;; ++answered) {
        std::string head;
        char c;
        while (!head.ends_with("\r\n\r\n")) {
          if (stream.read({&c, 1}, Deadline::after(5s)).value_or(0) != 1) return;
          head += c;
        }
        ++requests;
        if (answered == 1) return;  // closes without a response byte
        if (head.find("Content-Length: 2") != std::string::npos) {
          char body[2];
          if (!stream.read_exact(body, Deadline::after(5s))) return;
        }
        if (!stream.write_all(std::string_view("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))) {
          return;
        }
      }
    });
    EXPECT_TRUE(started.has_value());
    server = std::move(*started);
  }
  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(server->address().port()) + "/";
  }
};

ClientOptions trusting(ClientOptions options = {}) {
  auto ctx = TlsClientContext::create(
      TlsClientOptions{.ca_file = cert_dir() + "/ca.pem",
                       .alpn = options.http2 ? std::vector<std::string>{"h2", "http/1.1"}
                                             : std::vector<std::string>{"http/1.1"}});
  EXPECT_TRUE(ctx.has_value()) << ctx.error();
  options.tls = *ctx;
  return options;
}

}  // namespace

TEST(HttpClient, Http11KeepsTheConnectionAlive) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = start_server(runtime, false);
  HttpClient client(runtime);
  runtime.block_on([&] {
    for (int i = 0; i < 20; ++i) {
      auto r = client.send({.url = url(*server, false, "/hello")});
      ASSERT_TRUE(r.has_value()) << r.error().message();
      EXPECT_EQ(r->status, 200);
      EXPECT_EQ(r->version, 11);
      EXPECT_EQ(r->body, "hello");
      EXPECT_EQ(r->headers.get("content-type").value_or(""), "text/plain; charset=utf-8");
    }
    auto echo = client.send(
        {.method = "POST", .url = url(*server, false, "/echo"), .body = std::string(100'000, 'e')});
    ASSERT_TRUE(echo.has_value());
    EXPECT_EQ(echo->body, std::string(100'000, 'e'));
    EXPECT_EQ(server->connections(), 1u);  // every request on one pooled connection
  });
  server->drain(Deadline::after(5s));
}

TEST(HttpClient, H2cMultiplexesConcurrentFibersOnOneConnection) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = start_server(runtime, false);
  HttpClient client(runtime, ClientOptions{.h2c_prior_knowledge = true});
  runtime.block_on([&] {
    WaitGroup all;
    int ok = 0;
    for (int i = 0; i < 50; ++i) {
      all.add();
      spawn([&, i] {
        std::string body = "request " + std::to_string(i);
        auto r = client.send({.method = "POST", .url = url(*server, false, "/echo"), .body = body});
        if (r && r->status == 200 && r->version == 20 && r->body == body) ++ok;
        all.done();
      }).detach();
    }
    (void)all.wait();
    EXPECT_EQ(ok, 50);
    EXPECT_EQ(server->connections(), 1u);
    auto big = client.send({.url = url(*server, false, "/big")});  // beyond every window
    ASSERT_TRUE(big.has_value());
    EXPECT_EQ(big->body.size(), 3u << 20);
  });
  server->drain(Deadline::after(5s));
}

// A server that ends each HTTP/2 connection after 20 requests (GOAWAY naming the twentieth,
// the streams after it refused unprocessed) while 30 are in flight: each turned away is sent
// again on another connection (up to three times), and all 60 are answered.
TEST(HttpClient, H2cRequestsTurnedAwayByGoawayGoAgainOnAnotherConnection) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = start_server(runtime, false, 60s, 20);
  HttpClient client(runtime, ClientOptions{.h2c_prior_knowledge = true});
  runtime.block_on([&] {
    std::set<std::string> peers;
    int ok = 0;
    std::error_code failed;
    for (int round = 0; round < 2; ++round) {
      WaitGroup all;
      for (int i = 0; i < 30; ++i) {
        all.add();
        spawn([&] {
          auto r = client.send({.url = url(*server, false, "/peer")});
          if (r && r->status == 200) {
            ++ok;
            peers.insert(r->body);
          }
          if (!r) failed = r.error();
          all.done();
        }).detach();
      }
      (void)all.wait();
    }
    EXPECT_EQ(ok, 60) << failed.message();
    EXPECT_GE(peers.size(), 3u);  // connections did end with GOAWAY: at most 20 on each
  });
  server->drain(Deadline::after(5s));
}

TEST(HttpClient, HttpsNegotiatesH2OrHttp11ByAlpn) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = start_server(runtime, true);
  HttpClient h2(runtime, trusting());
  HttpClient h1(runtime, trusting({.http2 = false}));
  HttpClient untrusting(runtime);  // the system store does not know the test CA
  runtime.block_on([&] {
    auto r2 = h2.send({.url = url(*server, true, "/hello")});
    ASSERT_TRUE(r2.has_value()) << r2.error().message();
    EXPECT_EQ(r2->version, 20);
    EXPECT_EQ(r2->body, "hello");
    auto r1 = h1.send({.url = url(*server, true, "/hello")});
    ASSERT_TRUE(r1.has_value()) << r1.error().message();
    EXPECT_EQ(r1->version, 11);
    auto refused = untrusting.send({.url = url(*server, true, "/hello")});
    ASSERT_FALSE(refused.has_value());
    EXPECT_EQ(refused.error().category(), tls_category());
  });
  server->drain(Deadline::after(5s));
}

TEST(HttpClient, ErrorsAndTimeouts) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = start_server(runtime, false);
  HttpClient client(runtime, ClientOptions{.request_timeout = 300ms});
  HttpClient h2(runtime, ClientOptions{.h2c_prior_knowledge = true, .request_timeout = 300ms});
  runtime.block_on([&] {
    EXPECT_EQ(error_of(client.send({.url = "ftp://x/"})), std::errc::invalid_argument);
    EXPECT_EQ(error_of(client.send({.url = "http://:80/"})), std::errc::invalid_argument);
    EXPECT_EQ(error_of(client.send({.url = "http://127.0.0.1:1/"})), std::errc::connection_refused);
    EXPECT_EQ(error_of(client.send({.url = url(*server, false, "/slow")})), std::errc::timed_out);
    EXPECT_EQ(error_of(h2.send({.url = url(*server, false, "/slow")})), std::errc::timed_out);
    // The HTTP/2 connection outlives a cancelled stream.
    auto after = h2.send({.url = url(*server, false, "/hello")});
    ASSERT_TRUE(after.has_value());
    EXPECT_EQ(after->body, "hello");
  });
  server->drain(Deadline::after(5s));
}

TEST(HttpClient, RetriesAnIdempotentRequestOnAConnectionTheServerClosed) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  ClosingUpstream upstream(runtime);
  HttpClient client(runtime);
  runtime.block_on([&] {
    ASSERT_TRUE(client.send({.url = upstream.url()}).has_value());
    // Sent on the pooled connection, which the upstream closes unanswered: retried on a new one.
    auto again = client.send({.url = upstream.url()});
    ASSERT_TRUE(again.has_value()) << again.error().message();
    EXPECT_EQ(again->body, "ok");
    EXPECT_EQ(upstream.requests.load(), 3);
    EXPECT_EQ(upstream.connections.load(), 2);
    // A POST whose bytes reached the upstream is not replayed: the failure is the caller's.
    auto post = client.send({.method = "POST", .url = upstream.url(), .body = "hi"});
    ASSERT_FALSE(post.has_value()) << "status " << post->status;
    EXPECT_EQ(upstream.requests.load(), 4);
    EXPECT_EQ(upstream.connections.load(), 2);
  });
  upstream.server->stop();
}

TEST(HttpClient, RefusesARequestThatCouldSmuggleBytesOntoTheWire) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = start_server(runtime, false);
  // Short timeouts: a request that does go out must not hold the test up.
  HttpClient client(runtime, ClientOptions{.request_timeout = 500ms});
  HttpClient h2(runtime, ClientOptions{.h2c_prior_knowledge = true, .request_timeout = 500ms});
  runtime.block_on([&] {
    std::string base = url(*server, false, "");
    // ClientRequest holds a HeaderMap: moved in, one by one.
    std::vector<ClientRequest> bad;
    bad.push_back({.method = "GET /x HTTP/1.1\r\nHost: a\r\n\r\nGET", .url = base + "/hello"});
    bad.push_back({.method = "GE T", .url = base + "/hello"});
    bad.push_back({.url = base + "/hello\r\nX-Injected: 1"});
    bad.push_back({.url = base + "/he llo"});
    bad.push_back(
        {.url = "http://127.0.0.1\r\nX: y:" + std::to_string(server->address().port()) + "/"});
    bad.push_back({.url = base + "/hello", .headers = {{"X-Ok", "a\r\nX-Injected: 1"}}});
    bad.push_back({.url = base + "/hello", .headers = {{"X-Ok", std::string("a\0b", 3)}}});
    bad.push_back({.url = base + "/hello", .headers = {{"Bad Name", "v"}}});
    for (const ClientRequest& request : bad) {
      for (HttpClient* c : {&client, &h2}) {
        auto r = c->send(request);
        ASSERT_FALSE(r.has_value()) << request.url << ": sent, status " << r->status;
        EXPECT_EQ(r.error(), std::errc::invalid_argument) << request.url;
      }
    }
    // Nothing was sent: the server saw no connection at all.
    EXPECT_EQ(server->connections(), 0u);
    auto ok = client.send({.url = base + "/hello", .headers = {{"X-Ok", "fine\tvalue"}}});
    ASSERT_TRUE(ok.has_value());
    EXPECT_EQ(ok->body, "hello");
  });
  server->drain(Deadline::after(5s));
}
