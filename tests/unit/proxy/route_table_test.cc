#include "spindle/proxy/route_table.h"

#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "testing/testing.h"

using namespace spindle;
using namespace spindle::proxy;

namespace {

// A configuration with the given routes text and a service "s" they all use.
Config config_with(const std::string& routes) {
  return parse_config(
      "servers:\n"
      "  - {name: public, listen: 127.0.0.1:1}\n"
      "  - {name: internal, listen: 127.0.0.1:2}\n"
      "routes:\n" +
          routes +
          "services:\n"
          "  s: {url: http://127.0.0.1:9}\n",
      "test.yaml");
}

// The name of the route chosen, or "none".
std::string chosen(const RouteTable& table, std::string_view host, std::string_view target,
                   std::string_view method = "GET", const http::HeaderMap& headers = {}) {
  const RouteConfig* route = table.select(host, target, method, headers);
  return route ? route->name : "none";
}

}  // namespace

TEST(RouteTable, ExactPathBeatsLongestPrefixBeatsRegexBeatsNoPath) {
  Config config = config_with(
      "  - {name: any, match: {}, service: s}\n"
      "  - {name: regex, match: {path_regex: '^/api/v[0-9]+/'}, service: s}\n"
      "  - {name: short, match: {path_prefix: /api/}, service: s}\n"
      "  - {name: long, match: {path_prefix: /api/v1/}, service: s}\n"
      "  - {name: exact, match: {path: /api/v1/users}, service: s}\n");
  RouteTable table(config, "public");
  EXPECT_EQ(chosen(table, "h", "/api/v1/users"), "exact");
  EXPECT_EQ(chosen(table, "h", "/api/v1/users?page=2"), "exact");  // the query is not the path
  EXPECT_EQ(chosen(table, "h", "/api/v1/users/7"), "long");
  EXPECT_EQ(chosen(table, "h", "/api/v2/x"), "short");
  EXPECT_EQ(chosen(table, "h", "/other"), "any");
}

TEST(RouteTable, RegexesWinInDeclaredOrderOverRoutesWithoutAPath) {
  Config config = config_with(
      "  - {name: any, match: {}, service: s}\n"
      "  - {name: first, match: {path_regex: '\\.png$'}, service: s}\n"
      "  - {name: second, match: {path_regex: '^/img/'}, service: s}\n");
  RouteTable table(config, "public");
  EXPECT_EQ(chosen(table, "h", "/img/a.png"), "first");
  EXPECT_EQ(chosen(table, "h", "/img/a.jpg"), "second");
  EXPECT_EQ(chosen(table, "h", "/a.jpg"), "any");
}

TEST(RouteTable, HostSpecificityComesBeforeThePath) {
  Config config = config_with(
      "  - {name: exact-path, match: {path: /x}, service: s}\n"
      "  - {name: wild, match: {hosts: ['*.example.com'], path_prefix: /}, service: s}\n"
      "  - {name: deeper, match: {hosts: ['*.api.example.com'], path_prefix: /}, service: s}\n"
      "  - {name: exact, match: {hosts: [api.example.com], path_prefix: /}, service: s}\n");
  RouteTable table(config, "public");
  EXPECT_EQ(chosen(table, "api.example.com", "/x"), "exact");
  EXPECT_EQ(chosen(table, "API.Example.COM.:8443", "/x"), "exact");  // case, dot and port
  EXPECT_EQ(chosen(table, "v1.api.example.com", "/x"), "deeper");
  EXPECT_EQ(chosen(table, "www.example.com", "/x"), "wild");
  EXPECT_EQ(chosen(table, "example.com", "/x"), "exact-path");  // *.example.com needs a label
  EXPECT_EQ(chosen(table, "other.org", "/y"), "none");
}

TEST(RouteTable, MethodsAndHeadersFilterWithoutRankingAndTiesKeepDeclaredOrder) {
  Config config = config_with(
      "  - {name: canary, match: {path_prefix: /, headers: {X-Canary: '1'}}, service: s}\n"
      "  - {name: writes, match: {path_prefix: /, methods: [POST, PUT]}, service: s}\n"
      "  - {name: rest, match: {path_prefix: /}, service: s}\n");
  RouteTable table(config, "public");
  http::HeaderMap canary;
  canary.add("x-canary", "1");
  http::HeaderMap not_canary;
  not_canary.add("x-canary", "0");
  EXPECT_EQ(chosen(table, "h", "/", "POST", canary), "canary");
  EXPECT_EQ(chosen(table, "h", "/", "POST", not_canary), "writes");
  EXPECT_EQ(chosen(table, "h", "/", "GET", not_canary), "rest");
}

