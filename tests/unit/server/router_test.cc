#include "spindle/server/router.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "spindle/h1/parser.h"
#include "testing/http_testing.h"

using namespace spindle::http;
using spindle::testing::PiecewiseSource;

namespace {

// A parsed request head that outlives the Request built over it.
struct Head {
  std::string text;
  RequestHead head;

  Head(std::string_view method, std::string_view target, std::string_view extra = "") {
    text = std::string(method) + " " + std::string(target) + " HTTP/1.1\r\nHost: x\r\n" +
           std::string(extra) + "\r\n";
    RequestParser parser;
    auto r = parser.parse(text, head);
    EXPECT_EQ(r.state, ParseResult::State::kComplete) << r.reason;
  }
};

Response call(const Router& router, std::string_view method, std::string_view target) {
  Head h(method, target);
  Request request(h.head, "");
  return router.handle(request);
}

Router sample() {
  Router router;
  router.get("/", [](Request&) { return Response::text("root"); });
  router.get("/users", [](Request&) { return Response::text("list"); });
  router.get("/users/me", [](Request&) { return Response::text("me"); });
  router.get("/users/{id}",
             [](Request& r) { return Response::text("user " + std::string(r.param("id"))); });
  router.del("/users/{id}",
             [](Request& r) { return Response::text("deleted " + std::string(r.param("id"))); });
  router.get("/users/{id}/posts/{post}", [](Request& r) {
    return Response::text(std::string(r.param("id")) + "/" + std::string(r.param("post")));
  });
  router.get("/static/*path",
             [](Request& r) { return Response::text("file " + std::string(r.param("path"))); });
  router.post("/static/upload", [](Request&) { return Response::text("upload"); });
  return router;
}

TEST(Router, StaticSegmentsWinOverParamsWhichWinOverWildcards) {
  Router router = sample();
  EXPECT_EQ(call(router, "GET", "/").body, "root");
  EXPECT_EQ(call(router, "GET", "/users").body, "list");
  EXPECT_EQ(call(router, "GET", "/users/me").body, "me");
  EXPECT_EQ(call(router, "GET", "/users/42").body, "user 42");
  EXPECT_EQ(call(router, "GET", "/users/42/posts/7").body, "42/7");
  EXPECT_EQ(call(router, "GET", "/static/css/site.css").body, "file css/site.css");
  EXPECT_EQ(call(router, "GET", "/static/").body, "file ");
  EXPECT_EQ(call(router, "GET", "/users/42?full=1").body, "user 42");  // the query is not matched
}

TEST(Router, ManyStaticRoutesAreEachFoundByTheirWholePath) {
  // Static routes are found by one hash lookup in a table that grows as they are added: each of
  // 300 (through several growths, two methods on some) reaches its own handler, and a path
  // that is none of them walks the tree as before.
  Router router;
  for (int i = 0; i < 300; ++i) {
    const std::string path = "/r/" + std::to_string(i) + (i % 3 == 0 ? "/deeper/path" : "");
    router.get(path, [i](Request&) { return Response::text("get " + std::to_string(i)); });
    if (i % 7 == 0) {
      router.post(path, [i](Request&) { return Response::text("post " + std::to_string(i)); });
    }
  }
  router.get("/r/{n}",
             [](Request& r) { return Response::text("param " + std::string(r.param("n"))); });
  for (int i = 0; i < 300; ++i) {
    const std::string path = "/r/" + std::to_string(i) + (i % 3 == 0 ? "/deeper/path" : "");
    EXPECT_EQ(call(router, "GET", path).body, "get " + std::to_string(i)) << path;
    if (i % 7 == 0) EXPECT_EQ(call(router, "POST", path).body, "post " + std::to_string(i)) << path;
  }
  EXPECT_EQ(call(router, "GET", "/r/300").body, "param 300");
  EXPECT_EQ(call(router, "GET", "/r/3").body, "param 3");  // only /r/3/deeper/path is static
  EXPECT_EQ(call(router, "GET", "/r/1/deeper/path").status, 404);
}

TEST(Router, UnknownPathsAre404AndUnknownMethods405WithAllow) {
  Router router = sample();
  EXPECT_EQ(call(router, "GET", "/nope").status, 404);
  EXPECT_EQ(call(router, "GET", "/users/42/posts").status, 404);
  Response r = call(router, "PUT", "/users/42");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers.get("allow").value_or(""), "GET, HEAD, DELETE, OPTIONS");
  // A static route and a wildcard under the same prefix keep their own methods.
  r = call(router, "GET", "/static/upload");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers.get("allow").value_or(""), "POST, OPTIONS");
}

