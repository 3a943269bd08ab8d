#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "spindle/fiber/fiber_local.h"
#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/worker.h"
#include "spindle/sync/event.h"
#include "testing/testing.h"

using namespace std::chrono_literals;
using spindle::Deadline;
using spindle::Runtime;
using spindle::RuntimeOptions;
using spindle::spawn;
using spindle::spawn_on;
namespace this_fiber = spindle::this_fiber;

FIBER_TEST(Fiber, JoinReturnsTheValue) {
  auto handle = spawn([] { return std::string("forty-two"); });
  EXPECT_EQ(handle.join(), "forty-two");
}

FIBER_TEST(Fiber, JoinRethrowsTheFibersException) {
  auto handle = spawn([]() -> int { throw std::runtime_error("boom"); });
  EXPECT_THROW(
      {
        try {
          handle.join();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "boom");
          throw;
        }
      },
      std::runtime_error);
}

// A fiber spawned run_next runs before those runnable already (in turn, it would run last).
FIBER_TEST(Fiber, ARunNextFiberRunsBeforeThoseAlreadyRunnable) {
  std::vector<char> order;
  auto a = spawn([&] { order.push_back('a'); });
  auto b = spawn([&] { order.push_back('b'); });
  auto next = spawn([&] { order.push_back('n'); }, spindle::SpawnOptions{.run_next = true});
  auto last = spawn([&] { order.push_back('z'); });
  this_fiber::yield();
  a.join();
  b.join();
  next.join();
  last.join();
  EXPECT_EQ(order, (std::vector<char>{'n', 'a', 'b', 'z'}));
}

