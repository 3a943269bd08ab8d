// The HTTP server the integration tests drive: spindle's framework with routes that exercise
// bodies, errors and slow handlers, and limits small enough to hit quickly.
//
//   http_test_server PORT [MAX_BODY [WORKERS]]   (prints {"event":"listening","address":...}
//                            when ready; SIGTERM drains gracefully and exits 0)
//
// As an upstream behind the gateway: UPSTREAM_NAME is sent back in X-Upstream on every
// response, KEEPALIVE_MS sets the keep-alive timeout (1500 by default), TLS_CERT and TLS_KEY
// serve HTTPS (ALPN h2 and http/1.1) instead of cleartext, H2_RESET_LIMITS the HTTP/2 resets
// a connection may make.
#include <fmt/format.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <stdexcept>

#include "spindle/fiber/this_fiber.h"
#include "spindle/handlers/compression.h"
#include "spindle/http/websocket.h"
#include "spindle/net/signal_set.h"
#include "spindle/server/server.h"

using namespace spindle;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  int port = argc > 1 ? std::atoi(argv[1]) : 0;
  SignalSet signals{SIGINT, SIGTERM};
  // argv: port, max body (default 64 KiB), workers (default 2).
  std::size_t workers = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 2;
  Runtime runtime(RuntimeOptions{.workers = workers});

  http::Router router;
  router.get("/plaintext", [](http::Request&) { return http::Response::text("Hello, World!"); });
  router.post("/echo", [](http::Request& r) { return http::Response::text(r.body()); });
  // Streams the body in small reads: answers its size, the number of reads and an FNV-1a hash.
  router.post("/digest", [](http::Request& r) {
    std::uint64_t size = 0, reads = 0, hash = 14695981039346656037ull;
    char piece[1000];
    while (std::size_t n = r.read(piece)) {
      size += n;
      ++reads;
      for (std::size_t i = 0; i < n; ++i) {
        hash = (hash ^ static_cast<unsigned char>(piece[i])) * 1099511628211ull;
      }
    }
    return http::Response::text(fmt::format("{} {} {:016x}", size, reads, hash));
  });
  // Answers without reading the body: the server must drop it (or close) on its own.
  router.post("/ignore", [](http::Request&) { return http::Response::text("ignored"); });
  // Looks at the first bytes only and rejects what does not start with "OK".
  router.post("/sniff", [](http::Request& r) {
    char magic[2];
    std::size_t got = 0;
    while (got < 2) {
      std::size_t n = r.read(std::span(magic).subspan(got));
      if (n == 0) break;
      got += n;
    }
    if (got < 2 || magic[0] != 'O' || magic[1] != 'K') {
      throw http::HttpError(415, "body must start with OK");
    }
    return http::Response::text("accepted");
  });
  router.get("/users/{id}", [](http::Request& r) {
    return http::Response::text(fmt::format("user {}", r.param("id")));
  });
  router.get("/files/*path", [](http::Request& r) {
    return http::Response::text(fmt::format("file '{}'", r.param("path")));
  });
  router.get("/throw",
             [](http::Request&) -> http::Response { throw std::runtime_error("handler failure"); });
  router.get("/teapot", [](http::Request&) -> http::Response {
    throw http::HttpError(418, "short and stout");
  });
  router.get("/slow", [](http::Request&) {
    (void)this_fiber::sleep_for(1s);
    return http::Response::text("finally");
  });
  // A handler that holds its worker's thread (CPU-bound work): meanwhile requests on other
  // connections of that worker pile up and are woken in one batch.
  router.get("/spin/{ms}", [](http::Request& r) {
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(std::stoi(std::string(r.param("ms"))));
    while (std::chrono::steady_clock::now() < until) {
    }
    return http::Response::text("spun");
  });
  router.get("/stream", [](http::Request&) {
    http::Response response(200);
    response.headers.add_view("Content-Type", "text/plain");
    response.stream = [](http::BodyWriter& body) {
      for (int i = 0; i < 5; ++i) {
        if (!body.write(fmt::format("part {}\n", i))) return;
        (void)this_fiber::sleep_for(20ms);
      }
    };
    return response;
  });
  router.get("/big",
             [](http::Request&) { return http::Response::text(std::string(1 << 20, 'b')); });
  // n bytes of text made of n's decimal digits repeated: a body of a chosen size, held in
  // memory (copied into the response buffer up to 16 KiB).
  router.get("/text/{n}", [](http::Request& r) {
    std::string digits(r.param("n"));
    std::string body;
    for (std::size_t n = std::stoull(digits); body.size() < n;) body += digits;
    body.resize(std::stoull(digits));
    return http::Response::text(body);
  });
  // For the gateway's tests: what arrived, bodies of any size, bodies cut short, any status,
  // late answers and trailers.
  router.get("/headers", [](http::Request& r) {
    std::string out;
    for (const http::Field& f : r.headers()) out += fmt::format("{}: {}\n", f.name, f.value);
    return http::Response::text(out);
  });
  router.get("/bytes/{n}", [](http::Request& r) {
    std::uint64_t n = std::stoull(std::string(r.param("n")));
    http::Response response(200);
    response.headers.add_view("Content-Type", "application/octet-stream");
    if (r.query() != "chunked") response.stream_length = n;
    response.stream = [n](http::BodyWriter& body) {
      std::string piece(64 * 1024, 'x');
      for (std::uint64_t sent = 0; sent < n; sent += piece.size()) {
        if (!body.write(std::string_view(piece).substr(
                0, std::min<std::uint64_t>(piece.size(), n - sent)))) {
          return;
        }
      }
    };
    return response;
  });
  router.get("/cut", [](http::Request&) {
    http::Response response(200);
    response.stream_length = 100000;
    response.stream = [](http::BodyWriter& body) {
      (void)body.write(std::string(1000, 'c'));
      (void)this_fiber::sleep_for(50ms);
      throw std::runtime_error("cut on purpose");
    };
    return response;
  });
  router.get("/status/{code}", [](http::Request& r) {
    return http::Response::text("status", std::stoi(std::string(r.param("code"))));
  });
  router.route("POST", "/status/{code}", [](http::Request& r) {
    (void)r.body();
    return http::Response::text("status", std::stoi(std::string(r.param("code"))));
  });
  // Sends 103 Early Hints, then the answer.
  router.get("/hints", [](http::Request& r) {
    http::HeaderMap hints{{"Link", "</style.css>; rel=preload"}};
    (void)r.send_interim(103, hints);
    return http::Response::text("hinted");
  });
  // A 103 and a streamed answer whose trailers repeat fields of the heads (a gateway's response
  // edits must reach all three).
  router.get("/hints-and-trailers", [](http::Request& r) {
    http::HeaderMap hints{
        {"Link", "</a.css>; rel=preload"}, {"X-Powered-By", "php"}, {"X-Frame-Options", "ALLOW"}};
    (void)r.send_interim(103, hints);
    http::Response response(200);
    response.headers.add_view("X-Powered-By", "php");
    response.stream = [](http::BodyWriter& w) {
      (void)w.write("ok");
      http::HeaderMap trailers{
          {"X-Powered-By", "php"}, {"X-Frame-Options", "ALLOW"}, {"X-Checksum", "1"}};
      w.set_trailers(trailers);
    };
    return response;
  });
  router.get("/delay/{ms}", [](http::Request& r) {
    (void)this_fiber::sleep_for(std::chrono::milliseconds(std::stoi(std::string(r.param("ms")))));
    return http::Response::text("late");
  });
  router.route("POST", "/trailers", [](http::Request& r) {
    std::string body = r.body();
    http::Response response(200);
    response.headers.add_view("Content-Type", "application/grpc");
    response.stream = [body](http::BodyWriter& w) {
      (void)w.write(body);
      http::HeaderMap trailers{{"grpc-status", "0"}, {"grpc-message", "ok"}};
      w.set_trailers(trailers);
    };
    return response;
  });
  // A byte echo on a taken-over connection (a stand-in for a WebSocket server, or for what a
  // CONNECT reaches: the gateway must move the bytes, whatever they are).
  auto echo = [](http::TunnelEnd& client, std::string_view early) {
    if (!early.empty() && !client.write(early, Deadline::after(5s))) return;
    std::string buffer(16384, '\0');
    for (;;) {
      auto n = client.read(buffer, Deadline::after(30s));
      if (!n || *n == 0) return;
      if (!client.write(std::string_view(buffer).substr(0, *n), Deadline::after(5s))) return;
    }
  };
  // CONNECT host:port: 200, then the echo (as if the tunnel reached an echo server).
  router.route("CONNECT", "/", [echo](http::Request&) {
    http::Response response(200);
    response.takeover = echo;
    return response;
  });
  router.get("/ws", [echo](http::Request& r) {
    if (!r.headers().has_token("connection", "upgrade") || !r.headers().contains("upgrade")) {
      return http::Response::text("upgrade required", 426);
    }
    http::Response response(101);
    response.headers.add_view("Upgrade", "websocket");
    response.headers.add_view("Connection", "Upgrade");
    if (auto key = r.headers().get("sec-websocket-key")) {
      response.headers.add("Sec-WebSocket-Accept", http::websocket_accept(*key));
    }
    response.takeover = echo;
    return response;
  });
  router.use(http::compression());
  const char* name = std::getenv("UPSTREAM_NAME");
  // DELAY_MS: every answer waits this long first (a slow upstream, for the balancers).
  const char* delay = std::getenv("DELAY_MS");
  std::chrono::milliseconds slow(delay ? std::atoi(delay) : 0);
  router.use([name, slow](http::Request& r, const http::Next& next) {
    if (slow.count() > 0) (void)this_fiber::sleep_for(slow);
    http::Response response = next(r);
    response.headers.add(std::string_view("X-Middleware"), "ran");
    if (name != nullptr) response.headers.add(std::string_view("X-Upstream"), name);
    return response;
  });

  http::ServerOptions options;
  options.max_body = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 64 * 1024;
  options.http2 = true;  // h2c by prior knowledge or Upgrade, beside HTTP/1.1
  options.header_timeout = 1s;
  const char* keepalive = std::getenv("KEEPALIVE_MS");
  options.keepalive_timeout = std::chrono::milliseconds(keepalive ? std::atoi(keepalive) : 1500);
  const char* cert = std::getenv("TLS_CERT");
  const char* key = std::getenv("TLS_KEY");
  if (cert != nullptr && key != nullptr) {
    auto tls = TlsServerContext::create(
        TlsServerOptions{.certificates = {{cert, key, {}}}, .alpn = {"h2", "http/1.1"}});
    if (!tls) {
      fmt::print(stderr, "http_test_server: {}\n", tls.error());
      return 1;
    }
    options.tls = *tls;
  }
  // H2_RESET_LIMITS: the HTTP/2 resets a connection may make (Rapid Reset's budget, and those
  // of running streams at once): an upstream behind a gateway whose clients cancel by the
  // hundred (200 and 100 by default).
  if (const char* resets = std::getenv("H2_RESET_LIMITS")) {
    options.http2_limits.reset_budget = std::strtoull(resets, nullptr, 10);
    options.http2_limits.running_reset_burst = options.http2_limits.reset_budget;
  }
  options.parser.max_request_line = 1024;
  options.parser.max_head = 4096;
  options.max_connections_per_worker = 100;
  auto server = http::HttpServer::start(
      runtime, Address::loopback_v4(static_cast<std::uint16_t>(port)), std::move(router), options);
  if (!server) {
    fmt::print(stderr, "http_test_server: {}\n", server.error().message());
    return 1;
  }
  fmt::print("{{\"event\":\"listening\",\"address\":\"{}\"}}\n", (*server)->address().to_string());
  std::fflush(stdout);
  (void)runtime.block_on([&] { return signals.wait(); });
  return (*server)->drain(Deadline::after(10s)) ? 0 : 3;
}
