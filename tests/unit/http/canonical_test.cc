// The canonical request (canonical.h): the method, the target, the authority and the fields as
// every judge of a request (routes, middlewares, the upstream) must see them, and what is
// refused because two readers could read it two ways.
#include "spindle/http/canonical.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

using namespace spindle::http;

namespace {

// A request head over its own copy of the target (which canonicalize_request rewrites), the
// field texts kept alive beside it.
struct Head {
  std::string target;
  std::vector<std::pair<std::string, std::string>> fields;
  RequestHead head;
  std::string authority;  // HTTP/2's :authority, if any

  Head(std::string_view method, std::string_view t,
       std::vector<std::pair<std::string, std::string>> f = {{"Host", "a.example"}})
      : target(t), fields(std::move(f)) {
    head.method = method;
    head.target = target;
    for (const auto& [name, value] : fields) head.headers.add_view(name, value);
  }
  // "400: reason", or "METHOD TARGET @AUTHORITY".
  std::string canonical(PathRules rules = {}) {
    head.authority = authority;
    if (auto bad = canonicalize_request(head, target.data(), rules)) {
      return "400: " + std::string(bad->reason);
    }
    return std::string(head.method) + " " + std::string(head.target) + " @" +
           std::string(head.authority);
  }
  std::vector<std::string> values(const Token& name) const {
    std::vector<std::string> out;
    for (const Field& f : head.headers) {
      if (f.token == &name) out.emplace_back(f.value);
    }
    return out;
  }
};

std::string canonical(std::string_view method, std::string_view target,
                      std::vector<std::pair<std::string, std::string>> fields = {
                          {"Host", "a.example"}}) {
  return Head(method, target, std::move(fields)).canonical();
}

}  // namespace

TEST(CanonicalMethod, StandardMethodsInAnyCaseAreUpperCaseOthersOnlyIfSpeltSo) {
  for (std::string_view m :
       {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}) {
    // Every one of the 2^n spellings of each.
    for (unsigned mask = 0; mask < (1u << m.size()); ++mask) {
      std::string spelt(m);
      for (std::size_t i = 0; i < spelt.size(); ++i) {
        if ((mask >> i) & 1) spelt[i] = static_cast<char>(spelt[i] + 32);
      }
      EXPECT_EQ(canonical_method(spelt), m) << spelt;
    }
  }
  EXPECT_EQ(canonical_method("PURGE"), "PURGE");
  EXPECT_EQ(canonical_method("M-SEARCH"), "M-SEARCH");
  EXPECT_EQ(canonical_method("purge"), std::nullopt);
  EXPECT_EQ(canonical_method("Propfind"), std::nullopt);
  EXPECT_EQ(canonical_method("GETS"), "GETS");
  EXPECT_EQ(canonical_method("gets"), std::nullopt);
  EXPECT_EQ(canonical("put", "/x"), "PUT /x @a.example");
  EXPECT_EQ(canonical("purge", "/x"), "400: a method of no standard spelt in lower case");
}

TEST(CanonicalAuthority, HostAndPortOnly) {
  for (const char* good :
       {"a", "a.example", "A.Example.", "a-b_c.example:8080", "127.0.0.1", "127.0.0.1:1", "[::1]",
        "[::1]:443", "[2001:db8::1]:65535", "[::ffff:1.2.3.4]", "x:1", "x:00443"}) {
    EXPECT_TRUE(is_authority(good)) << good;
  }
  for (const char* bad : {"",
                          ":80",
                          "x:0",
                          "x:65536",
                          "good.com:443@evil.com",
                          "user@good.com",
                          "evil.com/.good.com",
                          "evil.com#.good.com",
                          "evil.com?.good.com",
                          "evil.com\\.good.com",
                          "good.com:",
                          "good.com:80:80",
                          "good.com:8o",
                          "good.com:65536",
                          "good.com:123456",
                          "[::1",
                          "[::1]x",
                          "[::1]:",
                          "[]",
                          "[v1.x]",
                          "[1.2.3.4]",
                          "::1",
                          "evil.com%2f.good.com",
                          "a b",
                          "a\tb",
                          "good.com,evil.com",
                          "good.com;evil",
                          "g\xc3\xa9.com",
                          "a*b",
                          "(a)"}) {
    EXPECT_FALSE(is_authority(bad)) << bad;
  }
}

