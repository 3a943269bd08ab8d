#include "spindle/h1/chunked.h"

#include <gtest/gtest.h>

#include <string>

using spindle::http::ChunkedDecoder;
using Kind = ChunkedDecoder::Step::Kind;

namespace {

struct Decoded {
  std::string body;
  bool done = false;
  int status = 0;        // of an error
  std::size_t left = 0;  // bytes after the body
};

// Feeds `text` in pieces of `piece` bytes, as a connection would, keeping unconsumed bytes.
Decoded decode(const std::string& text, std::size_t piece, std::uint64_t max_body = UINT64_MAX) {
  ChunkedDecoder decoder(max_body);
  Decoded out;
  std::string pending;
  std::size_t fed = 0;
  while (true) {
    auto step = decoder.next(pending);
    if (step.kind == Kind::kError) {
      out.status = step.status;
      return out;
    }
    out.body.append(step.data);
    pending.erase(0, step.consumed);
    if (step.kind == Kind::kDone) {
      out.done = true;
      out.left = pending.size() + (text.size() - fed);
      return out;
    }
    if (step.kind == Kind::kNeedMore) {
      if (fed == text.size()) return out;  // ran out of input
      std::size_t n = std::min(piece, text.size() - fed);
      pending.append(text, fed, n);
      fed += n;
    }
  }
}

}  // namespace

TEST(ChunkedDecoder, DecodesChunksExtensionsAndTrailers) {
  std::string text =
      "5\r\nhello\r\n6;name=value\r\n world\r\nA \t; ext\r\n0123456789\r\n0\r\n"
      "Trailer-A: x\r\n\r\nNEXT";
  auto d = decode(text, text.size());
  ASSERT_TRUE(d.done) << d.status;
  EXPECT_EQ(d.body, "hello world0123456789");
  EXPECT_EQ(d.left, 4u);  // "NEXT" is the next request's
}

TEST(ChunkedDecoder, SplitAtEveryByteOffsetGivesTheSameBody) {
  std::string text = "3\r\nabc\r\n10\r\n0123456789abcdef\r\n1;x=\"q\"\r\nz\r\n0\r\nT: 1\r\n\r\n";
  for (std::size_t piece = 1; piece <= text.size(); ++piece) {
    auto d = decode(text, piece);
    ASSERT_TRUE(d.done) << "piece " << piece << " status " << d.status;
    EXPECT_EQ(d.body, "abc0123456789abcdefz") << "piece " << piece;
    EXPECT_EQ(d.left, 0u);
  }
}

TEST(ChunkedDecoder, WaitsForMoreBytesInsideFraming) {
  auto d = decode("5\r\nhel", 100);
  EXPECT_FALSE(d.done);
  EXPECT_EQ(d.status, 0);
  EXPECT_EQ(d.body, "hel");
}

TEST(ChunkedDecoder, RejectsBadChunkSizes) {
  for (const char* text : {"\r\n", "g\r\n", "-1\r\n", "+1\r\n", "0x5\r\n", " 5\r\n", "5 \r\n",
                           "5 x\r\n", "5\n", "5\rx\r\n", "5\x01\r\n"}) {
    EXPECT_EQ(decode(text, 100).status, 400) << "'" << text << "'";
  }
}

TEST(ChunkedDecoder, RejectsChunkSizeOverflow) {
  EXPECT_EQ(decode("ffffffffffffffffff\r\n", 100).status, 400);
  EXPECT_EQ(decode("10000000000000000\r\n", 100).status, 400);
}

TEST(ChunkedDecoder, RejectsMissingCrlfAfterData) {
  EXPECT_EQ(decode("3\r\nabcX\r\n0\r\n\r\n", 100).status, 400);
  EXPECT_EQ(decode("3\r\nabc\n0\r\n\r\n", 100).status, 400);
}

TEST(ChunkedDecoder, RejectsBodiesOverTheLimitWith413) {
  EXPECT_EQ(decode("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", 100, 10).status, 413);
  EXPECT_TRUE(decode("5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n", 100, 10).done);
}

TEST(ChunkedDecoder, RejectsMalformedTrailers) {
  EXPECT_EQ(decode("0\r\nNoColon\r\n\r\n", 100).status, 400);
  EXPECT_EQ(decode("0\r\nA: b\r\n folded\r\n\r\n", 100).status, 400);
  EXPECT_EQ(decode("0\r\nA: b\rc\r\n\r\n", 100).status, 400);
}

TEST(ChunkedDecoder, RejectsOverlongLinesInsteadOfBufferingForever) {
  std::string text = "5;" + std::string(5000, 'x');
  EXPECT_EQ(decode(text, 100).status, 400);
}
