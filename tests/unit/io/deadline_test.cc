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
