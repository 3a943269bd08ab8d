// Rules of the session at their edges: `:path *` is an OPTIONS request's only (RFC 9113
// §8.3.1); a DATA frame of padding alone carries nothing, and counts as an empty frame
// (CVE-2019-9518) whatever its length; a header block or preface begun is a pending head (the
// driver's header timeout).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "h2_testing.h"
#include "spindle/h2/session.h"

using namespace spindle::h2;
using spindle::testing::bytes;

namespace edges {

// What a server's handler is told, per stream.
struct Heard : SessionHandler {
  std::vector<std::uint32_t> heads, resets;
  void on_field(std::uint32_t, const spindle::http::Field&) override {}
  void on_headers(std::uint32_t id, bool, bool) override { heads.push_back(id); }
  void on_data(std::uint32_t, std::span<const std::uint8_t>, bool) override {}
  void on_reset(std::uint32_t id, ErrorCode) override { resets.push_back(id); }
  void on_window(std::uint32_t) override {}
};

std::string preface_and_settings() {
  std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  write::settings(out, {});
  return out;
}

std::string block_of(std::vector<hpack::Field> fields) {
  hpack::Encoder encoder;
  std::string block;
  encoder.encode(fields, block);
  return block;
}

// The RST_STREAM and GOAWAY codes a session wrote, by stream (GOAWAY under stream 0).
std::vector<std::pair<std::uint32_t, ErrorCode>> errors_in(const std::string& out) {
  std::vector<std::pair<std::uint32_t, ErrorCode>> errors;
  FrameReader reader(1 << 24);
  (void)reader.feed(bytes(out), [&](const Frame& f) {
    if (f.kind() == FrameType::kRstStream || f.kind() == FrameType::kGoaway) {
      errors.emplace_back(f.kind() == FrameType::kGoaway ? 0 : f.stream_id,
                          static_cast<ErrorCode>(f.error_code));
    }
    return true;
  });
  return errors;
}

// A DATA frame of padding alone: the pad length byte and `pad` bytes.
void padding_only(std::string& out, std::uint32_t id, std::uint8_t pad) {
  write::frame_header(out, 1u + pad, FrameType::kData, flag::kPadded, id);
  out += static_cast<char>(pad);
  out.append(pad, '\0');
}

}  // namespace edges

using namespace edges;

TEST(H2SessionEdges, AnAsteriskPathIsAnOptionsRequestsOnly) {
  for (std::string_view method : {"GET", "POST", "DELETE", "HEAD", "PUT", "OPTIONS"}) {
    SCOPED_TRACE(method);
    Heard heard;
    ServerSession session({}, heard);
    std::string in = preface_and_settings();
    // Either order of :method and :path.
    write::headers(
        in, 1,
        block_of({{":method", method}, {":scheme", "https"}, {":path", "*"}, {":authority", "a"}}),
        true);
    write::headers(
        in, 3,
        block_of({{":path", "*"}, {":scheme", "https"}, {":authority", "a"}, {":method", method}}),
        true);
    ASSERT_TRUE(session.receive(bytes(in)));  // a stream error each at most: the connection lives
    auto errors = errors_in(session.take_output());
    if (method == "OPTIONS") {
      EXPECT_EQ(heard.heads, (std::vector<std::uint32_t>{1, 3}));
      EXPECT_TRUE(errors.empty());
    } else {
      EXPECT_TRUE(heard.heads.empty());  // the handler never sees it
      EXPECT_EQ(errors, (std::vector<std::pair<std::uint32_t, ErrorCode>>{
                            {1, ErrorCode::kProtocolError}, {3, ErrorCode::kProtocolError}}));
    }
  }
}

TEST(H2SessionEdges, DataFramesOfPaddingAloneCountAsEmptyFrames) {
  for (std::uint8_t pad : {0, 1, 200}) {
    SCOPED_TRACE(static_cast<int>(pad));
    Heard heard;
    SessionLimits limits;
    limits.connection_window = 1 << 30;  // the padding's window is no limit here
    ServerSession session(limits, heard);
    std::string in = preface_and_settings();
    write::headers(
        in, 1,
        block_of({{":method", "POST"}, {":scheme", "https"}, {":path", "/"}, {":authority", "a"}}),
        false);
    ASSERT_TRUE(session.receive(bytes(in)));
    std::string flood;
    for (std::size_t i = 0; i < limits.empty_frame_budget + 1; ++i) padding_only(flood, 1, pad);
    EXPECT_FALSE(session.receive(bytes(flood)));
    auto errors = errors_in(session.take_output());
    ASSERT_FALSE(errors.empty());
    EXPECT_EQ(errors.back(), (std::pair<std::uint32_t, ErrorCode>{0, ErrorCode::kEnhanceYourCalm}));
  }
}

