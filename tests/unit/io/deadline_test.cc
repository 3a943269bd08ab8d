#include "spindle/io/deadline.h"

#include <gtest/gtest.h>

using namespace std::chrono_literals;
using spindle::Clock;
using spindle::Deadline;

TEST(Deadline, NeverDoesNotExpire) {
  Deadline d = Deadline::never();
  EXPECT_FALSE(d.is_finite());
  EXPECT_FALSE(d.expired());
  EXPECT_FALSE(d.expired(Clock::time_point::max() - 1s));
}

TEST(Deadline, AfterExpiresOnceTheDurationPassed) {
  Deadline d = Deadline::after(10ms);
  EXPECT_TRUE(d.is_finite());
  EXPECT_FALSE(d.expired(d.when() - 1ms));
  EXPECT_TRUE(d.expired(d.when()));
}

TEST(Deadline, EarliestPicksTheSoonerOne) {
  Deadline a = Deadline::at(Clock::time_point{} + 5s);
  Deadline b = Deadline::at(Clock::time_point{} + 7s);
  EXPECT_EQ(earliest(a, b), a);
  EXPECT_EQ(earliest(b, Deadline::never()), b);
}

// coarse_now reads the same clock as Clock::now, a tick behind at most: comparable with it.
TEST(Deadline, CoarseNowIsTheSameClockATickBehindAtMost) {
  for (int i = 0; i < 1000; ++i) {
    auto before = Clock::now();
    auto coarse = spindle::coarse_now();
    auto after = Clock::now();
    EXPECT_LE(coarse, after);
    // A tick is 1-10 ms (CONFIG_HZ); 50 ms leaves room for a preempted thread.
    EXPECT_GT(coarse, before - std::chrono::milliseconds(50));
  }
  auto d = Deadline::after_coarse(std::chrono::seconds(5));
  EXPECT_FALSE(d.expired());
  EXPECT_LE(d.when(), Clock::now() + std::chrono::seconds(5));
}
