#include <gtest/gtest.h>

#include <string>

#include "spindle/h1/parser.h"
#include "spindle/http/rules.h"

using spindle::http::ParseResult;
using spindle::http::ParserLimits;
using spindle::http::RequestHead;
using spindle::http::RequestParser;
using State = ParseResult::State;

namespace {

// Parses `text` in one go; returns the result (head filled on success).
ParseResult parse(std::string_view text, RequestHead& head, ParserLimits limits = {}) {
  RequestParser parser(limits);
  return parser.parse(text, head);
}

int status_of(std::string_view text, ParserLimits limits = {}) {
  RequestHead head;
  auto r = parse(text, head, limits);
  return r.state == State::kError ? r.status : (r.state == State::kComplete ? 200 : 0);
}

}  // namespace

TEST(Http1Parser, ParsesASimpleGet) {
  RequestHead head;
  std::string text = "GET /hello?x=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n";
  auto r = parse(text, head);
  ASSERT_EQ(r.state, State::kComplete) << r.reason;
  EXPECT_EQ(r.consumed, text.size());
  EXPECT_EQ(head.method, "GET");
  EXPECT_EQ(head.target, "/hello?x=1");
  EXPECT_EQ(head.minor_version, 1);
  EXPECT_EQ(head.headers.size(), 2u);
  EXPECT_EQ(head.headers.get("host"), "example.com");
  EXPECT_EQ(head.headers.get("ACCEPT"), "*/*");
  EXPECT_TRUE(head.keep_alive);
  EXPECT_FALSE(head.content_length.has_value());
  EXPECT_FALSE(head.chunked);
}

TEST(Http1Parser, ViewsPointIntoTheInput) {
  RequestHead head;
  std::string text = "GET / HTTP/1.1\r\nHost: h\r\n\r\n";
  ASSERT_EQ(parse(text, head).state, State::kComplete);
  EXPECT_GE(head.target.data(), text.data());
  EXPECT_LT(head.target.data(), text.data() + text.size());
}

TEST(Http1Parser, TrimsOptionalWhitespaceAroundValues) {
  RequestHead head;
  ASSERT_EQ(parse("GET / HTTP/1.1\r\nHost:h\r\nX-A: \t spaced \t \r\n\r\n", head).state,
            State::kComplete);
  EXPECT_EQ(head.headers.get("x-a"), "spaced");
  EXPECT_EQ(head.headers.get("host"), "h");
}

TEST(Http1Parser, StopsAtTheEndOfTheHeadAndLeavesTheBody) {
  RequestHead head;
  std::string text = "POST /u HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello";
  auto r = parse(text, head);
  ASSERT_EQ(r.state, State::kComplete);
  EXPECT_EQ(text.substr(r.consumed), "hello");
  EXPECT_EQ(head.content_length, 5u);
}

TEST(Http1Parser, IgnoresEmptyLinesBeforeTheRequestLine) {
  RequestHead head;
  std::string text = "\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n";
  auto r = parse(text, head);
  ASSERT_EQ(r.state, State::kComplete);
  EXPECT_EQ(r.consumed, text.size());
}

TEST(Http1Parser, AcceptsEveryTargetFormWhereItBelongs) {
  EXPECT_EQ(status_of("GET http://example.com/a?b HTTP/1.1\r\nHost: example.com\r\n\r\n"), 200);
  EXPECT_EQ(status_of("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"), 200);
  EXPECT_EQ(status_of("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n"), 200);
  EXPECT_EQ(status_of("GET * HTTP/1.1\r\nHost: h\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET example.com:443 HTTP/1.1\r\nHost: h\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET relative/path HTTP/1.1\r\nHost: h\r\n\r\n"), 400);
}

TEST(Http1Parser, KeepAliveFollowsVersionAndConnection) {
  RequestHead head;
  ASSERT_EQ(parse("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", head).state,
            State::kComplete);
  EXPECT_FALSE(head.keep_alive);
  ASSERT_EQ(parse("GET / HTTP/1.0\r\n\r\n", head).state, State::kComplete);
  EXPECT_EQ(head.minor_version, 0);
  EXPECT_FALSE(head.keep_alive);
  ASSERT_EQ(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", head).state,
            State::kComplete);
  EXPECT_TRUE(head.keep_alive);
  ASSERT_EQ(parse("GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade, CLOSE\r\n\r\n", head).state,
            State::kComplete);
  EXPECT_FALSE(head.keep_alive);
}