TEST(RouteTable, ARouteNamingServersAppliesOnlyToThem) {
  Config config = config_with(
      "  - {name: admin, servers: [internal], match: {path_prefix: /admin/}, service: s}\n"
      "  - {name: all, match: {path_prefix: /}, service: s}\n");
  RouteTable public_table(config, "public"), internal_table(config, "internal");
  EXPECT_EQ(public_table.size(), 1u);
  EXPECT_EQ(chosen(public_table, "h", "/admin/x"), "all");
  EXPECT_EQ(chosen(internal_table, "h", "/admin/x"), "admin");
}

FIBER_TEST(RouteTable, ALongPathAgainstARegexIsSafeOnAFiberStack) {
  // On a fiber's 64 KiB stack, as in the server. RE2 runs in linear time without recursion: a
  // path as long as a head may be is safe (std::regex recurses per character and overflows).
  Config config = config_with("  - {name: r, match: {path_regex: '^/(a|b)*c$'}, service: s}\n");
  RouteTable table(config, "public");
  EXPECT_EQ(chosen(table, "h", "/" + std::string(15000, 'a') + "c"), "r");
  EXPECT_EQ(chosen(table, "h", "/" + std::string(15000, 'a')), "none");
}

namespace {

// Every case spelling of "word" (2^n of them).
std::vector<std::string> case_spellings(std::string_view word) {
  std::vector<std::string> out;
  for (unsigned bits = 0; bits < (1u << word.size()); ++bits) {
    std::string s(word);
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (bits >> i & 1) s[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[i])));
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

TEST(RouteTable, EveryCaseSpellingOfAPathIsTheRoutes) {
  // Express and ASP.NET route paths without regard to case: /ADMIN/users runs their
  // /admin/users view, so the route that protects /admin must judge it.
  Config config = config_with(
      "  - {name: any, match: {}, service: s}\n"
      "  - {name: prefix, match: {path_prefix: /admin/}, service: s}\n"
      "  - {name: exact, match: {path: /keys}, service: s}\n"
      "  - {name: regex, match: {path_regex: '^/ops/[a-z]+$'}, service: s}\n");
  RouteTable table(config, "public");
  for (const std::string& word : case_spellings("admin")) {
    EXPECT_EQ(chosen(table, "h", "/" + word + "/users"), "prefix") << word;
  }
  for (const std::string& word : case_spellings("keys")) {
    EXPECT_EQ(chosen(table, "h", "/" + word), "exact") << word;
    EXPECT_EQ(chosen(table, "h", "/" + word + "/?x"), "exact") << word;  // one trailing '/'
  }
  for (const std::string& word : case_spellings("ops")) {
    EXPECT_EQ(chosen(table, "h", "/" + word + "/Run"), "regex") << word;
  }
  EXPECT_EQ(chosen(table, "h", "/keysx"), "any");
  EXPECT_EQ(chosen(table, "h", "/keys/x"), "any");
  EXPECT_EQ(chosen(table, "h", "/adminx"), "any");
}

TEST(RouteTable, HeadIsTakenByTheRoutesOfGet) {
  // RFC 9110 §9.3.2: the upstream answers HEAD as it would GET (Flask, Express and Go's mux
  // run the GET handler), so the GET route's middlewares judge it.
  Config config = config_with(
      "  - {name: any, match: {}, service: s}\n"
      "  - {name: get, match: {path: /r, methods: [get]}, service: s}\n"
      "  - {name: post, match: {path: /p, methods: [POST]}, service: s}\n"
      "  - {name: head, match: {path: /h, methods: [HEAD]}, service: s}\n");
  RouteTable table(config, "public");
  EXPECT_EQ(chosen(table, "h", "/r", "HEAD"), "get");
  EXPECT_EQ(chosen(table, "h", "/r", "GET"), "get");
  EXPECT_EQ(chosen(table, "h", "/r", "POST"), "any");
  EXPECT_EQ(chosen(table, "h", "/p", "HEAD"), "any");
  EXPECT_EQ(chosen(table, "h", "/h", "GET"), "any");  // HEAD alone does not take GET
  EXPECT_EQ(chosen(table, "h", "/h", "HEAD"), "head");
}
