// BlockingPool: work that would hold a worker's thread runs on a helper thread while the
// worker serves its other fibers.
#include "spindle/sync/blocking_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"

using namespace std::chrono_literals;
using namespace spindle;

TEST(BlockingPool, TheWorkerServesOtherFibersWhileTheWorkRuns) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  BlockingPool pool(1);
  std::atomic<int> ticks{0};
  auto result = runtime.block_on([&] {
    auto ticker = spawn([&] {
      for (int i = 0; i < 10; ++i) {
        (void)this_fiber::sleep_for(10ms);
        ++ticks;
      }
    });
    auto thread = pool.run([] {
      std::this_thread::sleep_for(300ms);  // blocks its thread, not the worker
      return std::this_thread::get_id();
    });
    ticker.join();
    return thread;
  });
  EXPECT_EQ(ticks.load(), 10);
  EXPECT_NE(result, std::this_thread::get_id());
}

TEST(BlockingPool, ACancelledFiberStillGetsTheResultOnceTheWorkIsDone) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  runtime.start();
  BlockingPool pool(1);
  auto fiber = spawn_on(runtime.worker(0), [&] {
    return pool.run([] {
      std::this_thread::sleep_for(100ms);
      return 7;
    });
  });
  std::this_thread::sleep_for(20ms);
  fiber.request_stop();
  EXPECT_EQ(fiber.join(), 7);
}
