// HTTP/2 frames: written by write::, read back by FrameReader from the whole and from every
// split (two pieces at each offset, and one byte at a time); what a frame's own bytes can get
// wrong, each with the error RFC 9113 gives it.
#include "spindle/h2/frame.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "h2_testing.h"

using namespace spindle::h2;
using spindle::testing::bytes;
using namespace std::string_view_literals;

namespace {

// What a test compares of a frame (its views copied).
struct Seen {
  int type, flags;
  std::uint32_t stream, length;
  std::string payload;
  std::uint32_t error_code, other_stream, increment, depends_on;
  int stream_error;
  bool operator==(const Seen&) const = default;
};

Seen seen(const Frame& f) {
  return {f.type,
          f.flags,
          f.stream_id,
          f.length,
          std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()),
          f.error_code,
          f.other_stream,
          f.increment,
          f.depends_on,
          f.stream_error ? static_cast<int>(*f.stream_error) : -1};
}

// Reads `input` cut at `cuts` (offsets); the frames, and the error if one came.
std::vector<Seen> read(std::string_view input, std::vector<std::size_t> cuts,
                       std::optional<FrameError>* error = nullptr,
                       std::uint32_t max_frame_size = kDefaultMaxFrameSize) {
  FrameReader reader(max_frame_size);
  std::vector<Seen> out;
  std::size_t from = 0;
  cuts.push_back(input.size());
  for (std::size_t cut : cuts) {
    auto e = reader.feed(bytes(input.substr(from, cut - from)), [&](const Frame& f) {
      out.push_back(seen(f));
      return true;
    });
    from = cut;
    if (e) {
      if (error) *error = e;
      return out;
    }
  }
  return out;
}

std::string frame(std::uint32_t length, std::uint8_t type, std::uint8_t flags, std::uint32_t stream,
                  std::string_view payload) {
  std::string out;
  write::frame_header(out, length, static_cast<FrameType>(type), flags, stream);
  out += payload;
  return out;
}

}  // namespace

// A header block encoded straight into the output after room for its frame header: the
// header is filled in where it fits one frame, the block split into CONTINUATION where not,
// the same frames write::headers makes.
TEST(Frames, AHeaderBlockWrittenInPlaceIsTheSameFrames) {
  for (std::size_t size : {0, 1, 16, 17, 40}) {
    const std::string block(size, 'b');
    std::string expected = "before";
    write::headers(expected, 5, block, true, 16);
    std::string out = "before";
    const std::size_t at = out.size();
    out.append(9, '\0');
    out += block;
    write::headers_in_place(out, at, 5, true, 16);
    EXPECT_EQ(out, expected) << size;
  }
}

