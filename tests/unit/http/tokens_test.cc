#include "spindle/http/tokens.h"

#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include "spindle/h1/parser.h"
#include "spindle/http/header_map.h"
#include "spindle/http/rules.h"

using namespace spindle::http;

namespace {

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string alternating(std::string_view s) {
  std::string out(s);
  for (std::size_t i = 0; i < out.size(); i += 2) {
    out[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[i])));
  }
  return out;
}

TEST(Tokens, EveryKnownNameIsFoundInAnyCaseAsTheSameToken) {
  for (const Token& token : detail::kTokens) {
    EXPECT_EQ(find_token(token.name), &token) << token.name;
    EXPECT_EQ(find_token(upper(token.name)), &token) << token.name;
    EXPECT_EQ(find_token(alternating(token.name)), &token) << token.name;
    // One letter off, one letter more or less: not it (nor, here, any other).
    std::string changed(token.name);
    changed.back() = changed.back() == 'x' ? 'y' : 'x';
    const Token* near = find_token(changed);
    EXPECT_TRUE(near == nullptr || near->name == changed) << changed;
    EXPECT_NE(find_token(std::string(token.name) + "s"), &token);
    EXPECT_NE(find_token(token.name.substr(1)), &token);
  }
  for (std::string_view unknown : {"", "x", "x-custom", "hosts", "hos", "content-lengths",
                                   "grpc-status", "x-forwarded-protocol"}) {
    EXPECT_EQ(find_token(unknown), nullptr) << unknown;
  }
}

TEST(Tokens, NoOtherByteAtAnyPlaceIsTakenForAKnownName) {
  // The compare lowers the given name a word at a time: only 'A'..'Z' may stand for a token's
  // letter. (A byte one case-bit away from '-', ':' or a digit, a control character or one
  // above 0x7f, is another name.)
  for (const Token& token : detail::kTokens) {
    for (std::size_t at = 0; at < token.name.size(); ++at) {
      const char own = token.name[at];
      for (int b = 0; b < 256; ++b) {
        const char c = static_cast<char>(b);
        std::string name(token.name);
        name[at] = c;
        const bool same = c == own || (own >= 'a' && own <= 'z' && c == own - 32);
        EXPECT_EQ(find_token(name) == &token, same)
            << token.name << " with byte " << b << " at " << at;
      }
    }
  }
}

TEST(Tokens, EachNameIsInTheTableOnceWithHpacksIndexesInOrder) {
  std::size_t last_index = 0;
  for (std::size_t i = 0; i < std::size(detail::kTokens); ++i) {
    const Token& token = detail::kTokens[i];
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(detail::kTokens[j].name, token.name);
    for (char c : token.name) EXPECT_FALSE(c >= 'A' && c <= 'Z') << token.name;
    if (token.hpack_index != 0) {
      EXPECT_GT(token.hpack_index, last_index) << token.name;
      last_index = token.hpack_index;
    }
  }
  EXPECT_EQ(token::kAuthority.hpack_index, 1);
  EXPECT_EQ(token::kStatus.hpack_index, 8);
  EXPECT_EQ(find_token("www-authenticate")->hpack_index, 61);
  EXPECT_EQ(token::kConnection.hpack_index, 0);
}

TEST(Tokens, AFieldCarriesItsTokenHoweverItEntersAMap) {
  HeaderMap map;
  map.add_view("Host", "a");
  map.add("CONTENT-LENGTH", "5");
  map.add_view(token::kVia, "1.1 x");
  map.set("Cookie", "c=1");
  map.add("X-Custom", "y");
  for (int i = 0; i < 30; ++i) map.add("connection", "close");  // beyond the inline fields
  HeaderMap moved(std::move(map));
  EXPECT_EQ(moved[0].token, &token::kHost);
  EXPECT_EQ(moved[1].token, &token::kContentLength);
  EXPECT_EQ(moved[2].token, &token::kVia);
  EXPECT_EQ(moved[3].token, &token::kCookie);
  EXPECT_EQ(moved[4].token, nullptr);
  EXPECT_EQ(moved[34].token, &token::kConnection);
  // By token, by name in any case, and unknown names by their text.
  EXPECT_EQ(moved.get(token::kHost), "a");
  EXPECT_EQ(moved.get("hOsT"), "a");
  EXPECT_EQ(moved.get("x-CUSTOM"), "y");
  EXPECT_EQ(moved.count(token::kConnection), 30u);
  EXPECT_EQ(moved.count("Connection"), 30u);
  EXPECT_FALSE(moved.contains(token::kDate));
  EXPECT_EQ(moved.erase("CONNECTION"), 30u);
  EXPECT_EQ(moved.size(), 5u);
  EXPECT_TRUE(moved.has_token("cookie", "c=1"));
}

TEST(Tokens, TheParserGivesEachKnownFieldItsToken) {
  RequestParser parser;
  RequestHead head;
  std::string_view request =
      "GET / HTTP/1.1\r\nhOST: a\r\nX-Thing: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
  ASSERT_EQ(parser.parse(request, head).state, ParseResult::State::kComplete);
  ASSERT_EQ(head.headers.size(), 3u);
  EXPECT_EQ(head.headers[0].token, &token::kHost);
  EXPECT_EQ(head.headers[1].token, nullptr);
  EXPECT_EQ(head.headers[2].token, &token::kTransferEncoding);
  EXPECT_TRUE(head.chunked);
  EXPECT_EQ(field_flags(head.headers[2]), field_flags("transfer-encoding"));
}

}  // namespace
