// The origin patterns of `cors` (cors.h): which patterns check-config takes, and which Origin
// values each matches, over generated spellings of origins that must and must not match.
#include "spindle/proxy/cors.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using spindle::proxy::origin_matches;
using spindle::proxy::origin_pattern_error;

namespace {

// `text` with the letters at the positions `mask`'s bits name in upper case.
std::string cased(std::string text, unsigned mask) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    if ((mask >> (i % 16) & 1) != 0 && text[i] >= 'a' && text[i] <= 'z') text[i] -= 'a' - 'A';
  }
  return text;
}

// Origins no pattern for https://example.com's subdomains (at `port`) may match: another
// scheme or port, the domain itself, look-alike and suffix domains, user information, paths,
// empty labels, trailing dots, characters outside a host name.
std::vector<std::string> impostors(const std::string& port) {
  std::vector<std::string> out = {
      "https://example.com" + port,
      "https://evil-example.com" + port,
      "https://evilexample.com" + port,
      "https://example.com.evil.com" + port,
      "https://a.example.com.evil.com" + port,
      "https://a.example.com" + port + ".evil.com",
      "https://a.example.com" + port + "@evil.com",
      "https://evil.com@a.example.com" + port,
      "https://evil.com:@a.example.com" + port,
      "https://a.example.com" + port + "/",
      "https://a.example.com" + port + "/x",
      "https://a.example.com" + port + "?x",
      "https://a.example.com" + port + "#x",
      "https://a.example.com." + port,
      "https://.example.com" + port,
      "https://a..example.com" + port,
      "https://a/.example.com" + port,
      "https://a%2e.example.com" + port,
      "https://a*.example.com" + port,
      "https://*.example.com" + port,
      "https://[::1].example.com" + port,
      "https://a.example.co" + port,
      "http://a.example.com" + port,
      "ws://a.example.com" + port,
      "https:/a.example.com" + port,
      "https//a.example.com" + port,
      "a.example.com" + port,
      "https://a.example.com" + port + " ",
      " https://a.example.com" + port,
      "null",
      "",
  };
  for (std::string other : {":1", ":443", ":8443", ":08443", ":"}) {
    if (other != port) out.push_back("https://a.example.com" + other);
  }
  if (!port.empty()) out.push_back("https://a.example.com");
  return out;
}

}  // namespace

TEST(CorsOrigins, TheWildcardMatchesEverySubdomainAtAnyDepthInAnyCase) {
  for (std::string port : {"", ":8443"}) {
    const std::string pattern = "https://*.example.com" + port;
    ASSERT_EQ(origin_pattern_error(pattern), "");
    for (std::string front : {"a", "a.b", "x-1.y_2.z", "0", "a.b.c.d.e.f", "xn--bcher-kva"}) {
      for (unsigned mask : {0u, 0xffffu, 0x5555u, 0x0f0fu}) {
        std::string origin = cased("https://" + front + ".example.com" + port, mask);
        EXPECT_TRUE(origin_matches(pattern, origin)) << pattern << " " << origin;
        EXPECT_TRUE(origin_matches(cased(pattern, mask), origin)) << pattern << " " << origin;
      }
    }
  }
}

TEST(CorsOrigins, TheWildcardMatchesNoOtherSchemePortDomainOrSpelling) {
  for (std::string port : {"", ":8443"}) {
    const std::string pattern = "https://*.example.com" + port;
    for (const std::string& origin : impostors(port)) {
      for (unsigned mask : {0u, 0xffffu}) {
        EXPECT_FALSE(origin_matches(pattern, cased(origin, mask)))
            << pattern << " matched " << cased(origin, mask);
      }
    }
  }
}

TEST(CorsOrigins, AnExactOriginMatchesItselfInAnyCaseAndNothingElse) {
  const std::string pattern = "https://app.example.com";
  ASSERT_EQ(origin_pattern_error(pattern), "");
  for (unsigned mask : {0u, 0xffffu, 0x3333u}) {
    EXPECT_TRUE(origin_matches(pattern, cased(pattern, mask)));
  }
  for (std::string origin :
       {"https://app.example.com:443", "https://app.example.com/", "https://app.example.com.",
        "http://app.example.com", "https://a.app.example.com", "https://app.example.com.evil.com",
        "https://evil.com@app.example.com", "https://app.example.co", ""}) {
    EXPECT_FALSE(origin_matches(pattern, origin)) << origin;
  }
  EXPECT_EQ(origin_pattern_error("http://[::1]:8080"), "");
  EXPECT_TRUE(origin_matches("http://[::1]:8080", "http://[::1]:8080"));
}

TEST(CorsOrigins, APatternNoBrowserOriginCouldMatchIsRefused) {
  for (std::string pattern : {"*.example.com",
                              "https://*example.com",
                              "https://a.*.example.com",
                              "https://*",
                              "https://*.",
                              "https://*.*.example.com",
                              "https://**.example.com",
                              "https://*.example.com/",
                              "https://*.example.com.",
                              "https://*..example.com",
                              "https://*.[::1]",
                              "https://*.example.com:",
                              "https://*.example.com:99999",
                              "https://app.example.com/",
                              "https://app.example.com/path",
                              "https://user@app.example.com",
                              "https://app.example.com?x",
                              "ftp://app.example.com",
                              "app.example.com",
                              "https://",
                              "https://app example.com",
                              "https://app.example.com:http",
                              "null"}) {
    EXPECT_NE(origin_pattern_error(pattern), "") << pattern;
  }
  for (std::string pattern :
       {"http://localhost:3000", "https://*.example.com", "HTTPS://*.Example.COM",
        "https://*.a-b.example.com:8443", "http://127.0.0.1"}) {
    EXPECT_EQ(origin_pattern_error(pattern), "") << pattern;
  }
}
