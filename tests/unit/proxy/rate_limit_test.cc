// The lock-free GCRA table behind the rate_limit middleware.
#include "spindle/proxy/rate_limit.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::proxy;

TEST(RateLimitTable, ABurstThenTheSteadyRate) {
  RateLimitTable table(10, 5);  // 10/s, 5 at once
  auto t0 = Clock::now();
  auto key = rate_limit_hash("ip:192.0.2.1");
  for (int i = 0; i < 5; ++i) {
    auto d = table.take(key, t0);
    EXPECT_TRUE(d.allowed) << i;
    EXPECT_EQ(d.remaining, static_cast<std::uint64_t>(4 - i)) << i;
  }
  auto refused = table.take(key, t0);
  EXPECT_FALSE(refused.allowed);
  EXPECT_NEAR(refused.retry_after, 0.1, 1e-6);  // one interval
  EXPECT_NEAR(refused.reset, 0.5, 1e-6);        // five intervals to a full burst
  // Another key has its own burst.
  EXPECT_TRUE(table.take(rate_limit_hash("ip:192.0.2.2"), t0).allowed);
  // One interval later, one more; a full burst after half a second.
  EXPECT_TRUE(table.take(key, t0 + 100ms).allowed);
  EXPECT_FALSE(table.take(key, t0 + 100ms).allowed);
  int allowed = 0;
  for (int i = 0; i < 10; ++i) allowed += table.take(key, t0 + 700ms).allowed ? 1 : 0;
  EXPECT_EQ(allowed, 5);
}

TEST(RateLimitTable, ThreadsTakingAtOnceGetExactlyTheBurst) {
  RateLimitTable table(1, 1000);  // no refill to speak of during the test
  auto now = Clock::now();
  auto key = rate_limit_hash("route");
  std::atomic<int> allowed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) allowed += table.take(key, now).allowed ? 1 : 0;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(allowed.load(), 1000);
}

TEST(RateLimitTable, AQuietKeyGivesItsSlotUpAndAFullTableLetsRequestsBy) {
  RateLimitTable table(1, 1, 8);  // 8 slots: one probe window
  auto t0 = Clock::now();
  for (int k = 0; k < 8; ++k)
    EXPECT_TRUE(table.take(rate_limit_hash(std::to_string(k)), t0).allowed);
  // Every slot holds a key still counting down: a ninth key is let by (counted nowhere).
  auto ninth = rate_limit_hash("ninth");
  EXPECT_TRUE(table.take(ninth, t0).allowed);
  EXPECT_TRUE(table.take(ninth, t0).allowed);
  // Two seconds on, the first keys are back to a full burst: their slots are free again, and the
  // ninth key is limited like any other.
  EXPECT_TRUE(table.take(ninth, t0 + 2s).allowed);
  EXPECT_FALSE(table.take(ninth, t0 + 2s).allowed);
}
