// The ignore path after our resets, attacked (issue 68's review): frames a peer may send on a
// stream we reset are ignored, and that must not make a free flood. What a peer that wants to
// hurt us can do there, and where each stops: the memory of resets bounded whether or not it
// answers our PINGs; our PINGs one at a time; answers to PINGs we did not send worth nothing;
// DATA bounded by the window the stream had; header blocks past a message's counted; frames
// after the stream's end errors; a crossing reset free once only.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "h2_testing.h"
#include "spindle/h2/session.h"

using namespace spindle::h2;
using spindle::testing::bytes;

namespace attacks {

struct Quiet : SessionHandler {
  std::size_t heads = 0;
  void on_field(std::uint32_t, const spindle::http::Field&) override {}
  void on_headers(std::uint32_t, bool, bool) override { ++heads; }
  void on_data(std::uint32_t, std::span<const std::uint8_t>, bool) override {}
  void on_reset(std::uint32_t, ErrorCode) override {}
  void on_window(std::uint32_t) override {}
};

struct Tally {
  std::size_t pings = 0, resets = 0, goaways = 0, window_updates = 0;
  ErrorCode goaway_code = ErrorCode::kNoError;
  std::vector<std::string> ping_payloads;
};
Tally tally(const std::string& out) {
  Tally t;
  FrameReader reader(1 << 24);
  (void)reader.feed(bytes(out), [&](const Frame& f) {
    switch (f.kind()) {
      case FrameType::kPing:
        if (!f.has(flag::kAck)) {
          ++t.pings;
          t.ping_payloads.emplace_back(reinterpret_cast<const char*>(f.payload.data()), 8);
        }
        break;
      case FrameType::kRstStream:
        ++t.resets;
        break;
      case FrameType::kGoaway:
        ++t.goaways;
        t.goaway_code = static_cast<ErrorCode>(f.error_code);
        break;
      case FrameType::kWindowUpdate:
        ++t.window_updates;
        break;
      default:
        break;
    }
    return true;
  });
  return t;
}

std::string client_preface() {
  std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  write::settings(out, {});
  return out;
}

std::string post_head(hpack::Encoder& encoder) {
  std::string block;
  encoder.encode({{":method", "POST"}, {":scheme", "https"}, {":path", "/"}, {":authority", "a"}},
                 block);
  return block;
}

std::string ping_ack(std::string_view payload) {
  std::string out;
  write::ping(
      out,
      std::span<const std::uint8_t, 8>(reinterpret_cast<const std::uint8_t*>(payload.data()), 8),
      true);
  return out;
}

}  // namespace attacks

using namespace attacks;

// A client that answers no PING while the server resets stream after stream (its handlers give
// up): the memory of resets stays within twice the streams allowed open plus 64, and one PING
// is all the server ever sent for them.
TEST(H2SessionAttacks, APeerThatAnswersNoPingGetsOnePingAndABoundedMemory) {
  Quiet quiet;
  SessionLimits limits;
  limits.max_concurrent_streams = 100;
  ServerSession server(limits, quiet);
  hpack::Encoder encoder;
  ASSERT_TRUE(server.receive(bytes(client_preface())));
  (void)server.take_output();
  std::size_t pings = 0, most = 0;
  for (std::uint32_t id = 1; id < 2 * 20000; id += 2) {
    std::string in;
    write::headers(in, id, post_head(encoder), false);
    ASSERT_TRUE(server.receive(bytes(in)));
    server.reset(id, ErrorCode::kCancel);
    pings += tally(server.take_output()).pings;
    most = std::max(most, server.unacknowledged_resets());
  }
  EXPECT_EQ(pings, 1u);
  EXPECT_EQ(most, 2u * 100 + 64);
  // The most recent resets are the ones kept: what the client sent on them before it knew is
  // still ignored, without a reset.
  std::string late;
  write::data(late, 2 * 20000 - 1, "late", false);
  ASSERT_TRUE(server.receive(bytes(late)));
  EXPECT_EQ(tally(server.take_output()).resets, 0u);
}