TEST(Frames, WrittenFramesReadBackFromEverySplit) {
  std::string out;
  const std::pair<SettingId, std::uint32_t> entries[] = {{SettingId::kMaxConcurrentStreams, 100},
                                                         {SettingId::kInitialWindowSize, 65535}};
  write::settings(out, entries);
  write::settings_ack(out);
  write::headers(out, 1, std::string(40, 'h'), false, 16);  // HEADERS + 2 CONTINUATION
  write::data(out, 1, "hello", true);
  const std::uint8_t opaque[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  write::ping(out, opaque, true);
  write::window_update(out, 0, 1 << 20);
  write::rst_stream(out, 3, ErrorCode::kCancel);
  write::goaway(out, 7, ErrorCode::kEnhanceYourCalm, "calm");
  out += frame(3, 0xfa, 0, 9, "???"sv);  // an unknown type: delivered, to be ignored

  auto whole = read(out, {});
  ASSERT_EQ(whole.size(), 11u);
  EXPECT_EQ(whole[0].type, 4);
  EXPECT_EQ(whole[0].payload.size(), 12u);
  EXPECT_EQ(whole[1].flags, flag::kAck);
  EXPECT_EQ(whole[2].payload, std::string(16, 'h'));
  EXPECT_EQ(whole[2].flags, 0);
  EXPECT_EQ(whole[4].type, 9);
  EXPECT_EQ(whole[4].flags, flag::kEndHeaders);
  EXPECT_EQ(whole[5].payload, "hello");
  EXPECT_EQ(whole[5].flags, flag::kEndStream);
  EXPECT_EQ(whole[6].payload, std::string("\1\2\3\4\5\6\7\10", 8));
  EXPECT_EQ(whole[7].increment, 1u << 20);
  EXPECT_EQ(whole[8].error_code, 8u);
  EXPECT_EQ(whole[9].other_stream, 7u);
  EXPECT_EQ(whole[9].error_code, 11u);
  EXPECT_EQ(whole[9].payload, "calm");
  EXPECT_EQ(whole[10].type, 0xfa);

  for (std::size_t cut = 0; cut <= out.size(); ++cut) {
    EXPECT_EQ(read(out, {cut}), whole) << "cut at " << cut;
  }
  std::vector<std::size_t> every;
  for (std::size_t i = 1; i < out.size(); ++i) every.push_back(i);
  EXPECT_EQ(read(out, every), whole);
  std::vector<Seen> settings;
  for_each_setting(bytes(whole[0].payload), [&](std::uint16_t id, std::uint32_t value) {
    settings.push_back({id, 0, value, 0, {}, 0, 0, 0, 0, 0});
  });
  ASSERT_EQ(settings.size(), 2u);
  EXPECT_EQ(settings[0].type, 3);
  EXPECT_EQ(settings[0].stream, 100u);
}

TEST(Frames, PaddingIsRemovedAndCountedInTheLength) {
  std::string padded = frame(9, 0x0, flag::kPadded | flag::kEndStream, 1,
                             "\x03"
                             "abcde"
                             "\0\0\0"sv);
  auto f = read(padded, {});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].payload, "abcde");
  EXPECT_EQ(f[0].length, 9u);  // flow control counts the padding
  // HEADERS padded and with a priority: both removed.
  std::string h = frame(10, 0x1, flag::kPadded | flag::kPriority | flag::kEndHeaders, 3,
                        std::string("\x02"
                                    "\x00\x00\x00\x01"
                                    "\x10"
                                    "ab"
                                    "\0\0",
                                    10));
  f = read(h, {});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].payload, "ab");
  EXPECT_EQ(f[0].depends_on, 1u);
}

TEST(Frames, WhatAFramesOwnBytesGetWrongIsTheErrorRfc9113Says) {
  struct Case {
    std::string bytes;
    ErrorCode code;
  };
  std::vector<Case> cases = {
      {frame(1, 0x0, 0, 0, "x"sv), ErrorCode::kProtocolError},                  // DATA on 0
      {frame(1, 0x1, flag::kEndHeaders, 0, "x"sv), ErrorCode::kProtocolError},  // HEADERS on 0
      {frame(5, 0x2, 0, 0, "\0\0\0\1\1"sv), ErrorCode::kProtocolError},         // PRIORITY on 0
      {frame(4, 0x3, 0, 0, "\0\0\0\0"sv), ErrorCode::kProtocolError},           // RST on 0
      {frame(3, 0x3, 0, 1, "\0\0\0"sv), ErrorCode::kFrameSizeError},            // RST of 3
      {frame(6, 0x4, 0, 1, std::string(6, '\0')), ErrorCode::kProtocolError},   // SETTINGS on 1
      {frame(5, 0x4, 0, 0, std::string(5, '\0')), ErrorCode::kFrameSizeError},  // not 6s
      {frame(6, 0x4, flag::kAck, 0, std::string(6, '\0')), ErrorCode::kFrameSizeError},
      {frame(7, 0x6, 0, 0, std::string(7, '\0')), ErrorCode::kFrameSizeError},  // PING of 7
      {frame(8, 0x6, 0, 1, std::string(8, '\0')), ErrorCode::kProtocolError},   // PING on 1
      {frame(7, 0x7, 0, 0, std::string(7, '\0')), ErrorCode::kFrameSizeError},  // GOAWAY of 7
      {frame(4, 0x8, 0, 0, std::string(4, '\0')), ErrorCode::kProtocolError},   // WU of 0 on 0
      {frame(3, 0x8, 0, 1, std::string(3, '\0')), ErrorCode::kFrameSizeError},  // WU of 3
      {frame(1, 0x9, 0, 0, "x"sv), ErrorCode::kProtocolError},                  // CONT. on 0
      {frame(4, 0x0, flag::kPadded, 1,
             "\x04"
             "abc"sv),
       ErrorCode::kProtocolError},                                  // pad >= len
      {frame(16385, 0x0, 0, 1, ""sv), ErrorCode::kFrameSizeError},  // too large: said at once
  };
  for (const Case& c : cases) {
    for (std::size_t cut : {c.bytes.size(), std::size_t{9}, std::size_t{1}}) {
      std::optional<FrameError> error;
      auto frames = read(c.bytes, {std::min(cut, c.bytes.size())}, &error);
      ASSERT_TRUE(error.has_value()) << testing::PrintToString(c.bytes) << " cut " << cut;
      EXPECT_EQ(error->code, c.code) << error->reason;
      EXPECT_TRUE(frames.empty());
    }
  }
}