FIBER_TEST(Fiber, YieldInterleavesFibersInFifoOrder) {
  std::vector<int> order;
  auto a = spawn([&] {
    for (int i = 0; i < 3; ++i) {
      order.push_back(i * 2);
      this_fiber::yield();
    }
  });
  auto b = spawn([&] {
    for (int i = 0; i < 3; ++i) {
      order.push_back(i * 2 + 1);
      this_fiber::yield();
    }
  });
  a.join();
  b.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

// The hook runs on the fiber as it first gives up the worker after arming (here a yield, then
// a sleep's park), once per arming, and not at all once disarmed or at the fiber's end.
FIBER_TEST(Fiber, ASuspendHookRunsOnceBeforeTheNextParkOrYield) {
  std::vector<std::string> events;
  auto note = [](void* arg) { static_cast<std::vector<std::string>*>(arg)->push_back("hook"); };
  auto fiber = spawn([&] {
    spindle::detail::on_next_suspend(note, &events);
    events.push_back("armed");
    this_fiber::yield();
    events.push_back("back");
    this_fiber::yield();  // fired already: nothing
    spindle::detail::on_next_suspend(note, &events);
    (void)this_fiber::sleep_for(std::chrono::milliseconds(1));
    events.push_back("slept");
    spindle::detail::on_next_suspend(note, &events);
    spindle::detail::on_next_suspend(nullptr, nullptr);
    this_fiber::yield();
    spindle::detail::on_next_suspend(note, &events);  // armed at the end: the end is no suspend
  });
  fiber.join();
  EXPECT_EQ(events, (std::vector<std::string>{"armed", "hook", "back", "hook", "slept"}));
}

FIBER_TEST(Fiber, IdsAreUniqueAndNonZero) {
  auto a = spawn([] { return this_fiber::id(); });
  auto b = spawn([] { return this_fiber::id(); });
  auto ida = a.id(), idb = b.id();
  EXPECT_NE(ida, 0u);
  EXPECT_NE(ida, idb);
  EXPECT_EQ(a.join(), ida);
  EXPECT_EQ(b.join(), idb);
  EXPECT_NE(this_fiber::id(), 0u);
}

FIBER_TEST(Fiber, SleepForWaitsAtLeastTheDuration) {
  auto start = spindle::Clock::now();
  EXPECT_FALSE(this_fiber::sleep_for(20ms));
  EXPECT_GE(spindle::Clock::now() - start, 20ms);
}

FIBER_TEST(Fiber, SleepUntilAPastDeadlineReturnsAtOnce) {
  // "At once": without parking, so a fiber that is ready has not run when it returns.
  bool sibling_ran = false;
  auto sibling = spawn([&] { sibling_ran = true; });
  auto start = spindle::Clock::now();
  EXPECT_FALSE(this_fiber::sleep_until(Deadline::at(start - 1s)));
  EXPECT_FALSE(sibling_ran);
  sibling.join();
  EXPECT_TRUE(sibling_ran);
  EXPECT_FALSE(this_fiber::sleep_until(Deadline::at(start + 15ms)));
  EXPECT_GE(spindle::Clock::now() - start, 15ms);
}

FIBER_TEST(Fiber, SleepingFibersWakeInDeadlineOrder) {
  std::vector<int> order;
  std::vector<spindle::JoinHandle<void>> handles;
  for (int ms : {30, 10, 20}) {
    handles.push_back(spawn([&order, ms] {
      (void)this_fiber::sleep_for(std::chrono::milliseconds(ms));
      order.push_back(ms);
    }));
  }
  for (auto& h : handles) h.join();
  EXPECT_EQ(order, (std::vector<int>{10, 20, 30}));
}

FIBER_TEST(Fiber, RequestStopCancelsASleep) {
  auto sleeper = spawn([] { return this_fiber::sleep_for(1h); });
  (void)this_fiber::sleep_for(5ms);
  sleeper.request_stop();
  EXPECT_EQ(sleeper.join(), std::errc::operation_canceled);
}

FIBER_TEST(Fiber, StopRequestedBeforeAWaitMakesItReturnAtOnce) {
  auto fiber = spawn([] {
    while (!this_fiber::stop_requested()) this_fiber::yield();
    return this_fiber::sleep_for(1h);
  });
  fiber.request_stop();
  EXPECT_EQ(fiber.join(), std::errc::operation_canceled);
}

FIBER_TEST(Fiber, RequestStopFromAnotherWorkerWakesTheFiber) {
  auto& runtime = spindle::Worker::current()->runtime();
  auto sleeper = spawn_on(runtime.worker(1), [] { return this_fiber::sleep_for(1h); });
  (void)this_fiber::sleep_for(5ms);
  sleeper.request_stop();
  EXPECT_EQ(sleeper.join(), std::errc::operation_canceled);
}

FIBER_TEST(Fiber, SpawnOnRunsOnTheChosenWorker) {
  auto& runtime = spindle::Worker::current()->runtime();
  for (std::size_t i = 0; i < runtime.size(); ++i) {
    auto h = spawn_on(runtime.worker(i), [] { return spindle::Worker::current()->index(); });
    EXPECT_EQ(h.join(), i);
  }
}

FIBER_TEST(Fiber, WorkerPostRunsTheTaskOnThatWorkersThread) {
  auto& runtime = spindle::Worker::current()->runtime();
  std::atomic<std::size_t> ran_on{99};
  std::atomic<bool> flag{false};
  runtime.worker(1).post([&] {
    ran_on = spindle::Worker::current()->index();
    flag = true;
  });
  while (!flag) (void)this_fiber::sleep_for(1ms);
  EXPECT_EQ(ran_on.load(), 1u);
}

FIBER_TEST(Fiber, FiberLocalHasOneValuePerFiber) {
  static spindle::FiberLocal<int> local;
  local.get() = 7;
  auto other = spawn([] {
    int first = local.get();
    local.get() = 9;
    return first;
  });
  EXPECT_EQ(other.join(), 0);
  EXPECT_EQ(local.get(), 7);
}

TEST(FiberLocal, ThrowsOutsideAFiber) {
  spindle::FiberLocal<int> local;
  EXPECT_THROW(local.get(), std::logic_error);
}

FIBER_TEST(Fiber, FiberLocalValueIsDestroyedWhenTheFiberEnds) {
  struct Tracker {
    std::atomic<int>* destroyed = nullptr;
    ~Tracker() {
      if (destroyed) ++*destroyed;
    }
  };
  static spindle::FiberLocal<Tracker> local;
  std::atomic<int> destroyed{0};
  spawn([&] { local.get().destroyed = &destroyed; }).join();
  EXPECT_EQ(destroyed.load(), 1);
}

FIBER_TEST(Fiber, HundredThousandFibersAliveAtOnce) {
  constexpr int kFibers = 100'000;
  long max_maps = spindle::testing::read_proc_number("/proc/sys/vm/max_map_count");
  if (max_maps >= 0 && max_maps < 2 * kFibers + 10'000) {
    GTEST_SKIP() << "vm.max_map_count=" << max_maps << " allows about " << max_maps / 2
                 << " guarded stacks; " << kFibers << " need " << 2 * kFibers + 10'000
                 << " (make test raises it: sysctl -w vm.max_map_count=262144)";
  }
  std::atomic<int> alive{0};
  std::atomic<int> peak{0};
  spindle::Event release;
  std::vector<spindle::JoinHandle<void>> handles;
  handles.reserve(kFibers);
  auto& runtime = spindle::Worker::current()->runtime();
  for (int i = 0; i < kFibers; ++i) {
    handles.push_back(spawn_on(runtime.worker(i % runtime.size()), [&] {
      int now = ++alive;
      int seen = peak.load();
      while (now > seen && !peak.compare_exchange_weak(seen, now)) {
      }
      (void)release.wait();
      --alive;
    }));
  }
  while (alive.load() < kFibers) (void)this_fiber::sleep_for(1ms);
  release.set();
  for (auto& h : handles) h.join();
  EXPECT_EQ(peak.load(), kFibers);
  EXPECT_EQ(alive.load(), 0);
}

TEST(Runtime, StartAndStopRepeatedly) {
  for (int i = 0; i < 50; ++i) {
    Runtime runtime(RuntimeOptions{.workers = 2});
    int value = runtime.block_on([i] { return spawn([i] { return i * 2; }).join(); });
    EXPECT_EQ(value, i * 2);
  }
}

TEST(Runtime, StopCancelsParkedFibersAndJoinReturns) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  runtime.start();
  std::atomic<int> cancelled{0};
  for (std::size_t w = 0; w < runtime.size(); ++w) {
    for (int i = 0; i < 10; ++i) {
      spawn_on(runtime.worker(w), [&] {
        if (this_fiber::sleep_for(1h) == std::errc::operation_canceled) ++cancelled;
      }).detach();
    }
  }
  std::this_thread::sleep_for(20ms);
  runtime.stop();
  runtime.join();
  EXPECT_EQ(cancelled.load(), 20);
}

