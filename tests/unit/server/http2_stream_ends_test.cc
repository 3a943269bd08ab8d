// Where an HTTP/2 stream ends early at the server, nothing of the connection is lost (issue 68):
// the body bytes of a stream reset before its handler read them give their window back (item
// 3); `:path *` with another method than OPTIONS never reaches a handler (item 4); a request
// head begun must be whole within timeouts.header, as on HTTP/1.1, or the connection ends and
// its memory with it (item 6).
#include <gtest/gtest.h>

#include <atomic>
#include <string>

#include "spindle/fiber/this_fiber.h"
#include "spindle/h2/frame.h"
#include "spindle/h2/hpack.h"
#include "spindle/server/server.h"
#include "testing/http_testing.h"
#include "testing/raw_h2.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;
using spindle::testing::RawH2;

namespace stream_ends {

std::string block_of(h2::hpack::Encoder& encoder, std::vector<h2::hpack::Field> fields) {
  std::string block;
  encoder.encode(fields, block);
  return block;
}

Router counting_router(std::atomic<int>& handled) {
  Router router;
  router.post("/sink", [&](Request& request) {
    ++handled;
    return Response::text(std::to_string(request.body().size()));
  });
  router.get("/hello", [&](Request&) {
    ++handled;
    return Response::text("hello");
  });
  router.get("/*any", [&](Request&) {
    ++handled;
    return Response::text("any");
  });
  return router;
}

// The WINDOW_UPDATE increments for the connection, and any GOAWAY, among frames read until
// stream `id` ends.
struct Seen {
  std::uint64_t connection_credit = 0;
  bool goaway = false;
  RawH2::Response response;
};
Seen read_until(RawH2& c, std::uint32_t id) {
  Seen seen;
  seen.response = c.response(id);
  for (const RawH2::Received& f : c.others) {
    if (f.kind() == h2::FrameType::kWindowUpdate && f.stream_id == 0) {
      const auto* p = reinterpret_cast<const std::uint8_t*>(f.payload.data());
      seen.connection_credit +=
          ((std::uint32_t{p[0]} & 0x7f) << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
    }
    if (f.kind() == h2::FrameType::kGoaway) seen.goaway = true;
  }
  return seen;
}

}  // namespace stream_ends

using namespace stream_ends;

// 150 uploads of 1,000 bytes each, reset in the same write as their head (no handler ever runs
// for them), and 50 more whose Content-Length their body overruns (the session resets them):
// twice the connection's window in all. Their bytes come back to the window: no FLOW_CONTROL
// GOAWAY, and a last upload is answered.
TEST(Http2StreamEnds, BodiesOfStreamsEndedBeforeTheirHandlerReadThemGiveTheirWindowBack) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  std::atomic<int> handled{0};
  ServerOptions options{.http2 = true};
  options.http2_limits.connection_window = 65535;
  options.http2_limits.stream_window = 65535;
  auto server = spindle::testing::start_http_server(runtime, counting_router(handled), options);
  ASSERT_NE(server, nullptr);
  runtime.block_on([&] {
    auto c = RawH2::connect(server->address());
    ASSERT_TRUE(c.has_value());
    h2::hpack::Encoder encoder;
    std::string batch;
    std::uint32_t id = 1;
    const std::string body(1000, 'b');
    for (int i = 0; i < 150; ++i, id += 2) {
      h2::write::headers(
          batch, id,
          block_of(
              encoder,
              {{":method", "POST"}, {":scheme", "http"}, {":path", "/sink"}, {":authority", "a"}}),
          false);
      h2::write::data(batch, id, body, false);
      h2::write::rst_stream(batch, id, h2::ErrorCode::kCancel);
    }
    for (int i = 0; i < 50; ++i, id += 2) {
      h2::write::headers(batch, id,
                         block_of(encoder, {{":method", "POST"},
                                            {":scheme", "http"},
                                            {":path", "/sink"},
                                            {":authority", "a"},
                                            {"content-length", "1500"}}),
                         false);
      h2::write::data(batch, id, body, false);
      h2::write::data(batch, id, body, false);  // 2,000 of 1,500: a stream error
    }
    ASSERT_TRUE(c->send(batch));
    const std::uint32_t last = id;
    std::string final_request;
    h2::write::headers(
        final_request, last,
        block_of(
            encoder,
            {{":method", "POST"}, {":scheme", "http"}, {":path", "/sink"}, {":authority", "a"}}),
        false);
    h2::write::data(final_request, last, std::string(10000, 'z'), false);
    h2::write::data(final_request, last, std::string(10000, 'z'), true);
    ASSERT_TRUE(c->send(final_request));
    Seen seen = read_until(*c, last);
    EXPECT_FALSE(seen.goaway);
    EXPECT_EQ(seen.response.status, 200);
    EXPECT_EQ(seen.response.body, "20000");
    // What the 200 streams sent came back to the window (in batches of half of it).
    EXPECT_GE(seen.connection_credit + 65535 / 2, 250u * 1000 + 20000);
  });
  // (Few of the ended streams reached a handler: those whose reset came in a later read than
  // their head. Those give back what they left when they end.)
  EXPECT_LT(handled.load(), 20);
  EXPECT_TRUE(server->drain(Deadline::after(5s)));
}