TEST(Http1Parser, RecognisesExpectContinueAndRejectsOtherExpectations) {
  RequestHead head;
  ASSERT_EQ(
      parse("PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect: 100-Continue\r\n\r\n", head)
          .state,
      State::kComplete);
  EXPECT_TRUE(head.expect_continue);
  EXPECT_EQ(status_of("PUT / HTTP/1.1\r\nHost: h\r\nExpect: teapot\r\n\r\n"), 417);
}

TEST(Http1Parser, LaterMinorVersionsAreAnsweredAsHttp11) {
  RequestHead head;
  ASSERT_EQ(parse("GET / HTTP/1.7\r\nHost: h\r\n\r\n", head).state, State::kComplete);
  EXPECT_EQ(head.minor_version, 1);
}

TEST(Http1Parser, ChunkedTransferEncoding) {
  RequestHead head;
  ASSERT_EQ(parse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n", head).state,
            State::kComplete);
  EXPECT_TRUE(head.chunked);
}

TEST(Http1Parser, AcceptsIdenticalDuplicateContentLength) {
  RequestHead head;
  ASSERT_EQ(
      parse("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 7\r\nContent-Length: 7\r\n\r\n", head)
          .state,
      State::kComplete);
  EXPECT_EQ(head.content_length, 7u);
  ASSERT_EQ(parse("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 7, 7\r\n\r\n", head).state,
            State::kComplete);
  EXPECT_EQ(head.content_length, 7u);
}

// ---- every rejection, with its status ----------------------------------------------------------

TEST(Http1Parser, RejectsContentLengthWithChunked) {
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n"),
            400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
                      "Content-Length: 5\r\n\r\n"),
            400);
}

TEST(Http1Parser, RejectsDifferingDuplicateContentLength) {
  EXPECT_EQ(
      status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
      400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 6\r\n\r\n"), 400);
}

TEST(Http1Parser, RejectsSignedHexEmptyAndOverflowingContentLength) {
  for (const char* value : {"+5", "-5", "0x10", "1a", "", " ", "5 5", "1.0", "99999999999999999999",
                            "18446744073709551616", "5,", ",5"}) {
    std::string text =
        std::string("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: ") + value + "\r\n\r\n";
    EXPECT_EQ(status_of(text), 400) << "Content-Length: '" << value << "'";
  }
}

TEST(Http1Parser, RejectsUnknownAndNonFinalTransferCodings) {
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            501);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
            400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity\r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n"),
            400);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: ,chunked\r\n\r\n"), 400);
  EXPECT_EQ(status_of("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
}

TEST(Http1Parser, RejectsWhitespaceBeforeTheColon) {
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost : h\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: h\r\nX-A\t: b\r\n\r\n"), 400);
}

TEST(Http1Parser, RejectsObsFold) {
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: h\r\nX-A: b\r\n  c\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: h\r\nX-A: b\r\n\tc\r\n\r\n"), 400);
}

TEST(Http1Parser, RejectsNulAndBareCrAndBareLfInFields) {
  using namespace std::string_literals;
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: h\r\nX-A: a\0b\r\n\r\n"s), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: h\r\nX-A: a\rb\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: h\r\nX-A: a\nX-B: b\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: h\r\nX-A: \x7f\r\n\r\n"), 400);
}

