#include "spindle/net/address.h"

#include <gtest/gtest.h>

using spindle::Address;

TEST(Address, ParsesAndFormatsIpv4) {
  auto a = Address::parse("127.0.0.1:8080");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->family(), Address::Family::kIpv4);
  EXPECT_EQ(a->port(), 8080);
  EXPECT_EQ(a->to_string(), "127.0.0.1:8080");
}

TEST(Address, ParsesAndFormatsBracketedIpv6) {
  auto a = Address::parse("[::1]:443");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->family(), Address::Family::kIpv6);
  EXPECT_EQ(a->port(), 443);
  EXPECT_EQ(a->to_string(), "[::1]:443");
}

TEST(Address, ParsesUnixPaths) {
  auto a = Address::parse("unix:/tmp/spindle.sock");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->family(), Address::Family::kUnix);
  EXPECT_EQ(a->unix_path(), "/tmp/spindle.sock");
  EXPECT_EQ(a->to_string(), "unix:/tmp/spindle.sock");
}

TEST(Address, RoundTripsThroughToString) {
  for (const char* text : {"0.0.0.0:0", "10.1.2.3:65535", "[fe80::1]:1", "unix:/x"}) {
    auto a = Address::parse(text);
    ASSERT_TRUE(a.has_value()) << text;
    auto b = Address::parse(a->to_string());
    ASSERT_TRUE(b.has_value()) << text;
    EXPECT_EQ(*a, *b) << text;
  }
}

TEST(Address, RejectsBadText) {
  for (const char* text : {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:65536",
                           "127.0.0.1:-1", "127.0.0.1:80x", "256.0.0.1:80", "localhost:80",
                           "::1:80", "[::1]", "[::1]:", "[zz::1]:80", "unix:", ":80"}) {
    auto a = Address::parse(text);
    ASSERT_FALSE(a.has_value()) << "accepted '" << text << "'";
    EXPECT_EQ(a.error(), std::errc::invalid_argument) << text;
  }
}

TEST(Address, RejectsOverlongUnixPath) {
  std::string path = "unix:/" + std::string(200, 'a');
  EXPECT_FALSE(Address::parse(path).has_value());
}

TEST(Address, WithPortChangesOnlyThePort) {
  auto a = Address::parse("192.168.0.1:1").value();
  EXPECT_EQ(a.with_port(99).to_string(), "192.168.0.1:99");
  EXPECT_EQ(Address::loopback_v4(7).to_string(), "127.0.0.1:7");
}

TEST(Address, ParsesHostsAsForwardingFieldsWriteThem) {
  auto text = [](std::string_view s) {
    auto a = Address::parse_host(s);
    return a ? a->host_text() : std::string("error");
  };
  EXPECT_EQ(text("192.0.2.1"), "192.0.2.1");
  EXPECT_EQ(text("0.0.0.0"), "0.0.0.0");  // IPv4 is written by hand: each octet's edges
  EXPECT_EQ(text("255.10.100.9"), "255.10.100.9");
  EXPECT_EQ(text("192.0.2.1:4711"), "192.0.2.1");
  EXPECT_EQ(text("2001:0db8:0:0::1"), "2001:db8::1");
  EXPECT_EQ(text("[2001:db8::1]"), "2001:db8::1");
  EXPECT_EQ(text("[2001:db8::1]:443"), "2001:db8::1");
  EXPECT_EQ(text("::ffff:192.0.2.1"), "192.0.2.1");
  EXPECT_EQ(text("[::ffff:c000:201]:1"), "192.0.2.1");
  for (const char* bad : {"", "unknown", "example.com", "192.0.2.1:", "192.0.2.1:http",
                          "[2001:db8::1", "[2001:db8::1]x", "192.0.2.1:123456", "_hidden"}) {
    EXPECT_EQ(text(bad), "error") << bad;
  }
  EXPECT_EQ(*Address::parse_host("192.0.2.1:5"), *Address::parse_host("::ffff:192.0.2.1"));
}

TEST(Address, KnowsItsIpv4MappedFormAndUnwrapsIt) {
  auto at = [](std::string_view s) { return Address::parse(s).value(); };
  EXPECT_TRUE(at("[::ffff:192.0.2.1]:80").is_v4_mapped());
  EXPECT_EQ(at("[::ffff:192.0.2.1]:80").unmapped().to_string(), "192.0.2.1:80");
  for (const char* other : {"192.0.2.1:80", "[2001:db8::1]:80", "[::1]:80", "[::192.0.2.1]:80",
                            "[::fffe:192.0.2.1]:80"}) {
    EXPECT_FALSE(at(other).is_v4_mapped()) << other;
    EXPECT_EQ(at(other).unmapped(), at(other)) << other;
  }
  EXPECT_FALSE(Address::parse("unix:/tmp/x.sock").value().is_v4_mapped());
}