TEST(Http2StreamEnds, AnAsteriskPathIsAnOptionsRequestsOnlyAndNeverReachesAHandler) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  std::atomic<int> handled{0};
  auto server = spindle::testing::start_http_server(runtime, counting_router(handled),
                                                    ServerOptions{.http2 = true});
  ASSERT_NE(server, nullptr);
  runtime.block_on([&] {
    auto c = RawH2::connect(server->address());
    ASSERT_TRUE(c.has_value());
    h2::hpack::Encoder encoder;
    std::uint32_t id = 1;
    for (std::string_view method : {"GET", "POST", "DELETE", "HEAD"}) {
      std::string out;
      h2::write::headers(
          out, id,
          block_of(encoder,
                   {{":method", method}, {":scheme", "http"}, {":path", "*"}, {":authority", "a"}}),
          true);
      ASSERT_TRUE(c->send(out));
      RawH2::Response r = c->response(id);
      EXPECT_EQ(r.reset, h2::ErrorCode::kProtocolError) << method;
      id += 2;
    }
    EXPECT_EQ(handled.load(), 0);
    // OPTIONS * is a request (the router answers it), and the connection went on throughout.
    std::string out;
    h2::write::headers(
        out, id,
        block_of(
            encoder,
            {{":method", "OPTIONS"}, {":scheme", "http"}, {":path", "*"}, {":authority", "a"}}),
        true);
    ASSERT_TRUE(c->send(out));
    RawH2::Response r = c->response(id);
    EXPECT_FALSE(r.reset.has_value());
    EXPECT_NE(r.status, 0);
  });
  EXPECT_TRUE(server->drain(Deadline::after(5s)));
}

