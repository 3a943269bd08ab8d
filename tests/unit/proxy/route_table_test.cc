#include "spindle/proxy/route_table.h"

#include <fmt/format.h>
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
      "  - {name: regex, match: {path_regex: '/v[0-9]+/'}, service: s}\n"
      "  - {name: short, match: {path_prefix: /api/}, service: s}\n"
      "  - {name: long, match: {path_prefix: /api/v1/}, service: s}\n"
      "  - {name: exact, match: {path: /api/v1/users}, service: s}\n");
  RouteTable table(config, "public");
  EXPECT_EQ(chosen(table, "h", "/api/v1/users"), "exact");
  EXPECT_EQ(chosen(table, "h", "/api/v1/users?page=2"), "exact");  // the query is not the path
  EXPECT_EQ(chosen(table, "h", "/api/v1/users/7"), "long");
  EXPECT_EQ(chosen(table, "h", "/api/v2/x"), "short");
  EXPECT_EQ(chosen(table, "h", "/x/v2/y"), "regex");
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

TEST(RouteTable, APrefixEndingInSlashTakesThePathWithoutIt) {
  // Express (non-strict routing, its default) serves /admin with its /admin/ view, Flask
  // redirects it there: the route that guards /admin/ judges /admin, in every case spelling.
  Config config = config_with(
      "  - {name: any, match: {}, service: s}\n"
      "  - {name: prefix, match: {path_prefix: /admin/}, service: s}\n");
  RouteTable table(config, "public");
  for (const std::string& word : case_spellings("admin")) {
    for (const std::string& path : {"/" + word, "/" + word + "/", "/" + word + "?x",
                                    "/" + word + "/?x", "/" + word + "/users"}) {
      EXPECT_EQ(chosen(table, "h", path), "prefix") << path;
    }
  }
  for (const char* path : {"/adminx", "/admi", "/", "/x/admin"}) {
    EXPECT_EQ(chosen(table, "h", path), "any") << path;
  }
}

