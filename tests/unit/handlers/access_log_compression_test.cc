#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "spindle/h1/parser.h"
#include "spindle/handlers/compression.h"
#include "spindle/server/access_log.h"
#include "testing/decompress.h"

using namespace spindle::http;
using spindle::testing::gunzip;
using spindle::testing::unbrotli;

namespace {

std::chrono::system_clock::time_point at_epoch_plus(long seconds) {
  return std::chrono::system_clock::time_point(std::chrono::seconds(seconds));
}

}  // namespace

TEST(AccessLog, FormatsCombinedLines) {
  std::string line;
  AccessLog::format(line, AccessLog::Format::kCombined,
                    AccessRecord{.remote = "127.0.0.1",
                                 .method = "GET",
                                 .target = "/a?b=1",
                                 .minor_version = 1,
                                 .status = 200,
                                 .bytes = 13,
                                 .referer = "",
                                 .user_agent = "curl/7.88"},
                    at_epoch_plus(1'700'000'000));
  EXPECT_EQ(line,
            "127.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET /a?b=1 HTTP/1.1\" 200 13 \"-\" "
            "\"curl/7.88\"\n");
}

TEST(AccessLog, FormatsJsonLinesAndEscapesWhatClientsSent) {
  std::string line;
  AccessLog::format(line, AccessLog::Format::kJson,
                    AccessRecord{.remote = "::1",
                                 .method = "POST",
                                 .target = "/x",
                                 .authority = "a.example\"",
                                 .minor_version = 0,
                                 .status = 404,
                                 .bytes = 0,
                                 .referer = "a\"b",
                                 .user_agent = "evil\nline",
                                 .duration = std::chrono::microseconds(42)},
                    at_epoch_plus(0));
  EXPECT_EQ(line,
            "{\"time\":\"1970-01-01T00:00:00Z\",\"remote\":\"::1\",\"method\":\"POST\","
            "\"target\":\"/x\",\"host\":\"a.example\\\"\",\"version\":\"HTTP/"
            "1.0\",\"status\":404,\"bytes\":0,"
            "\"referer\":\"a\\\"b\",\"user_agent\":\"evil\\u000aline\",\"duration_us\":42}\n");
}

TEST(Compression, GzipAndBrotliRoundTrip) {
  std::string text;
  for (int i = 0; i < 500; ++i) text += "line " + std::to_string(i) + " of some repetitive text\n";
  auto gz = gzip_compress(text);
  ASSERT_TRUE(gz.has_value());
  EXPECT_LT(gz->size(), text.size() / 3);
  EXPECT_EQ(gunzip(*gz), text);
  auto br = brotli_compress(text);
  ASSERT_TRUE(br.has_value());
  EXPECT_LT(br->size(), text.size() / 3);
  EXPECT_EQ(unbrotli(*br), text);
}

namespace {

// Runs the compression middleware over a handler's response for a `method` request with
// `accept`.
Response compressed(std::string accept, Response response, std::string method = "GET") {
  std::string text = method + " / HTTP/1.1\r\nHost: x\r\n" +
                     (accept.empty() ? "" : "Accept-Encoding: " + accept + "\r\n") + "\r\n";
  RequestHead head;
  RequestParser parser;
  EXPECT_EQ(parser.parse(text, head).state, ParseResult::State::kComplete);
  Request request(head, "");
  auto middleware = compression();
  auto shared = std::make_shared<Response>(std::move(response));
  return middleware(request, [&](Request&) { return std::move(*shared); });
}

}  // namespace

TEST(Compression, MiddlewarePrefersBrotliThenGzip) {
  std::string body(4000, 'x');
  auto br = compressed("gzip, br", Response::text(body));
  EXPECT_EQ(br.headers.get("content-encoding"), "br");
  EXPECT_EQ(unbrotli(br.body), body);
  auto gz = compressed("gzip, br;q=0", Response::text(body));
  EXPECT_EQ(gz.headers.get("content-encoding"), "gzip");
  EXPECT_EQ(gunzip(gz.body), body);
  EXPECT_EQ(gz.headers.get("vary"), "Accept-Encoding");
}

TEST(Compression, AStrongEtagBecomesWeakOnceTheBodyIsCompressed) {
  Response tagged = Response::text(std::string(4000, 'x'));
  tagged.headers.add_view("ETag", "\"v1\"");
  EXPECT_EQ(compressed("gzip", std::move(tagged)).headers.get("etag"), "W/\"v1\"");
  Response untouched = Response::text(std::string(4000, 'x'));
  untouched.headers.add_view("ETag", "\"v1\"");
  EXPECT_EQ(compressed("", std::move(untouched)).headers.get("etag"), "\"v1\"");
}

TEST(Compression, LeavesSmallBinaryOrUnacceptedResponsesAlone) {
  auto small = compressed("gzip", Response::text("tiny"));
  EXPECT_FALSE(small.headers.contains("content-encoding"));
  auto binary = compressed("gzip", Response(200, std::string(4000, 'x'), "image/png"));
  EXPECT_FALSE(binary.headers.contains("content-encoding"));
  auto none = compressed("", Response::text(std::string(4000, 'x')));
  EXPECT_FALSE(none.headers.contains("content-encoding"));
  EXPECT_EQ(none.body.size(), 4000u);
  auto refused = compressed("gzip;q=0", Response::text(std::string(4000, 'x')));
  EXPECT_FALSE(refused.headers.contains("content-encoding"));
}

namespace {

// Collects what a streamed body writes, piece by piece.
class RecordingWriter final : public BodyWriter {
 public:
  bool write(std::string_view data) override {
    pieces.emplace_back(data);
    return true;
  }
  void set_trailers(const HeaderMap&) override {}
  std::string all() const {
    std::string out;
    for (const auto& p : pieces) out += p;
    return out;
  }
  std::vector<std::string> pieces;
};

Response streamed_text(std::vector<std::string> parts) {
  Response r(200);
  r.headers.add_view("Content-Type", "text/plain");
  r.stream = [parts](BodyWriter& body) {
    for (const auto& p : parts) body.write(p);
  };
  return r;
}

}  // namespace

TEST(Compression, StreamedBodiesAreCompressedPieceByPieceAndEachPieceIsFlushed) {
  std::vector<std::string> parts;
  for (int i = 0; i < 50; ++i) parts.push_back("event " + std::to_string(i) + " data\n");
  std::string plain;
  for (const auto& p : parts) plain += p;
  for (std::string coding : {"gzip", "br"}) {
    Response r = compressed(coding, streamed_text(parts));
    ASSERT_EQ(r.headers.get("content-encoding"), coding);
    ASSERT_TRUE(r.stream);
    RecordingWriter out;
    r.stream(out);
    // One compressed piece per piece written, and the end of the stream.
    EXPECT_EQ(out.pieces.size(), parts.size() + 1) << coding;
    std::string decoded = coding == "gzip" ? gunzip(out.all()) : unbrotli(out.all());
    EXPECT_EQ(decoded, plain) << coding;
    // Flushed: the first piece alone decodes to the first part (a client sees it at once).
    auto first = StreamCompressor::create(coding, {});
    std::string head;
    ASSERT_TRUE(first->compress(parts[0], false, head));
    EXPECT_EQ(head, out.pieces[0]) << coding;
  }
}

TEST(Compression, BodiesOverTheLimitAreNotCompressedInOneGo) {
  CompressionOptions options;
  std::string big(options.max_size + 1, 'x');
  auto untouched = compressed("gzip", Response::text(big));
  EXPECT_FALSE(untouched.headers.contains("content-encoding"));
  EXPECT_EQ(untouched.body.size(), big.size());
  auto at_limit = compressed("gzip", Response::text(std::string(options.max_size, 'x')));
  EXPECT_EQ(at_limit.headers.get("content-encoding"), "gzip");
}

TEST(Compression, AStreamedBodyKnownToBeSmallIsLeftAlone) {
  Response small = streamed_text({"tiny"});
  small.stream_length = 4;
  Response r = compressed("gzip", std::move(small));
  EXPECT_FALSE(r.headers.contains("content-encoding"));
  EXPECT_EQ(r.stream_length, std::optional<std::uint64_t>(4));
  // Of unknown length, or known to be large enough: compressed.
  EXPECT_EQ(compressed("gzip", streamed_text({"tiny"})).headers.get("content-encoding"), "gzip");
  Response big = streamed_text({std::string(2000, 'x')});
  big.stream_length = 2000;
  EXPECT_EQ(compressed("gzip", std::move(big)).headers.get("content-encoding"), "gzip");
}

namespace {

// Every Cache-Control field list of an answer that says no-transform: the directive in four
// spellings of case, alone or first, among or last of other directives, with and without
// spaces and tabs, in a field of its own before or after another Cache-Control field.
std::vector<std::vector<std::string>> no_transform_fields() {
  std::vector<std::vector<std::string>> out;
  for (std::string spelling : {"no-transform", "No-Transform", "NO-TRANSFORM", "nO-tRaNsFoRm"}) {
    for (std::string sep : {", ", ",", " ,\t", ",,"}) {
      for (std::string value :
           {spelling, spelling + sep + "max-age=60", "public" + sep + spelling + sep + "max-age=60",
            "private=\"x\"" + sep + spelling}) {
        out.push_back({value});
        out.push_back({"max-age=60", value});
        out.push_back({value, "public"});
      }
    }
  }
  return out;
}

Response text_with(const std::vector<std::string>& cache_control, bool streamed) {
  Response r =
      streamed ? streamed_text({std::string(4000, 'x')}) : Response::text(std::string(4000, 'x'));
  for (const std::string& value : cache_control) r.headers.add("Cache-Control", value);
  return r;
}

}  // namespace

TEST(Compression, AnAnswerMarkedNoTransformIsLeftAsItIsInEverySpellingAndPosition) {
  for (const auto& fields : no_transform_fields()) {
    for (bool streamed : {false, true}) {
      Response r = compressed("gzip, br", text_with(fields, streamed));
      std::string where = fields.front() + " | " + fields.back();
      EXPECT_FALSE(r.headers.contains("content-encoding")) << where << " streamed " << streamed;
      if (!streamed) EXPECT_EQ(r.body, std::string(4000, 'x')) << where;
    }
  }
  // Directives that only look like it, or none: compressed (the middleware does transform).
  for (std::string value : {"no-transformx", "x-no-transform", "no-store", "max-age=0",
                            "private=\"no-transform-list\"", ""}) {
    Response r = compressed("gzip", text_with({value}, false));
    EXPECT_EQ(r.headers.get("content-encoding"), "gzip") << value;
  }
}

TEST(Compression, EncodedPartialEmptyAndNotModifiedAnswersAreLeftAloneHeadAsItsGet) {
  std::string body(4000, 'x');
  Response encoded = Response::text(body);
  encoded.headers.add("Content-Encoding", "identity");
  EXPECT_EQ(compressed("gzip", std::move(encoded)).headers.count("content-encoding"), 1u);
  for (int status : {204, 206, 304}) {
    Response r = Response::text(body);
    r.status = status;
    Response out = compressed("gzip", std::move(r));
    EXPECT_FALSE(out.headers.contains("content-encoding")) << status;
    EXPECT_EQ(out.body, body) << status;
  }
  // A handler's answer to HEAD has the fields its GET's has (RFC 9110 §9.3.2): the same coding.
  Response head = compressed("gzip", text_with({}, false), "HEAD");
  Response get = compressed("gzip", text_with({}, false), "GET");
  EXPECT_EQ(head.headers.get("content-encoding"), "gzip");
  EXPECT_EQ(get.headers.get("content-encoding"), "gzip");
  EXPECT_EQ(head.body, get.body);
  // A streamed answer to HEAD (proxied: no body tells what GET's would be) is left as it came.
  EXPECT_FALSE(
      compressed("gzip", text_with({}, true), "HEAD").headers.contains("content-encoding"));
  EXPECT_EQ(compressed("gzip", text_with({}, true), "GET").headers.get("content-encoding"), "gzip");
}