TEST(CanonicalTarget, AbsoluteFormGivesTheAuthorityAndGoesOnInOriginForm) {
  EXPECT_EQ(canonical("GET", "http://a.example/admin/users"), "GET /admin/users @a.example");
  EXPECT_EQ(canonical("GET", "HTTPS://a.example:8443/x?y", {{"Host", "A.EXAMPLE:8443"}}),
            "GET /x?y @a.example:8443");
  EXPECT_EQ(canonical("GET", "http://a.example/%61dmin/../admin//x"), "GET /admin/x @a.example");
  EXPECT_EQ(canonical("GET", "http://a.example"), "GET / @a.example");
  EXPECT_EQ(canonical("GET", "http://a.example?x=1"), "GET /?x=1 @a.example");
  EXPECT_EQ(canonical("GET", "http://a.example:1?", {{"Host", "a.example:1"}}),
            "GET /? @a.example:1");
  // Without Host (HTTP/1.0), the authority is the target's, and Host says so.
  Head h("GET", "http://b.example/x", {});
  EXPECT_EQ(h.canonical(), "GET /x @b.example");
  EXPECT_EQ(h.values(token::kHost), std::vector<std::string>{"b.example"});
  // Refused: another authority in Host, another scheme, user information, none.
  EXPECT_EQ(canonical("GET", "http://admin.internal/secret", {{"Host", "public.com"}}),
            "400: Host names another authority than the request");
  EXPECT_EQ(canonical("GET", "http://a.example/x", {{"Host", ""}}),
            "400: Host names another authority than the request");
  EXPECT_EQ(canonical("GET", "ftp://a.example/x"),
            "400: absolute-form target of a scheme other than http and https");
  EXPECT_EQ(canonical("GET", "http://alice@a.example/x", {}), "400: invalid authority");
  EXPECT_EQ(canonical("GET", "http:///x"), "400: absolute-form target without an authority");
  EXPECT_EQ(canonical("GET", "http://a.example#x"), "400: fragment in request target");
  EXPECT_EQ(canonical("GET", "http://a.example/x#y"), "400: fragment in request target");
  EXPECT_EQ(canonical("GET", "http://a.example/a%2fb"), "400: encoded slash in path");
}

TEST(CanonicalTarget, EachFormOnlyWhereItBelongs) {
  EXPECT_EQ(canonical("OPTIONS", "*"), "OPTIONS * @a.example");
  EXPECT_EQ(canonical("GET", "*"), "400: '*' is a target of OPTIONS only");
  EXPECT_EQ(canonical("CONNECT", "a.example:443", {{"Host", "a.example:443"}}),
            "CONNECT a.example:443 @a.example:443");
  EXPECT_EQ(canonical("CONNECT", "b.example:443"),
            "400: Host names another authority than the request");
  EXPECT_EQ(canonical("CONNECT", "/x"), "400: CONNECT names host:port");
  EXPECT_EQ(canonical("connect", "/x"), "400: CONNECT names host:port");
  EXPECT_EQ(canonical("GET", "a.example:443"), "400: invalid request target");
  // An extended CONNECT (RFC 8441) goes to a path, with the authority of :authority.
  Head ws("CONNECT", "/chat/../room?x", {});
  ws.head.protocol = "websocket";
  ws.authority = "a.example";
  EXPECT_EQ(ws.canonical(), "CONNECT /room?x @a.example");
  EXPECT_EQ(ws.values(token::kHost), std::vector<std::string>{"a.example"});
}

TEST(CanonicalAuthority, OneAuthorityWhereverItIsNamed) {
  Head h2("GET", "/x", {{"host", "a.example"}});
  h2.authority = "A.example";
  EXPECT_EQ(h2.canonical(), "GET /x @A.example");
  EXPECT_EQ(h2.values(token::kHost), std::vector<std::string>{"A.example"});  // says it exactly
  Head other("GET", "/x", {{"host", "b.example"}});
  other.authority = "a.example";
  EXPECT_EQ(other.canonical(), "400: Host names another authority than the request");
  Head none("GET", "/x", {});
  EXPECT_EQ(none.canonical(), "GET /x @");
  EXPECT_TRUE(none.values(token::kHost).empty());
  EXPECT_EQ(canonical("GET", "/x", {{"Host", ""}}), "GET /x @");
  EXPECT_EQ(canonical("GET", "/x", {{"Host", "a"}, {"host", "a"}}), "400: more than one Host");
  for (const char* bad : {"good.com:443@evil.com", "evil.com/.good.com", "evil.com#.good.com",
                          "evil.com?.good.com"}) {
    EXPECT_EQ(canonical("GET", "/x", {{"Host", bad}}), "400: invalid authority") << bad;
    Head h2bad("GET", "/x", {});
    h2bad.authority = bad;
    EXPECT_EQ(h2bad.canonical(), "400: invalid authority") << bad;
  }
}