// The checks of target and value characters go eight bytes at a time: every byte value, at
// every position of a long target and value, must still be judged as the RFC says.
TEST(Http1Parser, EveryByteIsJudgedAtEveryPositionOfTargetAndValue) {
  for (int byte = 0; byte < 256; ++byte) {
    auto c = static_cast<char>(byte);
    auto u = static_cast<unsigned char>(byte);
    bool target_ok = u > 0x20 && u < 0x7f;
    bool value_ok = u == '\t' || (u >= 0x20 && u != 0x7f);
    for (std::size_t at = 0; at < 20; ++at) {
      std::string target = "/abcdefghijklmnopqrst";
      target[1 + at] = c;
      std::string value = "abcdefghijklmnopqrstu";
      value[1 + at] = c;
      if (c != ' ' && c != '\r' && c != '\n') {
        RequestHead head;
        auto r = parse("GET " + target + " HTTP/1.1\r\nHost: h\r\n\r\n", head);
        EXPECT_EQ(r.state == State::kComplete, target_ok) << "byte " << byte << " at " << at;
      }
      if (c != '\r' && c != '\n') {
        RequestHead head;
        const std::string text = "GET / HTTP/1.1\r\nHost: h\r\nX: " + value + "\r\n\r\n";
        auto r = parse(text, head);  // (the head's fields are views into `text`)
        EXPECT_EQ(r.state == State::kComplete, value_ok) << "byte " << byte << " at " << at;
      }
    }
  }
}

// The same for a field line's name and value at every position of lines long enough for two
// blocks of sixteen bytes and an overlapping last one (the one-pass check of a valid line), in
// a request and in a response.
TEST(Http1Parser, EveryByteIsJudgedAtEveryPositionOfALongFieldLine) {
  using spindle::http::ResponseHead;
  using spindle::http::ResponseParser;
  for (int byte = 0; byte < 256; ++byte) {
    const char c = static_cast<char>(byte);
    const bool name_ok = spindle::http::is_tchar(c);
    const bool value_ok = spindle::http::is_field_value_char(c);
    for (std::size_t at = 0; at < 40; ++at) {
      std::string name = "Abcdefghijklmnopqrstuvwxyz-0123456789ABCD";  // 41 characters
      std::string value = "abcdefghijklmnopqrstuvwxyz 0123456789ABCD";
      if (c != ':' && c != '\r' && c != '\n') {
        name[at] = c;
        RequestHead head;
        auto r = parse("GET / HTTP/1.1\r\nHost: h\r\n" + name + ": v\r\n\r\n", head);
        ASSERT_EQ(r.state == State::kComplete, name_ok) << "byte " << byte << " at " << at;
        ResponseParser parser;
        ResponseHead response;
        auto rr = parser.parse("HTTP/1.1 200 OK\r\n" + name + ": v\r\nContent-Length: 0\r\n\r\n",
                               response);
        ASSERT_EQ(rr.state == State::kComplete, name_ok) << "byte " << byte << " at " << at;
      }
      // (Not the value's ends, where SP and HTAB are the whitespace around it.)
      if (c != '\r' && c != '\n' && at > 0) {
        value[at] = c;
        RequestHead head;
        const std::string text = "GET / HTTP/1.1\r\nHost: h\r\nX: " + value + "\r\n\r\n";
        auto r = parse(text, head);  // (the head's fields are views into `text`)
        ASSERT_EQ(r.state == State::kComplete, value_ok) << "byte " << byte << " at " << at;
        ResponseParser parser;
        ResponseHead response;
        auto rr = parser.parse("HTTP/1.1 200 OK\r\nX: " + value + "\r\nContent-Length: 0\r\n\r\n",
                               response);
        ASSERT_EQ(rr.state == State::kComplete, value_ok) << "byte " << byte << " at " << at;
        if (value_ok) {
          ASSERT_EQ(head.headers.get("x").value_or(""), value);
        }
      }
    }
  }
}

