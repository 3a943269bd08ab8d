// Extended CONNECT (RFC 8441) through the HTTP/2 client: to spindle's own server, whose SETTINGS
// allow it, the stream is a tunnel that two fibers use at once (one reads, one writes) through
// windows exhausted many times; to a server whose SETTINGS do not, nothing is sent and the
// exchange fails with kNoExtendedConnect (a retry over HTTP/1.1 is safe).
#include <gtest/gtest.h>

#include <string>

#include "spindle/client/exchange.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/h2/frame.h"
#include "spindle/net/tcp_server.h"
#include "spindle/server/server.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;

namespace {

// An extended CONNECT to /echo as the gateway sends one: CONNECT, :protocol, a path.
RequestHead tunnel_head() {
  RequestHead head;
  head.method = "CONNECT";
  head.protocol = "websocket";
  head.target = "/echo";
  head.headers.add("sec-websocket-version", "13");
  return head;
}

Endpoint h2c(const Address& address) {
  Endpoint e;
  e.address = address;
  e.protocol = WireProtocol::kH2c;
  return e;
}

std::string pattern(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 % 251);
  return s;
}

}  // namespace

// The upstream echoes the tunnel's bytes as they come; the client writes 2 MB on one fiber
// while another reads the echo: each waits on the stream at the same time, the writer for the
// upstream's window, the reader for its bytes. Then the client's half-close ends the echo.
TEST(Http2Tunnel, ReadsAndWritesOnTwoFibersAtOnceThroughExhaustedWindows) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  Router router;
  router.route("CONNECT", "/echo", [](Request& request) {
    EXPECT_EQ(request.head().protocol, "websocket");
    Response response(200);
    response.takeover = [](TunnelEnd& client, std::string_view) {
      std::string buffer(10000, '\0');
      for (;;) {
        auto n = client.read(buffer, Deadline::after(5s));
        if (!n || *n == 0) break;
        if (!client.write(std::string_view(buffer).substr(0, *n), Deadline::after(5s))) return;
      }
      client.close_write();
    };
    return response;
  });
  ServerOptions options;
  options.http2 = true;
  auto server = HttpServer::start(runtime, Address::loopback_v4(0), std::move(router), options);
  ASSERT_TRUE(server.has_value());
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    auto ex = pools.open(h2c((*server)->address()), tunnel_head(), "up.test", {});
    ASSERT_TRUE(ex.has_value()) << ex.error().message();
    auto head = (*ex)->read_head();
    ASSERT_TRUE(head.has_value()) << head.error().message();
    EXPECT_EQ((*head)->status, 200);
    const std::string sent = pattern(2 << 20);
    auto writer = spawn([&] {
      for (std::size_t at = 0; at < sent.size(); at += 30000) {
        auto w = (*ex)->tunnel_write(std::string_view(sent).substr(at, 30000), Deadline::after(5s));
        if (!w) return w.error();
      }
      return (*ex)->finish() ? std::error_code() : std::make_error_code(std::errc::io_error);
    });
    std::string echoed, buffer(16384, '\0');
    for (;;) {
      auto n = (*ex)->tunnel_read(buffer, Deadline::after(5s));
      ASSERT_TRUE(n.has_value()) << n.error().message() << " after " << echoed.size();
      if (*n == 0) break;
      echoed.append(buffer, 0, *n);
    }
    EXPECT_FALSE(writer.join());
    EXPECT_EQ(echoed.size(), sent.size());
    EXPECT_TRUE(echoed == sent);
  });
  (*server)->drain(Deadline::after(5s));
}

// A server whose SETTINGS do not carry ENABLE_CONNECT_PROTOCOL: the client waits for them,
// then sends nothing (the server sees no HEADERS) and fails the exchange with
// kNoExtendedConnect, which reached nothing. The connection still carries plain requests.
TEST(Http2Tunnel, AServerThatDidNotAllowItGetsNothingAndTheFailureSaysSo) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  int headers_frames = 0;
  auto upstream = TcpServer::start(runtime, Address::loopback_v4(0), [&](TcpStream stream) {
    std::string settings;
    (void)this_fiber::sleep_for(100ms);  // its SETTINGS come late: the client waits for them
    h2::write::settings(settings, {});
    (void)stream.write_all(settings, Deadline::after(5s));
    std::string in(65536, '\0');
    std::string all;
    for (;;) {
      auto n = stream.read(in, Deadline::after(2s));
      if (!n || *n == 0) break;
      all.append(in, 0, *n);
    }
    // Past the 24-byte preface: count the HEADERS frames among what came.
    for (std::size_t at = 24; at + 9 <= all.size();) {
      std::size_t length = (std::uint8_t(all[at]) << 16) | (std::uint8_t(all[at + 1]) << 8) |
                           std::uint8_t(all[at + 2]);
      if (all[at + 3] == 1) ++headers_frames;
      at += 9 + length;
    }
  });
  ASSERT_TRUE(upstream.has_value());
  UpstreamConnections pools(runtime);
  runtime.block_on([&] {
    auto ex = pools.open(h2c((*upstream)->address()), tunnel_head(), "up.test", {});
    ASSERT_FALSE(ex.has_value());
    EXPECT_EQ(ex.error(), ExchangeErrc::kNoExtendedConnect);
    EXPECT_TRUE(nothing_reached_upstream(ex.error()));
    (void)this_fiber::sleep_for(2500ms);  // the scripted server counts what came
  });
  EXPECT_EQ(headers_frames, 0);
}