TEST(Frames, StreamErrorsAreMarkedForTheConnectionToReset) {
  auto f = read(frame(4, 0x2, 0, 1, "\0\0\0\1"sv), {});  // PRIORITY of 4 bytes
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].stream_error, static_cast<int>(ErrorCode::kFrameSizeError));
  f = read(frame(5, 0x2, 0, 3, "\0\0\0\3\x10"sv), {});  // depends on itself
  EXPECT_EQ(f[0].stream_error, static_cast<int>(ErrorCode::kProtocolError));
  f = read(frame(4, 0x8, 0, 5, "\0\0\0\0"sv), {});  // WINDOW_UPDATE of 0 on a stream
  EXPECT_EQ(f[0].stream_error, static_cast<int>(ErrorCode::kProtocolError));
  f = read(frame(6, 0x1, flag::kPriority | flag::kEndHeaders, 5, "\0\0\0\5\x10\x82"sv), {});
  EXPECT_EQ(f[0].stream_error, static_cast<int>(ErrorCode::kProtocolError));
  EXPECT_EQ(f[0].payload, "\x82");
}

TEST(Frames, ALargerMaxFrameSizeIsTakenAndTheReaderCanBeStopped) {
  std::string big = frame(20000, 0x0, 0, 1, std::string(20000, 'd'));
  std::optional<FrameError> error;
  EXPECT_TRUE(read(big, {}, &error, 16384).empty());
  EXPECT_TRUE(error.has_value());
  EXPECT_EQ(read(big, {4096}, nullptr, 32768).size(), 1u);
  // A callback that says stop: the rest is not read.
  std::string two = frame(1, 0x0, 0, 1, "a"sv) + frame(1, 0x0, 0, 1, "b"sv);
  FrameReader reader;
  int count = 0;
  EXPECT_FALSE(reader.feed(bytes(two), [&](const Frame&) { return ++count < 1; }).has_value());
  EXPECT_EQ(count, 1);
  EXPECT_EQ(reader.pending(), 0u);
}

TEST(Frames, SettingsValuesAreChecked) {
  EXPECT_FALSE(check_setting(0x2, 1).has_value());
  EXPECT_EQ(check_setting(0x2, 2)->code, ErrorCode::kProtocolError);
  EXPECT_EQ(check_setting(0x4, 0x80000000u)->code, ErrorCode::kFlowControlError);
  EXPECT_FALSE(check_setting(0x4, 0x7fffffff).has_value());
  EXPECT_EQ(check_setting(0x5, 16383)->code, ErrorCode::kProtocolError);
  EXPECT_EQ(check_setting(0x5, 0x1000000)->code, ErrorCode::kProtocolError);
  EXPECT_FALSE(check_setting(0x5, 0xffffff).has_value());
  EXPECT_EQ(check_setting(0x8, 2)->code, ErrorCode::kProtocolError);
  EXPECT_FALSE(check_setting(0x99, 12345).has_value());  // unknown: ignored
}

TEST(Frames, AFrameTooLargeIsRefusedFromItsHeaderAlone) {
  // Nothing of its payload is waited for or held: the error comes with the 9th byte.
  std::string header;
  write::frame_header(header, 1 << 20, FrameType::kData, 0, 1);
  auto got = [](const Frame&) { return true; };
  FrameReader whole;
  auto error = whole.feed(bytes(header), got);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code, ErrorCode::kFrameSizeError);
  FrameReader split;
  EXPECT_FALSE(split.feed(bytes(std::string_view(header).substr(0, 4)), got).has_value());
  error = split.feed(bytes(std::string_view(header).substr(4)), got);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code, ErrorCode::kFrameSizeError);
}
