#include "spindle/sync/mutex.h"

#include <gtest/gtest.h>

#include <mutex>
#include <thread>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/this_fiber.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using namespace spindle;

FIBER_TEST(Mutex, ProtectsACounterAcrossFibersOnEveryWorker) {
  Mutex mutex;
  long counter = 0;  // deliberately not atomic: the mutex is what keeps it right
  auto& runtime = Worker::current()->runtime();
  std::vector<JoinHandle<void>> fibers;
  for (int f = 0; f < 20; ++f) {
    fibers.push_back(spawn_on(runtime.worker(f % runtime.size()), [&] {
      for (int i = 0; i < 2000; ++i) {
        std::lock_guard lock(mutex);
        long seen = counter;
        if (i % 100 == 0) this_fiber::yield();  // hold the lock across a switch
        counter = seen + 1;
      }
    }));
  }
  for (auto& f : fibers) f.join();
  EXPECT_EQ(counter, 20 * 2000);
}

FIBER_TEST(Mutex, TryLockFailsWhileHeld) {
  Mutex mutex;
  ASSERT_TRUE(mutex.try_lock());
  EXPECT_FALSE(spawn([&] { return mutex.try_lock(); }).join());
  mutex.unlock();
  EXPECT_TRUE(mutex.try_lock());
  mutex.unlock();
}

FIBER_TEST(Mutex, LockUntilTimesOutWhileHeld) {
  Mutex mutex;
  mutex.lock();
  auto start = Clock::now();
  auto ec = spawn([&] { return mutex.lock_until(Deadline::after(20ms)); }).join();
  EXPECT_EQ(ec, std::errc::timed_out);
  EXPECT_GE(Clock::now() - start, 20ms);
  mutex.unlock();
  // The timed-out waiter left the queue: the mutex is free again.
  EXPECT_TRUE(mutex.try_lock());
  mutex.unlock();
}

FIBER_TEST(Mutex, WaiterOnAnotherWorkerGetsTheLockOnUnlock) {
  Mutex mutex;
  mutex.lock();
  auto& runtime = Worker::current()->runtime();
  auto waiter = spawn_on(runtime.worker(1), [&] {
    auto ec = mutex.lock_until(Deadline::after(10s));
    if (!ec) mutex.unlock();
    return ec;
  });
  (void)this_fiber::sleep_for(10ms);
  mutex.unlock();
  EXPECT_FALSE(waiter.join());
}

FIBER_TEST(Mutex, CancellingABlockedLockReturnsOperationCanceled) {
  Mutex mutex;
  mutex.lock();
  auto waiter = spawn([&] { return mutex.lock_until(Deadline::never()); });
  (void)this_fiber::sleep_for(5ms);
  waiter.request_stop();
  EXPECT_EQ(waiter.join(), std::errc::operation_canceled);
  mutex.unlock();
  EXPECT_TRUE(mutex.try_lock());
  mutex.unlock();
}

TEST(Mutex, WorksBetweenPlainThreads) {
  Mutex mutex;
  long counter = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        std::lock_guard lock(mutex);
        ++counter;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, 4 * 20000);
}
