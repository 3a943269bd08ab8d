#include "spindle/net/cidr.h"

#include <gtest/gtest.h>

using namespace spindle;

namespace {
Address at(std::string_view text) { return Address::parse(text).value(); }
}  // namespace

TEST(Cidr, MatchesAddressesInsideItsPrefixOnly) {
  auto net = Cidr::parse("10.1.0.0/16").value();
  EXPECT_TRUE(net.contains(at("10.1.0.1:80")));
  EXPECT_TRUE(net.contains(at("10.1.255.255:80")));
  EXPECT_FALSE(net.contains(at("10.2.0.1:80")));
  EXPECT_FALSE(net.contains(at("[::1]:80")));
  // An IPv4-mapped IPv6 peer is its IPv4 address.
  EXPECT_TRUE(net.contains(at("[::ffff:10.1.2.3]:80")));
  EXPECT_EQ(net.to_string(), "10.1.0.0/16");
  auto odd = Cidr::parse("192.168.1.128/25").value();
  EXPECT_TRUE(odd.contains(at("192.168.1.200:1")));
  EXPECT_FALSE(odd.contains(at("192.168.1.127:1")));
  auto v6 = Cidr::parse("fd00::/8").value();
  EXPECT_TRUE(v6.contains(at("[fd12::1]:443")));
  EXPECT_FALSE(v6.contains(at("[fe80::1]:443")));
  EXPECT_FALSE(v6.contains(at("10.0.0.1:443")));
  auto host = Cidr::parse("127.0.0.1").value();
  EXPECT_TRUE(host.contains(at("127.0.0.1:9")));
  EXPECT_FALSE(host.contains(at("127.0.0.2:9")));
  EXPECT_TRUE(Cidr::parse("0.0.0.0/0").value().contains(at("8.8.8.8:53")));
}

TEST(Cidr, RefusesMalformedNetworks) {
  for (const char* bad : {"", "10.0.0.0/", "10.0.0.0/33", "::/129", "10.0.0.1/8", "10.0.0.0/8x",
                          "example.com/8", "10.0.0/8", "/8", "10.0.0.0/-1"}) {
    EXPECT_FALSE(Cidr::parse(bad).has_value()) << bad;
  }
}
