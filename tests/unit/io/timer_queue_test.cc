#include "spindle/io/timer_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
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
  EXPECT_EQ(queue.next_deadline(), at(20));
  EXPECT_EQ(queue.pop_due(at(20)), &late);
  EXPECT_EQ(queue.next_deadline(), std::nullopt);
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

// Erased timers leave holes; the queue must still give every other timer, in order, whatever
// mix of pushes, erases and pops came before (compactions included), and each timer it still
// holds must be erasable. A model (deadline, push order) -> timer checks each step.
TEST(TimerQueue, AnyMixOfPushEraseAndPopMatchesAnOrderedModel) {
  std::mt19937 random(7);
  TimerQueue queue;
  std::vector<Timer> timers(3000);
  std::map<std::pair<Clock::time_point, int>, Timer*> model;
  std::vector<int> pushed_at(timers.size(), 0);
  int pushes = 0;
  int now = 0;
  std::size_t compactions = 0;  // holes removed all at once: more than a pop or an erase takes
  for (int step = 0; step < 200'000; ++step) {
    const std::size_t slots_before = queue.slots();
    Timer& t = timers[random() % timers.size()];
    const auto id = static_cast<std::size_t>(&t - timers.data());
    const auto op = random() % 8;
    switch (op) {
      case 0:
      case 1:
      case 2:  // push (a timeout from now, most often; sometimes an earlier one)
        if (!t.queued()) {
          t.when = at(now + static_cast<int>(random() % (random() % 4 == 0 ? 50 : 50'000)));
          queue.push(&t);
          pushed_at[id] = ++pushes;
          model[{t.when, pushed_at[id]}] = &t;
        }
        break;
      case 3:
      case 4:
      case 5:
      case 6:  // erase, queued or not
        if (t.queued()) model.erase({t.when, pushed_at[id]});
        queue.erase(&t);
        EXPECT_FALSE(t.queued());
        break;
      case 7:  // time passes; what is due comes out in order
        now += static_cast<int>(random() % 20);
        while (Timer* due = queue.pop_due(at(now))) {
          ASSERT_FALSE(model.empty());
          ASSERT_EQ(due, model.begin()->second) << "step " << step;
          EXPECT_FALSE(due->queued());
          model.erase(model.begin());
        }
        ASSERT_TRUE(model.empty() || model.begin()->first.first > at(now));
        break;
    }
    ASSERT_EQ(queue.size(), model.size()) << "step " << step;
    // What the worker sleeps until is never later than the earliest timer.
    if (!model.empty()) {
      ASSERT_LE(*queue.next_deadline(), model.begin()->first.first);
    }
    ASSERT_LE(queue.slots(), 2 * queue.size() + TimerQueue::kHoleFloor + 1) << "step " << step;
    if (op != 7 && queue.slots() + 1 < slots_before) ++compactions;
  }
  EXPECT_GT(compactions, 10u);
  while (Timer* due = queue.pop_due(at(1'000'000))) {
    ASSERT_EQ(due, model.begin()->second);
    model.erase(model.begin());
  }
  EXPECT_TRUE(model.empty());
  EXPECT_EQ(queue.slots(), 0u);
}

// A request that waits with a long timeout and ends at once, again and again (a client's pace),
// must not grow the queue: erased timers' holes do not pile up, and once the last timer goes the
// worker has no deadline to wake for.
TEST(TimerQueue, ErasedTimersDoNotPileUp) {
  TimerQueue queue;
  Timer waiting;  // one long-lived timer, so the heap never empties by itself
  waiting.when = at(1);
  queue.push(&waiting);
  std::vector<Timer> timers(16);
  for (int round = 0; round < 100'000; ++round) {
    Timer& t = timers[static_cast<std::size_t>(round) % timers.size()];
    t.when = at(60'000 + round);
    queue.push(&t);
    if (round >= 8) queue.erase(&timers[static_cast<std::size_t>(round - 8) % timers.size()]);
    ASSERT_LE(queue.slots(), 2 * queue.size() + TimerQueue::kHoleFloor + 1) << "round " << round;
  }
  EXPECT_EQ(queue.size(), 9u);
  EXPECT_EQ(queue.next_deadline(), at(1));
  queue.erase(&waiting);
  for (Timer& t : timers) queue.erase(&t);
  EXPECT_TRUE(queue.empty());
  EXPECT_EQ(queue.next_deadline(), std::nullopt);
}
