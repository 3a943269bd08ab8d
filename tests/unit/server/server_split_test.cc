// The HTTP/1 server with its input cut every way a network may cut it: pipelined requests
// (a plain GET, a sized body, a chunked body with extensions and trailers, a close) delivered
// one byte per read, in two at every offset, and in random cuts, must be answered exactly as
// the whole delivery is. And the request smuggling once found after a chunked body, when the
// read buffer is smaller than one body read.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <regex>
#include <string>

#include "spindle/server/server.h"
#include "testing/http_testing.h"
#include "testing/segmented.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;
using spindle::testing::Segmentation;
using spindle::testing::segmentations;

namespace {

// Answers every request with what it saw: method, target, fields and body.
Router echo_router() {
  Router router;
  auto echo = [](Request& r) {
    std::string text = fmt::format("{} {}\nauthority={}\n", r.method(), r.target(), r.authority());
    for (const Field& f : r.headers()) text += fmt::format("{}: {}\n", f.name, f.value);
    text += "body=" + r.body();
    return Response::text(text);
  };
  for (const char* method : {"GET", "POST", "PUT"}) router.route(method, "/*path", echo);
  return router;
}

// Sends `pieces` on a new connection to `path` and reads until the server closes it; the
// answers without their Date lines (the clock may tick between two deliveries).
std::string deliver(const std::string& path, const std::vector<std::string_view>& pieces) {
  int fd = spindle::testing::connect_unix(path);
  if (fd < 0) return "cannot connect";
  timeval patience{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
  // A write may fail once the server has answered early (431) and closed: read what it said.
  (void)spindle::testing::write_pieces(fd, pieces);
  std::string got;
  char buffer[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    got.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  static const std::regex date("Date: [^\r]*\r\n");
  return std::regex_replace(got, date, "");
}

class ServerSplit : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}) {
    path_ = spindle::testing::unix_socket_path("server");
    server_ = spindle::testing::start_http_server(runtime_, echo_router(), std::move(options),
                                                  *Address::parse("unix:" + path_));
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_) {
      EXPECT_TRUE(server_->drain(Deadline::after(2s)));
    }
    ::unlink(path_.c_str());
  }
  // Every cut of `message` must be answered as the whole message is; returns that answer.
  std::string check_every_cut(std::string_view message, int random = 32) {
    const std::string expected = deliver(path_, {message});
    for (const Segmentation& cut : segmentations(message, random)) {
      std::string got = deliver(path_, cut.pieces);
      EXPECT_EQ(got, expected) << cut.name;
      if (got != expected) break;  // one cut's story is enough
    }
    return expected;
  }

  Runtime runtime_{RuntimeOptions{.workers = 1}};
  std::string path_;
  std::unique_ptr<HttpServer> server_;
};

constexpr std::string_view kPipeline =
    "GET /a?x=1 HTTP/1.1\r\nHost: h\r\nX-A: one\r\n\r\n"
    "POST /sized HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\nhello world"
    "POST /chunked HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    "5;ext=1\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nX-Trailer: t\r\n\r\n"
    "GET /last HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";

}  // namespace

TEST_F(ServerSplit, PipelinedRequestsCutAnywhereAreAnsweredAsWhole) {
  start();
  std::string answers = check_every_cut(kPipeline);
  // The whole delivery itself is right: four answers, bodies where they belong.
  EXPECT_NE(answers.find("GET /a?x=1\n"), std::string::npos) << answers;
  EXPECT_NE(answers.find("body=hello world"), std::string::npos) << answers;
  EXPECT_NE(answers.find("body=hello0123456789abcdef"), std::string::npos) << answers;
  EXPECT_NE(answers.find("GET /last\n"), std::string::npos) << answers;
}

TEST_F(ServerSplit, CanonicalRequestsCutAnywhereAreAnsweredAsWhole) {
  // The canonical request is made in the read buffer (an absolute-form target rewritten in
  // place, "http://h?q" into "/?q"); a refused one's body is still read past. However the
  // bytes come, the same answers, and the next request where it was.
  start();
  std::string answers = check_every_cut(
      "put http://a.example/x/../y?q HTTP/1.1\r\nHost: A.example\r\nCookie: a=1\r\n"
      "Content-Length: 5\r\ncookie: b=2\r\n\r\nhello"
      "POST /z HTTP/1.1\r\nHost: c\r\nX_Forwarded_For: 1.2.3.4\r\nContent-Length: 4\r\n\r\nbody"
      "POST /w HTTP/1.1\r\nHost: good.com:443@evil.com\r\nContent-Length: 4\r\n\r\nbody"
      "GET http://d.example?q=1 HTTP/1.1\r\nHost: d.example\r\nConnection: close\r\n\r\n",
      16);
  EXPECT_NE(answers.find("PUT /y?q\nauthority=a.example\n"), std::string::npos) << answers;
  EXPECT_NE(answers.find("cookie: a=1; b=2\n"), std::string::npos) << answers;
  EXPECT_NE(answers.find("body=hello"), std::string::npos) << answers;
  EXPECT_NE(answers.find("400 Bad Request: a field name spelt with '_'"), std::string::npos)
      << answers;
  EXPECT_NE(answers.find("400 Bad Request: invalid authority"), std::string::npos) << answers;
  EXPECT_NE(answers.find("GET /?q=1\nauthority=d.example\n"), std::string::npos) << answers;
}

TEST_F(ServerSplit, AHeadAtTheLimitCutAnywhereIsAnsweredAsWhole) {
  ServerOptions options;
  options.parser.max_head = 512;
  options.parser.max_request_line = 256;
  start(options);
  // Just under the limit (accepted), then just over (431), each cut everywhere.
  std::string under =
      fmt::format("GET /u HTTP/1.1\r\nHost: h\r\nConnection: close\r\nX-Pad: {}\r\n\r\n",
                  std::string(512 - 60, 'u'));
  EXPECT_TRUE(check_every_cut(under, 8).starts_with("HTTP/1.1 200")) << under.size();
  std::string over =
      fmt::format("GET /o HTTP/1.1\r\nHost: h\r\nX-Pad: {}\r\n\r\n", std::string(600, 'o'));
  EXPECT_TRUE(check_every_cut(over, 8).starts_with("HTTP/1.1 431"));
}

TEST_F(ServerSplit, NoRequestIsSmuggledInABodyAfterAChunkedOne) {
  // A read buffer (max_header_size 1k + 4k) smaller than one body read (16 KiB): what is
  // left of that read after the chunked body must all come back before anything read later.
  ServerOptions options;
  options.parser.max_head = 1024;
  options.parser.max_request_line = 512;
  start(options);
  std::string payload(20'000, 'c');
  std::string hidden = "GET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n";
  std::string b_body = hidden + std::string(6000, 'b');
  std::string message = fmt::format(
      "POST /chunked HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "{:x}\r\n{}\r\n0\r\n\r\n"
      "POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n{}"
      "GET /c HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
      payload.size(), payload, b_body.size(), b_body);
  std::string answers = deliver(path_, {message});
  EXPECT_EQ(answers.find("GET /smuggled\n"), std::string::npos)
      << "a request hidden in a body was run";
  EXPECT_NE(answers.find("POST /b\n"), std::string::npos);
  EXPECT_NE(answers.find("body=" + b_body), std::string::npos) << "/b's body is not its own";
  EXPECT_NE(answers.find("GET /c\n"), std::string::npos);
  // And cut at random places, the same.
  for (const Segmentation& cut : segmentations(message, 16, 0, 1, 0)) {
    EXPECT_EQ(deliver(path_, cut.pieces), answers) << cut.name;
  }
}