TEST(Runtime, CancelFibersEndsTheLiveOnesAndTheWorkersGoOn) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  runtime.start();
  std::vector<spindle::JoinHandle<bool>> sleepers;
  for (std::size_t w = 0; w < runtime.size(); ++w) {
    sleepers.push_back(spawn_on(runtime.worker(w), [] {
      return this_fiber::sleep_for(1h) == std::errc::operation_canceled;
    }));
  }
  std::this_thread::sleep_for(20ms);
  runtime.cancel_fibers();
  for (auto& s : sleepers) EXPECT_TRUE(s.join());
  // The workers still run fibers started afterwards, which are not cancelled.
  for (std::size_t w = 0; w < runtime.size(); ++w) {
    EXPECT_FALSE(spawn_on(runtime.worker(w), [] {
                   return static_cast<bool>(this_fiber::sleep_for(5ms));
                 }).join());
  }
}

TEST(Runtime, JoinFromAPlainThreadWaitsForTheFiber) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  runtime.start();
  auto handle = spawn_on(runtime.worker(0), [] {
    (void)this_fiber::sleep_for(10ms);
    return 5;
  });
  EXPECT_EQ(handle.join(), 5);
}

TEST(Runtime, DetachedFiberExceptionEndsOnlyThatFiberAndIsLogged) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  ::testing::internal::CaptureStderr();
  int after = runtime.block_on([] {
    // One that throws after it is detached, one that had thrown before.
    spawn([] {
      this_fiber::yield();
      throw std::runtime_error("detached failure");
    }).detach();
    auto early = spawn([] { throw std::runtime_error("early failure"); });
    (void)this_fiber::sleep_for(5ms);
    early.detach();
    return spawn([] { return 3; }).join();
  });
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(after, 3);
  EXPECT_NE(log.find("ended by an exception: detached failure"), std::string::npos) << log;
  EXPECT_NE(log.find("early failure"), std::string::npos) << log;
}