// Answers to PINGs we did not send (our tag, another number; another payload) forget nothing
// and cost nothing; the answer to ours forgets what it covers, and the next PING goes then.
TEST(H2SessionAttacks, AnswersToPingsWeDidNotSendForgetNothing) {
  Quiet quiet;
  ServerSession server({}, quiet);
  hpack::Encoder encoder;
  std::string in = client_preface();
  for (std::uint32_t id = 1; id <= 9; id += 2) write::headers(in, id, post_head(encoder), false);
  ASSERT_TRUE(server.receive(bytes(in)));
  (void)server.take_output();
  for (std::uint32_t id = 1; id <= 5; id += 2) server.reset(id, ErrorCode::kCancel);
  Tally first = tally(server.take_output());
  ASSERT_EQ(first.pings, 1u);
  const std::string ours = first.ping_payloads[0];
  server.reset(7, ErrorCode::kCancel);               // after the PING: the next one covers it
  EXPECT_EQ(tally(server.take_output()).pings, 0u);  // one in flight at a time
  std::string forged = ours;
  forged[7] = static_cast<char>(forged[7] + 1);
  std::string spoof;
  for (int i = 0; i < 1000; ++i) {
    spoof += ping_ack(forged);
    spoof += ping_ack("12345678");
  }
  ASSERT_TRUE(server.receive(bytes(spoof)));
  EXPECT_EQ(server.unacknowledged_resets(), 4u);
  Tally after_spoof = tally(server.take_output());
  EXPECT_EQ(after_spoof.pings + after_spoof.resets + after_spoof.goaways, 0u);
  ASSERT_TRUE(server.receive(bytes(ping_ack(ours))));
  EXPECT_EQ(server.unacknowledged_resets(), 1u);  // stream 7 waits for the next PING
  Tally next = tally(server.take_output());
  ASSERT_EQ(next.pings, 1u);
  ASSERT_TRUE(server.receive(bytes(ping_ack(next.ping_payloads[0]))));
  EXPECT_EQ(server.unacknowledged_resets(), 0u);
  // Known now: what it sends on them is its own error again.
  std::string data;
  write::data(data, 7, "x", false);
  ASSERT_TRUE(server.receive(bytes(data)));
  EXPECT_EQ(tally(server.take_output()).resets, 1u);
}

// DATA on a stream we reset: within the window the stream had it is ignored (the connection's
// window given back in batches, not a WINDOW_UPDATE a frame); one byte past it is a stream
// error, and what follows is as on any closed stream, counted against the reset budget to
// GOAWAY.
TEST(H2SessionAttacks, DataOnAResetStreamStopsAtTheWindowItHad) {
  Quiet quiet;
  SessionLimits limits;
  limits.stream_window = 65535;
  limits.connection_window = 1 << 30;
  limits.reset_budget = 50;
  ServerSession server(limits, quiet);
  hpack::Encoder encoder;
  std::string in = client_preface();
  write::headers(in, 1, post_head(encoder), false);
  write::data(in, 1, std::string(1535, 'd'), false);  // 64,000 of its window left
  ASSERT_TRUE(server.receive(bytes(in)));
  server.reset(1, ErrorCode::kCancel);
  (void)server.take_output();
  std::string flood;
  for (int i = 0; i < 64000; ++i) write::data(flood, 1, "d", false);  // a byte a frame
  ASSERT_TRUE(server.receive(bytes(flood)));
  Tally within = tally(server.take_output());
  EXPECT_EQ(within.resets, 0u);
  EXPECT_LE(within.window_updates, 1u);
  std::string past;
  write::data(past, 1, "d", false);
  ASSERT_TRUE(server.receive(bytes(past)));
  Tally one = tally(server.take_output());
  EXPECT_EQ(one.resets, 1u);  // FLOW_CONTROL_ERROR
  std::string more;
  for (int i = 0; i < 100; ++i) write::data(more, 1, "d", false);
  EXPECT_FALSE(server.receive(bytes(more)));
  Tally end = tally(server.take_output());
  EXPECT_EQ(end.goaway_code, ErrorCode::kEnhanceYourCalm);
}

// An upstream that floods a stream we reset with interim heads: a response's few are ignored,
// the rest counted as resets until GOAWAY. Its resets of streams we reset cost nothing once
// each; again on the same stream, they count.
TEST(H2SessionAttacks, AnUpstreamFloodingAStreamWeResetIsStopped) {
  for (bool resets : {false, true}) {
    SCOPED_TRACE(resets ? "resets" : "interim heads");
    Quiet quiet;
    SessionLimits limits;
    limits.reset_budget = 30;
    ClientSession client(limits, quiet);
    std::string settings;
    write::settings(settings, {});
    ASSERT_TRUE(client.receive(bytes(settings)));
    (void)client.take_output();
    const hpack::Field get[] = {
        {":method", "GET"}, {":scheme", "http"}, {":authority", "a"}, {":path", "/"}};
    std::uint32_t id = client.open(get, true);
    client.reset(id, ErrorCode::kCancel);
    (void)client.take_output();
    hpack::Encoder encoder;
    std::string flood;
    for (int i = 0; i < 100; ++i) {
      if (resets) {
        write::rst_stream(flood, id, ErrorCode::kCancel);
      } else {
        std::string block;
        encoder.encode({{":status", "103"}}, block);
        write::headers(flood, id, block, false);
      }
    }
    EXPECT_FALSE(client.receive(bytes(flood)));
    EXPECT_EQ(tally(client.take_output()).goaway_code, ErrorCode::kEnhanceYourCalm);
  }
}