namespace {

// The error of parse_config on `text`, or "" if it loads.
std::string config_error(const std::string& text) {
  try {
    parse_config(text, "test.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// A configuration with one server (`paths` its path rules, YAML) and the given routes text.
std::string one_server(const std::string& paths, const std::string& routes) {
  return "servers:\n  - {listen: 127.0.0.1:1" + (paths.empty() ? "" : ", paths: " + paths) +
         "}\nroutes:\n" + routes + "services:\n  s: {url: http://127.0.0.1:9}\n";
}

// Spellings of "/admin/users" that no normalised request has, each with the normal spelling
// (http/target.h): every character escaped in turn (both hex cases), dot segments, doubled
// slashes.
std::vector<std::pair<std::string, std::string>> unnormal_spellings() {
  const std::string path = "/admin/users";
  std::vector<std::pair<std::string, std::string>> out;
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '/') {
      out.emplace_back(path.substr(0, i) + "/" + path.substr(i), path);
      out.emplace_back(path.substr(0, i) + "/." + path.substr(i), path);
      out.emplace_back(path.substr(0, i) + "/x/.." + path.substr(i), path);
      continue;
    }
    for (const char* hex : {"%{:02x}", "%{:02X}"}) {
      std::string escaped = fmt::format(fmt::runtime(hex), static_cast<unsigned>(path[i]));
      out.emplace_back(path.substr(0, i) + escaped + path.substr(i + 1), path);
    }
  }
  out.emplace_back("/admin/users/.", "/admin/users/");
  out.emplace_back("/admin/users/x/..", "/admin/users/");
  out.emplace_back("/%7euser", "/~user");
  out.emplace_back("/a%3fb", "/a%3Fb");
  return out;
}

}  // namespace

TEST(RouteConfig, ARoutePathNoRequestCanHaveIsRefusedWithItsNormalSpelling) {
  // Requests are normalised before routing; a route's path as written would never match one,
  // and the requests it was to guard would go to another route.
  for (const char* key : {"path", "path_prefix"}) {
    for (const auto& [written, normal] : unnormal_spellings()) {
      std::string error = config_error(one_server(
          "", fmt::format("  - {{name: g, match: {{{}: \"{}\"}}, service: s}}\n", key, written)));
      EXPECT_NE(error.find(fmt::format("write '{}'", normal)), std::string::npos)
          << key << " " << written << ": " << error;
    }
    for (const char* written : {"/admin?x", "/admin/?", "/a%2Fb", "/a%00", "/a%zz", "/a#b"}) {
      std::string error = config_error(one_server(
          "", fmt::format("  - {{name: g, match: {{{}: \"{}\"}}, service: s}}\n", key, written)));
      EXPECT_NE(error.find(fmt::format("match.{}", key)), std::string::npos) << written;
    }
    // What is normal under the server's own rules loads.
    for (const char* written : {"/admin/users", "/~user", "/a%3Fb", "/a/"}) {
      EXPECT_EQ(config_error(one_server(
                    "", fmt::format("  - {{match: {{{}: \"{}\"}}, service: s}}\n", key, written))),
                "")
          << written;
    }
    EXPECT_EQ(
        config_error(one_server("{merge_slashes: false}",
                                fmt::format("  - {{match: {{{}: //a}}, service: s}}\n", key))),
        "");
    EXPECT_EQ(
        config_error(one_server("{escaped_slashes: keep}",
                                fmt::format("  - {{match: {{{}: /a%2Fb}}, service: s}}\n", key))),
        "");
  }
}

TEST(RouteConfig, ARegexRouteAPrefixRouteAlwaysOutranksIsRefused) {
  const std::string guard = "  - {name: panel, match: {REGEX}, service: s}\n";
  auto routes = [&](const std::string& regex, const std::string& other) {
    std::string text = guard;
    text.replace(text.find("REGEX"), 5, regex);
    return one_server("", text + "  - {name: open, match: {" + other + "}, service: s}\n");
  };
  // Every request the regex route takes, the prefix route takes, and outranks it on.
  for (const auto& [regex, other] : std::vector<std::pair<std::string, std::string>>{
           {"path_regex: '^/panel/$'", "path_prefix: /"},
           {"path_regex: '\\.png$'", "path_prefix: /"},
           {"path_regex: '^/ops/[a-z]+$'", "path_prefix: /ops/"},
           {"path_regex: '^/ops/[a-z]+$'", "path_prefix: /op"},
           {"path_regex: '^/x$', methods: [GET]", "path_prefix: /"},
           {"path_regex: '^/x$', methods: [GET]", "path_prefix: /, methods: [GET, POST]"},
           {"path_regex: '^/x$', headers: {x-a: b}", "path_prefix: /"},
           {"path_regex: '^/x$', hosts: [a.example, b.example]",
            "path_prefix: /, hosts: [b.example, a.example]"}}) {
    std::string error = config_error(routes(regex, other));
    EXPECT_NE(error.find("route 'panel' can take no request"), std::string::npos)
        << regex << " / " << other << ": " << error;
  }
  // A request the regex route takes that the prefix route does not: both load.
  for (const auto& [regex, other] : std::vector<std::pair<std::string, std::string>>{
           {"path_regex: '.*'", "path_prefix: /"},  // OPTIONS *
           {"path_regex: 'panel'", "path_prefix: /panel"},
           {"path_regex: '^/opsx'", "path_prefix: /ops/"},
           {"path_regex: '^/x$'", "path_prefix: /, methods: [GET]"},
           {"path_regex: '^/x$'", "path_prefix: /, headers: {x-a: b}"},
           {"path_regex: '^/x$', hosts: [a.example]", "path_prefix: /"},
           {"path_regex: '^/x$'", "path_prefix: /, hosts: [a.example]"},
           {"path_regex: '^/x$'", "path: /x"},
           {"path_regex: '^/x$'", ""}}) {
    EXPECT_EQ(config_error(routes(regex, other)), "") << regex << " / " << other;
  }
}
