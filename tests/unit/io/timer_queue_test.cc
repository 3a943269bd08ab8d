#include "spindle/io/timer_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

using spindle::Clock;
using spindle::Timer;
using spindle::TimerQueue;

namespace {
Clock::time_point at(int ms) { return Clock::time_point{} + std::chrono::milliseconds(ms); }
}  // namespace

TEST(TimerQueue, PopsDueTimersInDeadlineOrder) {
  TimerQueue queue;
  std::vector<Timer> timers(5);
  int when[] = {50, 10, 40, 20, 30};
  for (int i = 0; i < 5; ++i) {
    timers[i].when = at(when[i]);
    queue.push(&timers[i]);
  }
  std::vector<int> order;
  while (Timer* t = queue.pop_due(at(100))) order.push_back(static_cast<int>(t - timers.data()));
  EXPECT_EQ(order, (std::vector<int>{1, 3, 4, 2, 0}));
  EXPECT_TRUE(queue.empty());
}

TEST(TimerQueue, DoesNotPopTimersThatAreNotDue) {
  TimerQueue queue;
  Timer early, late;
  early.when = at(10);
  late.when = at(20);
  queue.push(&late);
  queue.push(&early);
  EXPECT_EQ(queue.pop_due(at(15)), &early);
  EXPECT_EQ(queue.pop_due(at(15)), nullptr);
  EXPECT_EQ(queue.top(), &late);
}

TEST(TimerQueue, EqualDeadlinesFireInInsertionOrder) {
  TimerQueue queue;
  std::vector<Timer> timers(4);
  for (auto& t : timers) {
    t.when = at(5);
    queue.push(&t);
  }
  for (auto& t : timers) EXPECT_EQ(queue.pop_due(at(5)), &t);
}

TEST(TimerQueue, EraseRemovesFromAnyPositionAndKeepsTheHeapValid) {
  std::mt19937 random(42);
  TimerQueue queue;
  std::vector<Timer> timers(1000);
  for (auto& t : timers) {
    t.when = at(static_cast<int>(random() % 10'000));
    queue.push(&t);
  }
  // Erase every third timer, then every remaining one must come out sorted.
  for (std::size_t i = 0; i < timers.size(); i += 3) {
    queue.erase(&timers[i]);
    EXPECT_FALSE(timers[i].queued());
  }
  std::vector<Clock::time_point> popped;
  while (Timer* t = queue.pop_due(at(20'000))) popped.push_back(t->when);
  EXPECT_EQ(popped.size(), timers.size() - (timers.size() + 2) / 3);
  EXPECT_TRUE(std::is_sorted(popped.begin(), popped.end()));
}

TEST(TimerQueue, EraseOfAnUnqueuedTimerIsANoOp) {
  TimerQueue queue;
  Timer t;
  queue.erase(&t);
  t.when = at(1);
  queue.push(&t);
  queue.erase(&t);
  queue.erase(&t);
  EXPECT_TRUE(queue.empty());
}