TEST(Router, HeadRunsGetAndOptionsListsTheMethods) {
  Router router = sample();
  Response head = call(router, "HEAD", "/users/5");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "user 5");  // the server drops it; Content-Length stays right
  Response options = call(router, "OPTIONS", "/users/5");
  EXPECT_EQ(options.status, 204);
  EXPECT_EQ(options.headers.get("allow").value_or(""), "GET, HEAD, DELETE, OPTIONS");
}

TEST(Router, MalformedOrDuplicateRoutesAreRefused) {
  Router router = sample();
  EXPECT_THROW(router.get("users", [](Request&) { return Response(200); }), std::invalid_argument);
  EXPECT_THROW(router.get("/users/{id}", [](Request&) { return Response(200); }),
               std::invalid_argument);
  EXPECT_THROW(router.get("/a/*rest/b", [](Request&) { return Response(200); }),
               std::invalid_argument);
  EXPECT_THROW(router.get("/a/{unclosed", [](Request&) { return Response(200); }),
               std::invalid_argument);
}

TEST(Router, MiddlewareRunsOutermostFirstAndCanAnswerItself) {
  Router router = sample();
  std::vector<std::string> order;
  router.use([&](Request& r, const Next& next) {
    order.push_back("outer in");
    Response response = next(r);
    order.push_back("outer out");
    response.headers.add(std::string_view("X-Outer"), "1");
    return response;
  });
  router.use([&](Request& r, const Next& next) {
    order.push_back("inner in");
    if (r.header("x-deny") == "yes") return Response::error(403);
    return next(r);
  });
  Response r = call(router, "GET", "/users/me");
  EXPECT_EQ(r.body, "me");
  EXPECT_EQ(r.headers.get("x-outer").value_or(""), "1");
  EXPECT_EQ(order, (std::vector<std::string>{"outer in", "inner in", "outer out"}));

  Head h("GET", "/users/me", "X-Deny: yes\r\n");
  Request denied(h.head, "");
  EXPECT_EQ(router.handle(denied).status, 403);
  // Middleware also sees unrouted requests (404s), as access control and logging need.
  EXPECT_EQ(call(router, "GET", "/nope").headers.get("x-outer").value_or(""), "1");
}

TEST(Router, HandlerExceptionsPropagateToTheServer) {
  Router router;
  router.get("/boom", [](Request&) -> Response { throw HttpError(409, "conflict"); });
  try {
    (void)call(router, "GET", "/boom");
    FAIL() << "no exception";
  } catch (const HttpError& e) {
    EXPECT_EQ(e.status(), 409);
  }
}

TEST(Request, ReadsTheBodyInPiecesOrWholeOnDemand) {
  Head h("POST", "/up", "Transfer-Encoding: chunked\r\n");
  PiecewiseSource source("abcdefghij", 3);
  Request request(h.head, source);
  EXPECT_EQ(source.reads, 0);  // nothing is read until the handler asks
  char buf[4];
  ASSERT_EQ(request.read(buf), 3u);
  EXPECT_EQ(std::string_view(buf, 3), "abc");
  // body() then reads and holds the rest.
  EXPECT_EQ(request.body(), "defghij");
  EXPECT_EQ(request.read(buf), 0u);
  EXPECT_EQ(request.body(), "defghij");  // read once, then kept
}

TEST(Request, BodyReadErrorsReachTheHandlerAsHttpError) {
  Head h("POST", "/up", "Transfer-Encoding: chunked\r\n");
  PiecewiseSource source("partial", 4, 408);
  Request request(h.head, source);
  try {
    (void)request.body();
    FAIL() << "no exception";
  } catch (const HttpError& e) {
    EXPECT_EQ(e.status(), 408);
  }
}

TEST(Request, AGivenBodyIsReadLikeAStreamedOne) {
  Head h("POST", "/up?x=1");
  Request request(h.head, "0123456789");
  EXPECT_EQ(request.path(), "/up");
  EXPECT_EQ(request.query(), "x=1");
  char buf[6];
  ASSERT_EQ(request.read(buf), 6u);
  ASSERT_EQ(request.read(buf), 4u);
  EXPECT_EQ(std::string_view(buf, 4), "6789");
  EXPECT_EQ(request.read(buf), 0u);
}

}  // namespace