TEST(Runtime, PostFromAPlainThreadRunsOnTheWorker) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  runtime.start();
  std::atomic<int> ran_on{-1};
  spindle::Event done;
  runtime.worker(1).post([&] {
    ran_on = static_cast<int>(spindle::Worker::current()->index());
    done.set();
  });
  EXPECT_FALSE(done.wait(Deadline::after(10s)));
  EXPECT_EQ(ran_on.load(), 1);
}

TEST(Runtime, TasksLeftForTheRoundsEndRunAfterItsFibersInOrderUnlessWithdrawn) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  std::vector<std::string> log;
  struct Logged : spindle::RoundEndTask {
    std::vector<std::string>* log = nullptr;
    std::string name;
  };
  Logged tasks[3];
  runtime.block_on([&] {
    std::vector<spindle::JoinHandle<void>> fibers;
    for (int i = 0; i < 3; ++i) {
      // Spawned together: one round runs the three before any task.
      fibers.push_back(spawn([&, i] {
        Logged& task = tasks[i];
        task.log = &log;
        task.name = "task " + std::to_string(i);
        task.run = [](spindle::RoundEndTask& t) {
          auto& self = static_cast<Logged&>(t);
          self.log->push_back(self.name);
        };
        spindle::Worker::current()->at_round_end(task);
        EXPECT_TRUE(task.queued);
        if (i == 1) {
          spindle::Worker::current()->withdraw(task);
          EXPECT_FALSE(task.queued);
        }
        log.push_back("fiber " + std::to_string(i));
      }));
    }
    for (auto& f : fibers) f.join();
    // The last fiber's end may wake this one within the same round: a sleep lets it end.
    (void)this_fiber::sleep_for(1ms);
    EXPECT_EQ(log, (std::vector<std::string>{"fiber 0", "fiber 1", "fiber 2", "task 0", "task 2"}));
    for (const Logged& task : tasks) EXPECT_FALSE(task.queued);
  });
}

TEST(Runtime, SpawnOutsideAWorkerThrows) {
  EXPECT_THROW(spawn([] {}), std::logic_error);
}

namespace {
// Deliberately unbounded: it must run into the guard page.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winfinite-recursion"
int recurse(int depth) {
  volatile char frame[512];
  frame[0] = static_cast<char>(depth);
  return recurse(depth + 1) + frame[0];
}
#pragma GCC diagnostic pop
}  // namespace

TEST(FiberDeathTest, StackOverflowCrashesWithAClearMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Runtime runtime(RuntimeOptions{.workers = 1, .stack_size = 16 * 1024});
        runtime.block_on([] { return recurse(0); });
      },
      "stack overflow");
}

TEST(FiberDeathTest, AnOverflowOfAChunksLowestStackFaultsOnTheChunksGuard) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Runtime runtime(RuntimeOptions{.workers = 1, .huge_page_stacks = true});
        runtime.block_on([] { return recurse(0); });
      },
      "stack overflow");
}
