#include "spindle/sync/condition_variable.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/this_fiber.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;

FIBER_TEST(ConditionVariable, WakesAWaiterOnAnotherWorker) {
  Mutex mutex;
  ConditionVariable cv;
  bool ready = false;
  auto& runtime = Worker::current()->runtime();
  auto waiter = spawn_on(runtime.worker(1), [&] {
    std::unique_lock lock(mutex);
    return cv.wait_until(mutex, Deadline::after(10s), [&] { return ready; });
  });
  (void)this_fiber::sleep_for(5ms);
  {
    std::lock_guard lock(mutex);
    ready = true;
  }
  cv.notify_one();
  EXPECT_FALSE(waiter.join());
}

FIBER_TEST(ConditionVariable, NotifyAllWakesEveryWaiter) {
  Mutex mutex;
  ConditionVariable cv;
  bool go = false;
  int woken = 0;
  auto& runtime = Worker::current()->runtime();
  std::vector<JoinHandle<void>> waiters;
  for (int i = 0; i < 10; ++i) {
    waiters.push_back(spawn_on(runtime.worker(i % 2), [&] {
      std::unique_lock lock(mutex);
      if (!cv.wait(mutex, [&] { return go; })) ++woken;
    }));
  }
  (void)this_fiber::sleep_for(10ms);
  {
    std::lock_guard lock(mutex);
    go = true;
  }
  cv.notify_all();
  for (auto& w : waiters) w.join();
  EXPECT_EQ(woken, 10);
}

FIBER_TEST(ConditionVariable, WaitTimesOutAndReacquiresTheMutex) {
  Mutex mutex;
  ConditionVariable cv;
  std::unique_lock lock(mutex);
  auto ec = cv.wait_until(mutex, Deadline::after(10ms), [] { return false; });
  EXPECT_EQ(ec, std::errc::timed_out);
  // We hold the mutex again: another fiber cannot take it.
  EXPECT_FALSE(spawn([&] { return mutex.try_lock(); }).join());
}

FIBER_TEST(ConditionVariable, CancelledWaitReturnsOperationCanceledHoldingTheMutex) {
  Mutex mutex;
  ConditionVariable cv;
  auto waiter = spawn([&] {
    std::unique_lock lock(mutex);
    auto ec = cv.wait(mutex);
    bool holds = !mutex.try_lock();
    return std::make_pair(ec, holds);
  });
  (void)this_fiber::sleep_for(5ms);
  waiter.request_stop();
  auto [ec, holds] = waiter.join();
  EXPECT_EQ(ec, std::errc::operation_canceled);
  EXPECT_TRUE(holds);
}