TEST(CanonicalFields, EverySingletonTwiceInAnySpellingIsRefused) {
  std::mt19937 random(67);
  for (const Token& t : spindle::http::detail::kTokens) {
    if (t.name.front() == ':') continue;
    std::string other(t.name);
    for (char& c : other) {
      if (random() % 2 && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    }
    std::vector<std::pair<std::string, std::string>> fields{{"Host", "a.example"}};
    if (&t != &token::kHost) fields.emplace_back(std::string(t.name), "1");
    fields.emplace_back(other, "2");
    std::string got = canonical("GET", "/x", fields);
    if ((t.flags & field_flag::kSingleton) != 0) {
      EXPECT_TRUE(got.starts_with("400")) << t.name << " " << got;
    } else {
      EXPECT_EQ(got, "GET /x @a.example") << t.name;
    }
  }
  EXPECT_TRUE((token::kAuthorization.flags & field_flag::kSingleton) != 0);
  EXPECT_TRUE((token::kContentType.flags & field_flag::kSingleton) != 0);
}

TEST(CanonicalFields, UnderscoreSpellingsOfKnownNamesAreRefusedOthersKept) {
  std::mt19937 random(8441);
  for (const Token& t : spindle::http::detail::kTokens) {
    if (t.name.find('-') == std::string_view::npos) continue;
    // Every '-' as '_' or not (at least one '_'), in a random case.
    std::vector<std::size_t> dashes;
    for (std::size_t i = 0; i < t.name.size(); ++i) {
      if (t.name[i] == '-') dashes.push_back(i);
    }
    for (unsigned mask = 1; mask < (1u << dashes.size()); ++mask) {
      std::string spelt(t.name);
      for (std::size_t d = 0; d < dashes.size(); ++d) {
        if ((mask >> d) & 1) spelt[dashes[d]] = '_';
      }
      for (char& c : spelt) {
        if (random() % 2 && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
      }
      EXPECT_EQ(canonical("GET", "/x", {{"Host", "a"}, {spelt, "v"}}),
                "400: a field name spelt with '_' for a field spindle knows with '-'")
          << spelt;
      EXPECT_TRUE(names_same_field(spelt, t.name)) << spelt;
    }
  }
  EXPECT_EQ(canonical("GET", "/x", {{"Host", "a"}, {"X_Custom", "v"}, {"_", "v"}}), "GET /x @a");
  EXPECT_FALSE(names_same_field("x_rolex", "x-role"));
  EXPECT_FALSE(names_same_field("x.role", "x-role"));
}

TEST(CanonicalFields, CookieFieldsBecomeOne) {
  Head h("GET", "/x",
         {{"Host", "a"}, {"Cookie", "a=1"}, {"X", "y"}, {"cookie", ""}, {"COOKIE", "b=2; c=3"}});
  EXPECT_EQ(h.canonical(), "GET /x @a");
  EXPECT_EQ(h.values(token::kCookie), std::vector<std::string>{"a=1; b=2; c=3"});
  Head one("GET", "/x", {{"Host", "a"}, {"Cookie", "a=1; a=2"}});
  EXPECT_EQ(one.canonical(), "GET /x @a");
  EXPECT_EQ(one.values(token::kCookie), std::vector<std::string>{"a=1; a=2"});
}

TEST(CanonicalRequest, IsAFixedPoint) {
  // Whatever is accepted, made canonical again, stays as it is (the h2c upgrade does that).
  std::mt19937 random(9112);
  const std::vector<std::string> pieces = {"/",  "a", "..", ".",   "%2e", "%41",
                                           "//", "?", "=",  "%2F", "#",   "b"};
  for (int n = 0; n < 20000; ++n) {
    std::string target = random() % 4 == 0 ? "http://a.example" : "";
    for (int k = random() % 8; k >= 0; --k) target += pieces[random() % pieces.size()];
    if (target.empty()) target = "/";
    Head first("GET", target);
    const std::string once = first.canonical();
    if (once.starts_with("400")) continue;
    Head again("GET", first.head.target, {{"Host", std::string(first.head.authority)}});
    EXPECT_EQ(again.canonical(), once) << target;
    EXPECT_TRUE(first.head.target.starts_with('/')) << target;
  }
}