namespace stream_ends {

// Sends `bytes` on a fresh h2c connection (after the preface and SETTINGS unless `raw`) and
// waits for its end: the GOAWAY's debug text ("" if none came before the close), and whether
// the server closed it within `within`.
struct Ending {
  std::string goaway_reason;
  bool closed = false;
};
Ending hold_partial(const Address& address, std::string_view bytes, bool raw,
                    std::chrono::milliseconds within) {
  Ending ending;
  auto tcp = TcpStream::connect(address, Deadline::after(5s));
  EXPECT_TRUE(tcp.has_value());
  if (!tcp) return ending;
  std::string out;
  if (!raw) {
    out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    h2::write::settings(out, {});
  }
  out += bytes;
  EXPECT_TRUE(tcp->write_all(out, Deadline::after(5s)).has_value());
  h2::FrameReader reader(1 << 20);
  Deadline deadline = Deadline::after(within);
  char buffer[16384];
  for (;;) {
    auto n = tcp->read(buffer, deadline);
    if (!n) return ending;  // still open at the deadline
    if (*n == 0) {
      ending.closed = true;
      return ending;
    }
    (void)reader.feed(std::span(reinterpret_cast<const std::uint8_t*>(buffer), *n),
                      [&](const h2::Frame& f) {
                        if (f.kind() == h2::FrameType::kGoaway) {
                          ending.goaway_reason.assign(
                              reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
                        }
                        return true;
                      });
  }
}

}  // namespace stream_ends

// A header block left unfinished, a HEADERS frame cut short, a preface cut short: each holds
// the connection (and up to a block's memory) no longer than timeouts.header, then GOAWAY and
// the close; the server's count of connections comes back to none. A connection idle after a
// whole request stays (its keep-alive timeout is another matter).
TEST(Http2StreamEnds, AHeadNotWholeWithinTheHeaderTimeoutEndsTheConnection) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  std::atomic<int> handled{0};
  ServerOptions options{.http2 = true};
  options.header_timeout = 300ms;
  auto server = spindle::testing::start_http_server(runtime, counting_router(handled), options);
  ASSERT_NE(server, nullptr);
  runtime.block_on([&] {
    h2::hpack::Encoder encoder;
    const std::string block = block_of(encoder, {{":method", "GET"},
                                                 {":scheme", "http"},
                                                 {":path", "/hello"},
                                                 {":authority", "a"},
                                                 {"x-pad", std::string(3000, 'p')}});
    std::string unfinished;  // HEADERS without END_HEADERS, its CONTINUATION never sent
    h2::write::frame_header(unfinished, static_cast<std::uint32_t>(block.size() / 2),
                            h2::FrameType::kHeaders, h2::flag::kEndStream, 1);
    unfinished += block.substr(0, block.size() / 2);
    std::string cut;  // a HEADERS frame of which half arrives
    h2::write::headers(cut, 1, block, true);
    cut.resize(cut.size() / 2);
    const std::string preface_cut = "PRI * HTTP/2.0\r\n\r\nSM\r\n";
    for (auto [what, bytes, raw] :
         {std::tuple{"an unfinished block", std::string_view(unfinished), false},
          std::tuple{"a frame cut short", std::string_view(cut), false},
          std::tuple{"a preface cut short", std::string_view(preface_cut), true}}) {
      SCOPED_TRACE(what);
      Ending ending = hold_partial(server->address(), bytes, raw, 5s);
      EXPECT_TRUE(ending.closed);
      if (!raw) EXPECT_EQ(ending.goaway_reason, "request header too slow");
    }
    {
      // A block trickled in, a byte every 50 ms: the timeout counts from its first byte.
      auto tcp = TcpStream::connect(server->address(), Deadline::after(5s));
      ASSERT_TRUE(tcp.has_value());
      std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
      h2::write::settings(out, {});
      h2::write::frame_header(out, static_cast<std::uint32_t>(block.size()),
                              h2::FrameType::kHeaders, h2::flag::kEndHeaders, 3);
      ASSERT_TRUE(tcp->write_all(out, Deadline::after(5s)).has_value());
      bool closed = false;
      char buffer[4096];
      for (std::size_t at = 0; at < block.size() && !closed; ++at) {
        if (!tcp->write_all(block.substr(at, 1), Deadline::after(1s))) break;
        for (;;) {
          auto n = tcp->read(buffer, Deadline::after(50ms));
          if (!n) break;  // nothing more for now
          if (*n == 0) {
            closed = true;
            break;
          }
        }
        if (at > 100) break;  // 5 s: far past the timeout
      }
      EXPECT_TRUE(closed) << "a trickled block";
    }
    for (int i = 0; i < 100 && server->connections() != 0; ++i) (void)this_fiber::sleep_for(10ms);
    EXPECT_EQ(server->connections(), 0u);
    // Idle after a whole request: still open after twice the header timeout.
    auto c = RawH2::connect(server->address());
    ASSERT_TRUE(c.has_value());
    c->get(1, "/hello");
    EXPECT_EQ(c->response(1).body, "hello");
    (void)this_fiber::sleep_for(700ms);
    c->get(3, "/hello");
    EXPECT_EQ(c->response(3).body, "hello");
  });
  EXPECT_EQ(handled.load(), 2);
  EXPECT_TRUE(server->drain(Deadline::after(5s)));
}
