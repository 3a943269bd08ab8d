// A request HTTP/2 takes is one HTTP/1.1 would take written the same way: every byte 0x00-0xff
// inside the method, the path or a field value gets the same verdict from the server session
// (its head to the handler, or the stream reset PROTOCOL_ERROR) as from the HTTP/1.1 parser
// (a head, or 400). What one would refuse and the other take would reach an upstream's writer
// that cannot write it, and the client would be told the upstream failed.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "h2_testing.h"
#include "spindle/h1/parser.h"
#include "spindle/h2/session.h"

using namespace spindle::h2;
using spindle::testing::bytes;

namespace agreement {

// The streams whose head reached the handler.
struct Heads : SessionHandler {
  std::vector<std::uint32_t> heads;
  void on_field(std::uint32_t, const spindle::http::Field&) override {}
  void on_headers(std::uint32_t id, bool, bool) override { heads.push_back(id); }
  void on_data(std::uint32_t, std::span<const std::uint8_t>, bool) override {}
  void on_reset(std::uint32_t, ErrorCode) override {}
  void on_window(std::uint32_t) override {}
};

// A request's three parts with one byte put inside one of them.
struct Request {
  std::string method = "GET", path = "/p", value = "v";
};

enum class Place { kMethod, kPath, kValue };

Request with_byte(Place place, char c) {
  Request r;
  if (place == Place::kMethod) r.method = std::string("G") + c + "ET";
  if (place == Place::kPath) r.path = std::string("/a") + c + "b";
  if (place == Place::kValue) r.value = std::string("v") + c + "w";
  return r;
}

// HTTP/1.1's verdict: the parser takes the head whole.
bool h1_takes(const Request& r) {
  const std::string wire =
      r.method + " " + r.path + " HTTP/1.1\r\nHost: a\r\nx-a: " + r.value + "\r\n\r\n";
  spindle::http::RequestParser parser;
  spindle::http::RequestHead head;
  return parser.parse(wire, head).state == spindle::http::ParseResult::State::kComplete;
}

// HTTP/2's verdict: the session gives the handler the head (and resets nothing); false if it
// resets the stream PROTOCOL_ERROR. The connection lives either way.
bool h2_takes(const Request& r) {
  Heads heard;
  ServerSession session({}, heard);
  std::string in = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  write::settings(in, {});
  hpack::Encoder encoder;
  std::string block;
  encoder.encode(std::vector<hpack::Field>{{":method", r.method},
                                           {":scheme", "http"},
                                           {":authority", "a"},
                                           {":path", r.path},
                                           {"x-a", r.value}},
                 block);
  write::headers(in, 1, block, true);
  EXPECT_TRUE(session.receive(bytes(in)));
  std::string out = session.take_output();
  bool reset = false;
  FrameReader reader(1 << 24);
  (void)reader.feed(bytes(out), [&](const Frame& f) {
    EXPECT_NE(f.kind(), FrameType::kGoaway);
    if (f.kind() == FrameType::kRstStream) {
      EXPECT_EQ(static_cast<ErrorCode>(f.error_code), ErrorCode::kProtocolError);
      reset = true;
    }
    return true;
  });
  EXPECT_NE(reset, heard.heads == std::vector<std::uint32_t>{1});
  return !reset;
}

}  // namespace agreement

using namespace agreement;

TEST(H2Http1Agreement, EveryByteInAMethodPathOrValueGetsHttp1sVerdict) {
  int refused = 0;
  for (Place place : {Place::kMethod, Place::kPath, Place::kValue}) {
    for (int n = 0; n < 256; ++n) {
      SCOPED_TRACE(testing::Message() << "place " << static_cast<int>(place) << " byte " << n);
      const Request r = with_byte(place, static_cast<char>(n));
      const bool h1 = h1_takes(r);
      EXPECT_EQ(h2_takes(r), h1);
      refused += h1 ? 0 : 1;
    }
  }
  // (Both refuse something in each place: controls, DEL, a space in the method or path.)
  EXPECT_GT(refused, 3 * 33);
}