// A field line ends only at CR LF: a control byte followed by LF inside a value (which a
// parser that took any control byte for the line's end would read as CR LF, and the rest as a
// field of its own) is refused, in a request and in a response, wherever it is in the value.
TEST(Http1Parser, AControlByteBeforeAnLfDoesNotEndAFieldLine) {
  using spindle::http::ResponseHead;
  using spindle::http::ResponseParser;
  for (int byte = 0; byte < 0x20; ++byte) {
    if (byte == '\t' || byte == '\r') continue;
    for (std::size_t at = 0; at < 20; ++at) {
      // What follows the LF is a well-formed field of its own.
      std::string fields = "X-A: " + std::string("abcdefghijklmnopqrstu").substr(0, at) +
                           static_cast<char>(byte) + "\nX-B: smuggled\r\n";
      RequestHead head;
      auto r = parse("GET / HTTP/1.1\r\nHost: h\r\n" + fields + "\r\n", head);
      EXPECT_EQ(r.state, State::kError) << "byte " << byte << " at " << at;
      EXPECT_EQ(r.status, 400);
      ResponseParser parser;
      ResponseHead response;
      auto rr =
          parser.parse("HTTP/1.1 200 OK\r\n" + fields + "Content-Length: 0\r\n\r\n", response);
      EXPECT_EQ(rr.state, State::kError) << "byte " << byte << " at " << at;
      EXPECT_EQ(rr.status, 502);
    }
  }
}

TEST(Http1Parser, RejectsInvalidFieldNameCharacters) {
  for (const char* name : {"X(A)", "X\"A", "X/A", "X@A", "X{A}", "X A", "\x80X", "[X]"}) {
    std::string text = std::string("GET / HTTP/1.1\r\nHost: h\r\n") + name + ": v\r\n\r\n";
    EXPECT_EQ(status_of(text), 400) << name;
  }
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: h\r\n: empty\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: h\r\nNoColon\r\n\r\n"), 400);
}

TEST(Http1Parser, RejectsMalformedRequestLines) {
  for (const char* line :
       {"GET  / HTTP/1.1", "GET /  HTTP/1.1", " GET / HTTP/1.1", "GET / HTTP/1.1 ", "GET /",
        "GET / HTTP/1", "GET / HTTP/1.", "GET / HTTP/1.1.1", "GET / http/1.1", "GET / HTTP/A.1",
        "GET / FTP/1.1", "G(T / HTTP/1.1", "GET /a b HTTP/1.1", "GET /\x7f HTTP/1.1",
        "GET /\xc3\xa9 HTTP/1.1", "GET\t/ HTTP/1.1"}) {
    std::string text = std::string(line) + "\r\nHost: h\r\n\r\n";
    EXPECT_EQ(status_of(text), 400) << "'" << line << "'";
  }
}

TEST(Http1Parser, RejectsUnsupportedMajorVersionsWith505) {
  EXPECT_EQ(status_of("GET / HTTP/2.0\r\nHost: h\r\n\r\n"), 505);
  EXPECT_EQ(status_of("GET / HTTP/0.9\r\nHost: h\r\n\r\n"), 505);
}

TEST(Http1Parser, RejectsMissingOrDuplicateHostInHttp11) {
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.0\r\n\r\n"), 200);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost:\r\n\r\n"), 200);  // empty Host is allowed
}

TEST(Http1Parser, RejectsAnOverlongRequestLineWith414) {
  ParserLimits limits{.max_request_line = 64, .max_head = 4096};
  std::string target(100, 'a');
  EXPECT_EQ(status_of("GET /" + target + " HTTP/1.1\r\nHost: h\r\n\r\n", limits), 414);
  // Even before the line is complete.
  EXPECT_EQ(status_of("GET /" + target, limits), 414);
}

TEST(Http1Parser, RejectsAnOverlargeHeadWith431) {
  ParserLimits limits{.max_request_line = 64, .max_head = 256};
  std::string big = "GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + std::string(300, 'b') + "\r\n\r\n";
  EXPECT_EQ(status_of(big, limits), 431);
  EXPECT_EQ(status_of(big.substr(0, 280), limits), 431);  // incomplete but already too large
}

TEST(Http1Parser, RejectsTooManyFieldsWith431) {
  ParserLimits limits{.max_headers = 5};
  std::string text = "GET / HTTP/1.1\r\nHost: h\r\n";
  for (int i = 0; i < 5; ++i) text += "X-" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(status_of(text + "\r\n", limits), 431);
}

