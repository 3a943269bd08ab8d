// What discovery takes from a DNS reply, whatever the name server put in it: the addresses
// (at most 64), the usable SRV records (no ".", no port 0, no name a Host field cannot carry,
// weights scaled into 1-1000, the lowest priorities' 64), TTLs (negative ones from the SOA).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dns_testing.h"
#include "spindle/proxy/discovery.h"

using namespace spindle::proxy;
using Type = Discovery::Type;
using namespace spindle::proxy::testing;

namespace {

std::optional<DnsReply> read(Type type, const Reply& reply) {
  auto bytes = reply.bytes();
  return read_dns_reply(type, bytes);
}

}  // namespace

TEST(DnsReply, AddressesAreSortedOnceWithTheirLowestTtlAndAtMost64) {
  auto got = read(Type::kA, Reply(kA).a("10.0.0.2", 30).a("10.0.0.1", 20).a("10.0.0.2", 30));
  ASSERT_TRUE(got);
  EXPECT_EQ(got->addresses, (std::vector<std::string>{"10.0.0.1", "10.0.0.2"}));
  EXPECT_EQ(got->ttl, std::chrono::seconds(20));
  Reply many(kA);
  for (int i = 0; i < 300; ++i)
    many.a("10.1." + std::to_string(i / 250) + "." + std::to_string(i % 250));
  got = read(Type::kA, many);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->addresses.size(), 64u);
  // A TTL with its top bit set counts as 0 (RFC 2181).
  got = read(Type::kA, Reply(kA).a("10.0.0.1", 0x80000000u));
  ASSERT_TRUE(got);
  EXPECT_EQ(got->ttl, std::chrono::seconds(0));
}

TEST(DnsReply, AnEmptyReplyGivesItsSoasNegativeTtl) {
  auto got = read(Type::kAaaa, Reply(kAaaa).soa(3600, 30));
  ASSERT_TRUE(got);
  EXPECT_TRUE(got->addresses.empty());
  EXPECT_EQ(got->ttl, std::chrono::seconds(30));
  got = read(Type::kAaaa, Reply(kAaaa, 3).soa(20, 300));  // NXDOMAIN: the lower of the two
  ASSERT_TRUE(got);
  EXPECT_EQ(got->ttl, std::chrono::seconds(20));
  got = read(Type::kAaaa, Reply(kAaaa));
  ASSERT_TRUE(got);
  EXPECT_FALSE(got->ttl);  // no SOA: no negative TTL (min_ttl applies)
}

TEST(DnsReply, SrvRecordsAreKeptOfEveryPriorityAndOddOnesLeftOut) {
  auto got = read(Type::kSrv, Reply(kSrv)
                                  .srv(20, 0, 80, {"b", "test"})
                                  .srv(10, 65535, 80, {"a", "test"})
                                  .srv(10, 21845, 81, {"c", "test"})
                                  .srv(10, 1, 80, {})  // ".": no service there
                                  .srv(10, 1, 0, {"zero", "test"})
                                  .srv(10, 1, 80, {"bad\r\nx-injected: 1", "test"})
                                  .srv(10, 1, 80, {"sp ace", "test"})
                                  .srv(30, 1, 80, {"a", "test"}));  // a:80 again: kept at 10
  ASSERT_TRUE(got);
  std::vector<DnsAnswers::Srv> want{
      {"a.test", 80, 1000, 10}, {"c.test", 81, 333, 10}, {"b.test", 80, 1, 20}};
  EXPECT_EQ(got->records, want);
}

TEST(DnsReply, AtMost64SrvRecordsAreUsedTheLowestPrioritiesFirst) {
  Reply reply(kSrv);
  for (int i = 0; i < 200; ++i) {
    reply.srv(static_cast<std::uint16_t>(1000 - i), 1, 80, {"n" + std::to_string(i), "test"});
  }
  auto got = read(Type::kSrv, reply);
  ASSERT_TRUE(got);
  ASSERT_EQ(got->records.size(), 64u);
  EXPECT_EQ(got->records.front().priority, 801u);
  EXPECT_EQ(got->records.back().priority, 864u);
}

TEST(DnsReply, EveryCutOfAReplyIsReadSafelyOrRefused) {
  auto whole = Reply(kSrv).srv(10, 5, 80, {"a", "test"}).soa(60, 60).bytes();
  for (std::size_t n = 0; n < whole.size(); ++n) {
    std::vector<std::uint8_t> cut(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(n));
    auto got = read_dns_reply(Type::kSrv, cut);
    if (got) {
      EXPECT_TRUE(got->records.empty() || got->records[0].host == "a.test") << n;
    }
  }
  EXPECT_EQ(read_dns_reply(Type::kSrv, whole)->records.size(), 1u);
}