TEST(H2SessionEdges, AHeadIsPendingFromItsFirstByteToItsLast) {
  Heard heard;
  ServerSession session({}, heard);
  EXPECT_FALSE(session.head_pending());
  std::string in = preface_and_settings();
  // The preface in two pieces: pending between them.
  ASSERT_TRUE(session.receive(bytes(std::string_view(in).substr(0, 5))));
  EXPECT_TRUE(session.head_pending());
  ASSERT_TRUE(session.receive(bytes(std::string_view(in).substr(5))));
  EXPECT_FALSE(session.head_pending());
  // HEADERS without END_HEADERS, then its CONTINUATION, each in pieces.
  std::string block =
      block_of({{":method", "GET"}, {":scheme", "https"}, {":path", "/"}, {":authority", "a"}});
  std::string frames;
  write::frame_header(frames, 3, FrameType::kHeaders, flag::kEndStream, 1);
  frames += block.substr(0, 3);
  write::frame_header(frames, static_cast<std::uint32_t>(block.size() - 3),
                      FrameType::kContinuation, flag::kEndHeaders, 1);
  frames += block.substr(3);
  for (std::size_t at = 0; at < frames.size(); ++at) {
    ASSERT_TRUE(session.receive(bytes(std::string_view(frames).substr(at, 1))));
    // From the frame's type byte (the fourth) to the block's last byte.
    EXPECT_EQ(session.head_pending(), at >= 3 && at + 1 < frames.size()) << at;
  }
  EXPECT_EQ(heard.heads, (std::vector<std::uint32_t>{1}));
  // A DATA frame in pieces is no head.
  std::string data;
  write::data(data, 1, "abc", false);
  ASSERT_TRUE(session.receive(bytes(std::string_view(data).substr(0, 6))));
  EXPECT_FALSE(session.head_pending());
}

// Every path where a stream ends before its DATA is consumed gives that DATA's window back to
// the connection (item 3 of issue 68): the stream errors we raise on DATA (before the response's
// head, past the stream's window, on a stream whose peer had ended it) and DATA on streams
// that are gone. What the peer may send plus what waits to be given back is the whole window.
TEST(H2SessionEdges, DataOnStreamsThatEndBeforeItIsReadGivesItsWindowBack) {
  Heard heard;
  SessionLimits limits;  // the connection's window reopens as DATA is consumed
  ClientSession client(limits, heard);
  std::string settings;
  write::settings(settings, {});
  ASSERT_TRUE(client.receive(bytes(settings)));
  (void)client.take_output();  // the preface and SETTINGS
  const std::int64_t whole = limits.connection_window;
  auto lost = [&] {
    auto w = client.windows(0);
    return whole - (w->receive + static_cast<std::int64_t>(w->unacked));
  };
  const hpack::Field get[] = {
      {":method", "GET"}, {":scheme", "http"}, {":authority", "a"}, {":path", "/"}};
  hpack::Encoder encoder;
  auto head = [&](std::string& in, std::uint32_t id, std::string_view status, bool end) {
    std::string block;
    encoder.encode({{":status", status}}, block);
    write::headers(in, id, block, end);
  };
  // DATA before the response's head, and after an interim one: a stream error each.
  for (bool interim : {false, true}) {
    std::uint32_t id = client.open(get, true);
    std::string in;
    if (interim) head(in, id, "103", false);
    write::data(in, id, std::string(1000, 'd'), false);
    ASSERT_TRUE(client.receive(bytes(in)));
    auto errors = errors_in(client.take_output());
    ASSERT_FALSE(errors.empty()) << interim;
    EXPECT_EQ(errors.back(), (std::pair<std::uint32_t, ErrorCode>{id, ErrorCode::kProtocolError}));
    EXPECT_EQ(lost(), 0) << interim;
  }
  // DATA after the peer ended the stream (it is half-closed there): STREAM_CLOSED.
  std::uint32_t ended = client.open(get, false);
  std::string in;
  head(in, ended, "200", true);
  write::data(in, ended, std::string(700, 'd'), false);
  ASSERT_TRUE(client.receive(bytes(in)));
  auto errors = errors_in(client.take_output());
  ASSERT_FALSE(errors.empty());
  EXPECT_EQ(errors.back(), (std::pair<std::uint32_t, ErrorCode>{ended, ErrorCode::kStreamClosed}));
  EXPECT_EQ(lost(), 0);
  // DATA on a stream that is gone, and on one we reset (ignored).
  std::string more;
  write::data(more, ended, std::string(300, 'd'), false);
  std::uint32_t reset = client.open(get, true);
  client.reset(reset, ErrorCode::kCancel);
  write::data(more, reset, std::string(400, 'd'), false);
  ASSERT_TRUE(client.receive(bytes(more)));
  EXPECT_EQ(lost(), 0);
}