TEST(Http1Parser, RejectsGarbageAsSoonAsTheRequestLineEnds) {
  RequestParser parser;
  RequestHead head;
  using namespace std::string_literals;
  // A TLS ClientHello, say: rejected at once, not after 16 KiB or a timeout.
  auto r = parser.parse("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"s, head);
  EXPECT_EQ(r.state, State::kError);
  EXPECT_EQ(r.status, 400);
  RequestParser second;
  EXPECT_EQ(second.parse("GET /x HTTP/1.1\r\nHost: h\r\nBad", head).state, State::kIncomplete);
  EXPECT_EQ(second.parse("GE(T /x", head).state, State::kError);
}

// ---- incremental parsing ------------------------------------------------------------------------

TEST(Http1Parser, FragmentedInputSplitAtEveryByteOffsetGivesTheSameResult) {
  const std::string text =
      "\r\nPOST /upload?name=a%20b HTTP/1.1\r\nHost: example.com:8080\r\n"
      "Content-Length: 11\r\nX-Empty:\r\nConnection: keep-alive\r\nExpect: 100-continue\r\n\r\n";
  for (std::size_t split = 0; split <= text.size(); ++split) {
    RequestParser parser;
    RequestHead head;
    // Feed the bytes one at a time up to `split`, then the rest at once.
    for (std::size_t n = 1; n < split; ++n) {
      auto r = parser.parse(std::string_view(text).substr(0, n), head);
      ASSERT_EQ(r.state, State::kIncomplete) << "prefix " << n << ": " << r.reason;
    }
    auto r = parser.parse(text, head);
    ASSERT_EQ(r.state, State::kComplete) << "split " << split << ": " << r.reason;
    EXPECT_EQ(r.consumed, text.size());
    EXPECT_EQ(head.method, "POST");
    EXPECT_EQ(head.target, "/upload?name=a%20b");
    EXPECT_EQ(head.headers.get("host"), "example.com:8080");
    EXPECT_EQ(head.headers.get("x-empty"), "");
    EXPECT_EQ(head.content_length, 11u);
    EXPECT_TRUE(head.expect_continue);
  }
}

// A browser's head (long names and values, a tab inside one, obs-text in another) fed a byte
// at a time: every prefix waits for more, none is refused, and the whole gives every field as
// sent. The one-pass field line check reads sixteen bytes at a time, so a line cut anywhere
// must send it to the careful way, never past the bytes that arrived.
TEST(Http1Parser, ABrowsersHeadFedAByteAtATimeWaitsThenParsesWhole) {
  const std::string text =
      "GET /index.html HTTP/1.1\r\nHost: www.example.com\r\n"
      "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"
      "Accept-Language: en-US,en;q=0.9,\tfr;q=0.8\r\n"
      "Cookie: session=8f2a9c4e1b7d4a6f9e3c2b1a0d8e7f6a; theme=dark; name=\xc3\xa9t\xc3\xa9\r\n"
      "Upgrade-Insecure-Requests: 1\r\n"
      "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)\r\n"
      "\r\n";
  RequestParser parser;
  RequestHead head;
  for (std::size_t n = 1; n < text.size(); ++n) {
    auto r = parser.parse(std::string_view(text).substr(0, n), head);
    ASSERT_EQ(r.state, State::kIncomplete) << "prefix " << n << ": " << r.reason;
    // A parser's first call reads the whole head as far as it came (later calls wait for its
    // end): each prefix, the first bytes a fresh parser sees.
    RequestParser fresh;
    RequestHead partial;
    r = fresh.parse(std::string_view(text).substr(0, n), partial);
    ASSERT_EQ(r.state, State::kIncomplete) << "fresh, prefix " << n << ": " << r.reason;
  }
  auto r = parser.parse(text, head);
  ASSERT_EQ(r.state, State::kComplete) << r.reason;
  EXPECT_EQ(r.consumed, text.size());
  EXPECT_EQ(head.headers.size(), 6u);
  EXPECT_EQ(head.headers.get("accept-language"), "en-US,en;q=0.9,\tfr;q=0.8");
  EXPECT_EQ(head.headers.get("cookie"),
            "session=8f2a9c4e1b7d4a6f9e3c2b1a0d8e7f6a; theme=dark; name=\xc3\xa9t\xc3\xa9");
  EXPECT_EQ(head.headers.get("upgrade-insecure-requests"), "1");
  EXPECT_EQ(head.headers.get("user-agent"),
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)");
}

