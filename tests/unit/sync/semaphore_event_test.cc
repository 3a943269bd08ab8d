#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/sync/event.h"
#include "spindle/sync/semaphore.h"
#include "spindle/sync/wait_group.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;

FIBER_TEST(Semaphore, NeverLetsMoreThanItsPermitsIn) {
  Semaphore semaphore(3);
  std::atomic<int> inside{0}, most{0};
  auto& runtime = Worker::current()->runtime();
  std::vector<JoinHandle<void>> fibers;
  for (int i = 0; i < 30; ++i) {
    fibers.push_back(spawn_on(runtime.worker(i % 2), [&] {
      ASSERT_FALSE(semaphore.acquire(Deadline::after(10s)));
      int now = ++inside;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      (void)this_fiber::sleep_for(1ms);
      --inside;
      semaphore.release();
    }));
  }
  for (auto& f : fibers) f.join();
  EXPECT_LE(most.load(), 3);
  EXPECT_GE(most.load(), 2);
  EXPECT_EQ(semaphore.available(), 3u);
}

FIBER_TEST(Semaphore, AcquireTimesOutWhenNoPermitIsFree) {
  Semaphore semaphore(0);
  EXPECT_FALSE(semaphore.try_acquire());
  EXPECT_EQ(semaphore.acquire(Deadline::after(10ms)), std::errc::timed_out);
  semaphore.release(2);
  EXPECT_TRUE(semaphore.try_acquire());
  EXPECT_EQ(semaphore.available(), 1u);
}

// A deadline that has passed times out the wait at once, without parking, whether it passed
// long ago or a moment ago with no poll of the worker in between (were it compared with the
// last poll's time, the last two would park, and the sibling run).
FIBER_TEST(Event, AWaitWhoseDeadlineHasPassedTimesOutWithoutParking) {
  Event event;
  Semaphore semaphore(0);
  bool sibling_ran = false;
  auto sibling = spawn([&] { sibling_ran = true; });
  auto passed = Clock::now();
  while (Clock::now() == passed) {
  }
  EXPECT_EQ(event.wait(Deadline::no_wait()), std::errc::timed_out);
  EXPECT_EQ(event.wait(Deadline::at(passed - 1h)), std::errc::timed_out);
  EXPECT_EQ(event.wait(Deadline::at(passed)), std::errc::timed_out);
  EXPECT_EQ(semaphore.acquire(Deadline::at(passed)), std::errc::timed_out);
  EXPECT_FALSE(sibling_ran);
  sibling.join();
  event.set();
  EXPECT_FALSE(event.wait(Deadline::at(passed)));  // what is ready now needs no time
}

FIBER_TEST(Semaphore, CancelledAcquireDoesNotConsumeAPermit) {
  Semaphore semaphore(0);
  auto waiter = spawn([&] { return semaphore.acquire(); });
  (void)this_fiber::sleep_for(5ms);
  waiter.request_stop();
  EXPECT_EQ(waiter.join(), std::errc::operation_canceled);
  semaphore.release();
  EXPECT_EQ(semaphore.available(), 1u);
}

FIBER_TEST(Event, WaitReturnsOnceSetFromAPlainThread) {
  Event event;
  std::thread setter([&] {
    std::this_thread::sleep_for(10ms);
    event.set();
  });
  EXPECT_FALSE(event.wait(Deadline::after(10s)));
  setter.join();
  EXPECT_TRUE(event.is_set());
  EXPECT_FALSE(event.wait(Deadline::after(1ms)));  // stays set
  event.reset();
  EXPECT_EQ(event.wait(Deadline::after(5ms)), std::errc::timed_out);
}

FIBER_TEST(Event, CancelledWaitReturnsOperationCanceled) {
  Event event;
  auto waiter = spawn([&] { return event.wait(); });
  (void)this_fiber::sleep_for(5ms);
  waiter.request_stop();
  EXPECT_EQ(waiter.join(), std::errc::operation_canceled);
}

FIBER_TEST(WaitGroup, WaitReturnsWhenAllWorkIsDone) {
  WaitGroup group;
  std::atomic<int> finished{0};
  auto& runtime = Worker::current()->runtime();
  for (int i = 0; i < 50; ++i) {
    group.add();
    spawn_on(runtime.worker(i % 2), [&, i] {
      (void)this_fiber::sleep_for(std::chrono::milliseconds(i % 5));
      ++finished;
      group.done();
    }).detach();
  }
  EXPECT_FALSE(group.wait(Deadline::after(10s)));
  EXPECT_EQ(finished.load(), 50);
  EXPECT_EQ(group.count(), 0u);
}

FIBER_TEST(WaitGroup, WaitTimesOutWhileWorkIsOutstanding) {
  WaitGroup group;
  group.add(1);
  EXPECT_EQ(group.wait(Deadline::after(5ms)), std::errc::timed_out);
  group.done();
  EXPECT_FALSE(group.wait(Deadline::after(5ms)));
}
