// The server applies rules.h to what handlers answer, on HTTP/1 and HTTP/2 alike: no field that
// could split a response goes out, hop-by-hop fields are the server's, and both protocols log
// a request the same way.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "spindle/client/client.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/server/server.h"
#include "testing/http_testing.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::http;
using spindle::testing::exchange_raw;
using spindle::testing::head_of;

namespace {

Router injecting_router() {
  Router router;
  router.get("/split", [](Request&) {
    Response r = Response::text("body");
    r.headers.add(std::string_view("X-Bad"), "a\r\nSet-Cookie: stolen=1");
    return r;
  });
  router.get("/split-known", [](Request&) {  // a known name (it has a token): the value counts
    Response r = Response::text("body");
    r.headers.add(std::string_view("Location"), "/a\r\nSet-Cookie: stolen=1");
    return r;
  });
  router.get("/badname", [](Request&) {
    Response r = Response::text("body");
    r.headers.add(std::string_view("X Bad"), "v");
    return r;
  });
  router.get("/nul", [](Request&) {
    Response r = Response::text("body");
    r.headers.add(std::string_view("X-Nul"), std::string_view("a\0b", 3));
    return r;
  });
  router.get("/status", [](Request&) { return Response(1000); });
  router.get("/hop", [](Request&) {
    Response r = Response::text("body");
    r.headers.add_view("Connection", "X-Internal");
    r.headers.add_view("X-Internal", "secret");
    r.headers.add_view("Keep-Alive", "timeout=99");
    r.headers.add_view("Upgrade", "nothing");
    r.headers.add_view("X-Kept", "yes");
    return r;
  });
  return router;
}

std::string get(const Address& address, std::string_view path) {
  return exchange_raw(
      address, "GET " + std::string(path) + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
}

}  // namespace

TEST(ServerRules, AResponseFieldThatCouldSplitTheResponseBecomesA500OnHttp1) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = spindle::testing::start_http_server(runtime, injecting_router());
  runtime.block_on([&] {
    for (std::string_view path : {"/split", "/split-known", "/badname", "/nul", "/status"}) {
      std::string got = get(server->address(), path);
      EXPECT_TRUE(got.starts_with("HTTP/1.1 500 ")) << path << ": " << got;
      EXPECT_EQ(got.find("stolen"), std::string::npos) << got;
      EXPECT_EQ(got.find("X-Bad"), std::string::npos) << got;
      EXPECT_EQ(got.find("X-Nul"), std::string::npos) << got;
    }
    // The connection was not harmed: the next request is answered normally.
    EXPECT_TRUE(get(server->address(), "/hop").starts_with("HTTP/1.1 200 "));
  });
  server->drain(Deadline::after(5s));
}

TEST(ServerRules, AResponseFieldThatCouldSplitTheResponseBecomesA500OnHttp2) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = spindle::testing::start_http_server(runtime, injecting_router(),
                                                    ServerOptions{.http2 = true});
  HttpClient client(runtime, ClientOptions{.h2c_prior_knowledge = true});
  runtime.block_on([&] {
    std::string base = "http://127.0.0.1:" + std::to_string(server->address().port());
    for (std::string_view path : {"/split", "/split-known", "/badname", "/nul", "/status"}) {
      auto r = client.send({.url = base + std::string(path)});
      ASSERT_TRUE(r.has_value()) << path << ": " << r.error().message();
      EXPECT_EQ(r->version, 20);
      EXPECT_EQ(r->status, 500) << path;
      EXPECT_FALSE(r->headers.contains("x-bad"));
      EXPECT_FALSE(r->headers.contains("set-cookie"));
    }
  });
  server->drain(Deadline::after(5s));
}

TEST(ServerRules, HopByHopFieldsAHandlerSetsAreDroppedWithThoseConnectionNames) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto server = spindle::testing::start_http_server(runtime, injecting_router(),
                                                    ServerOptions{.http2 = true});
  HttpClient h2(runtime, ClientOptions{.h2c_prior_knowledge = true});
  runtime.block_on([&] {
    std::string got = get(server->address(), "/hop");
    std::string_view head = head_of(got);
    EXPECT_TRUE(head.starts_with("HTTP/1.1 200 ")) << got;
    EXPECT_NE(head.find("X-Kept: yes"), std::string::npos) << head;
    EXPECT_EQ(head.find("X-Internal"), std::string::npos) << head;
    EXPECT_EQ(head.find("Keep-Alive"), std::string::npos) << head;
    EXPECT_EQ(head.find("Upgrade"), std::string::npos) << head;
    // The server's own Connection field only.
    EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
    auto r =
        h2.send({.url = "http://127.0.0.1:" + std::to_string(server->address().port()) + "/hop"});
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->headers.get("x-kept"), "yes");
    EXPECT_FALSE(r->headers.contains("x-internal"));
    EXPECT_FALSE(r->headers.contains("connection"));
    EXPECT_FALSE(r->headers.contains("keep-alive"));
  });
  server->drain(Deadline::after(5s));
}

TEST(ServerRules, Http1AndHttp2WriteTheSameAccessLogRecordForAnIpv6Client) {
  std::string path = "/tmp/spindle-access-" + std::to_string(::getpid()) + ".log";
  ::unlink(path.c_str());  // a process of this pid that failed here may have left it
  std::uint16_t port = 0;
  {
    Runtime runtime(RuntimeOptions{.workers = 1});
    runtime.start();
    auto log = AccessLog::open(runtime, path, AccessLog::Format::kJson);
    ASSERT_TRUE(log.has_value());
    auto address = Address::parse("[::1]:0");
    ASSERT_TRUE(address.has_value());
    auto server = spindle::testing::start_http_server(
        runtime, injecting_router(), ServerOptions{.access_log = *log, .http2 = true}, *address);
    ASSERT_NE(server, nullptr);
    port = server->address().port();
    HttpClient h2(runtime, ClientOptions{.h2c_prior_knowledge = true});
    runtime.block_on([&] {
      EXPECT_TRUE(get(server->address(), "/hop").starts_with("HTTP/1.1 200"));
      auto r =
          h2.send({.url = "http://[::1]:" + std::to_string(server->address().port()) + "/hop"});
      ASSERT_TRUE(r.has_value()) << r.error().message();
    });
    server->drain(Deadline::after(5s));
  }  // the log is written out when the runtime and the server let go of it
  std::ifstream in(path);
  std::string h1, h2;
  std::getline(in, h1);
  std::getline(in, h2);
  ::unlink(path.c_str());
  // The host is the canonical request's authority (the client's Host, its :authority).
  const std::string host = "[::1]:" + std::to_string(port);
  EXPECT_NE(
      h1.find(R"("remote":"::1","method":"GET","target":"/hop","host":"x","version":"HTTP/1.1")"),
      std::string::npos)
      << h1;
  EXPECT_NE(h2.find(R"("remote":"::1","method":"GET","target":"/hop","host":")" + host +
                    R"(","version":"HTTP/2.0")"),
            std::string::npos)
      << h2;
}