TEST(Http1Parser, FragmentedBadInputIsRejectedAtWhateverSplit) {
  const std::string text = "GET / HTTP/1.1\r\nHost: h\r\nBad Name: v\r\n\r\n";
  for (std::size_t split = 1; split < text.size(); ++split) {
    RequestParser parser;
    RequestHead head;
    auto first = parser.parse(std::string_view(text).substr(0, split), head);
    ASSERT_NE(first.state, State::kComplete);
    auto r = first.state == State::kError ? first : parser.parse(text, head);
    EXPECT_EQ(r.state, State::kError) << "split " << split;
    EXPECT_EQ(r.status, 400);
  }
}

// The verdict must not depend on how the bytes were split: a bad line in a head that has not
// all arrived is judged as a fragmented head would be (found by the fuzz driver: " \rq\rq" was
// an error whole and incomplete in two pieces).
TEST(Http1Parser, SplitNeverChangesTheVerdictOfAnIncompleteHead) {
  const std::string inputs[] = {
      " \rq\rq",
      "GET / HTTP/1.1\r\nBad Name: v\r\n",
      "GET / HTTP/1.1\r\nHost: h\r\n\rX",
      "GET /\rx HTTP/1.1\r\n",
      "GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
  };
  for (const std::string& text : inputs) {
    RequestParser whole;
    RequestHead head;
    auto once = whole.parse(text, head);
    for (std::size_t split = 1; split < text.size(); ++split) {
      RequestParser pieces;
      RequestHead head2;
      auto first = pieces.parse(std::string_view(text).substr(0, split), head2);
      if (first.state == State::kError) continue;  // an earlier verdict on a prefix is fine
      ASSERT_EQ(first.state, State::kIncomplete);
      auto second = pieces.parse(text, head2);
      EXPECT_EQ(second.state, once.state)
          << "input " << testing::PrintToString(text) << " split " << split;
      EXPECT_EQ(second.status, once.status);
    }
  }
}

// A response head is read line by line too: each line ends at its first CR, and a CR that
// does not begin a CRLF (in the status line or a field) makes the response malformed (502),
// never part of a reason or a value.
TEST(Http1Parser, AResponseHeadsLinesEndAtTheirFirstCrWhichMustBeginACrlf) {
  using spindle::http::ResponseHead;
  using spindle::http::ResponseParser;
  ResponseParser parser;
  ResponseHead head;
  auto ok = parser.parse(
      "HTTP/1.1 200 OK\r\nServer: up\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi",
      head);
  ASSERT_EQ(ok.state, State::kComplete);
  EXPECT_EQ(ok.consumed, 76u);  // the head, without the body
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.reason, "OK");
  ASSERT_EQ(head.headers.size(), 3u);
  EXPECT_EQ(head.headers.get("server"), "up");
  EXPECT_EQ(head.headers.get("content-type"), "text/plain");
  EXPECT_EQ(head.content_length, 2u);
  for (std::string_view bad : {
           "HTTP/1.1 200 O\rK\r\nContent-Length: 0\r\n\r\n",
           "HTTP/1.1 200 OK\r\r\nContent-Length: 0\r\n\r\n",
           "HTTP/1.1 200 OK\r\nX-A: a\rb\r\nContent-Length: 0\r\n\r\n",
           "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-A: a\r\r\n\r\n",
           // What follows a bare CR's next byte reads as a field of its own if the CR is
           // taken for a line's end: the field must not appear.
           "HTTP/1.1 200 OK\rXSet-Cookie: s=1\r\nContent-Length: 0\r\n\r\n",
           "HTTP/1.1 200 OK\r\nX-A: a\rXSet-Cookie: s=1\r\nContent-Length: 0\r\n\r\n",
       }) {
    ResponseHead h;
    auto r = parser.parse(bad, h);
    EXPECT_EQ(r.state, State::kError) << testing::PrintToString(std::string(bad));
    EXPECT_EQ(r.status, 502);
  }
}
