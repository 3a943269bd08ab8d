#include "spindle/fiber/idle_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/worker.h"
#include "spindle/sync/event.h"

using namespace std::chrono_literals;
using namespace spindle;

namespace {

// Counts what a FreeList disposes of.
struct Counter {
  int disposed = 0;
  void operator()(int) { ++disposed; }
};

// A pool of another layer: it holds `held` items over a floor of 2, and trims like a FreeList.
struct FakeCache final : IdleCache {
  FreeList<int> items{2, 100};
  int trims = 0;
  bool over_floor() const override { return items.over_floor(); }
  std::size_t trim() override {
    ++trims;
    return items.trim([](int) {}) * 1000;
  }
};

}  // namespace

TEST(FreeList, TrimsOnlyWhatNobodyTookSinceTheLastTrimAndNeverBelowItsFloor) {
  FreeList<int> list(/*floor=*/2, /*max=*/10);
  for (int i = 0; i < 12; ++i) (void)list.give(int{i});
  EXPECT_EQ(list.size(), 10u);  // at most max
  Counter counter;
  EXPECT_EQ(list.trim(std::ref(counter)), 0u);  // the count starts here
  // In use: 6 taken at once, then all given back.
  std::vector<int> lent;
  for (int i = 0; i < 6; ++i) lent.push_back(list.take());
  for (int v : lent) (void)list.give(int{v});
  EXPECT_EQ(list.trim(std::ref(counter)), 4u);  // 4 were never taken
  EXPECT_EQ(list.size(), 6u);
  EXPECT_EQ(list.trim(std::ref(counter)), 4u);  // idle since: down to the floor
  EXPECT_EQ(list.size(), 2u);
  EXPECT_FALSE(list.over_floor());
  EXPECT_EQ(list.trim(std::ref(counter)), 0u);
  EXPECT_EQ(counter.disposed, 8);
  // The oldest go first: the most recently given stay.
  EXPECT_EQ(list.take(), lent.back());
}

TEST(Worker, GivesBackTheStacksOfABurstOfFibersOnceIdle) {
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto cache = std::make_shared<FakeCache>();
  std::weak_ptr<FakeCache> watched = cache;
  std::size_t after_burst = runtime.block_on([&] {
    Worker& worker = *Worker::current();
    worker.keep_trimmed(cache);
    for (int i = 0; i < 50; ++i) (void)cache->items.give(int{i});
    // 500 fibers alive at once: 500 stacks, cached when they end.
    Event go;
    std::vector<JoinHandle<void>> burst;
    for (int i = 0; i < 500; ++i) burst.push_back(spawn([&] { (void)go.wait(); }));
    (void)this_fiber::sleep_for(1ms);
    go.set();
    for (auto& f : burst) f.join();
    return worker.stacks().cached();
  });
  EXPECT_GE(after_burst, 500u);
  // Idle now: within a few trims (one a second) the pools are back at their floors.
  auto state = [&] {
    return runtime.block_on(
        [&] { return std::pair(Worker::current()->stacks().cached(), cache->items.size()); });
  };
  for (int i = 0; i < 50 && state().first > StackPool::kFloor; ++i) {
    std::this_thread::sleep_for(100ms);
  }
  auto [stacks, items] = state();
  // The block_on calls themselves take a stack or two.
  EXPECT_LE(stacks, StackPool::kFloor + 2);
  EXPECT_EQ(items, 2u);
  EXPECT_GE(cache->trims, 2);
  // Once only the worker holds a cache, it lets it go.
  cache.reset();
  (void)runtime.block_on([] { return Worker::current()->trim_idle_memory(); });
  EXPECT_TRUE(watched.expired());
}

// A worker whose live fibers swing by thousands (a read of an HTTP/2 upstream's connection ends
// the requests it answers, the clients' next reads start as many) reuses the stacks of one
// swing in the next: none is unmapped as it comes back and mapped again for the next fiber.
TEST(Worker, KeepsEveryStackOfASwingLargerThanAThousandFibersForTheNext) {
  constexpr std::size_t kSwing = 2500;
  Runtime runtime(RuntimeOptions{.workers = 1});
  auto [kept, left_while_alive] = runtime.block_on([&] {
    StackPool& stacks = Worker::current()->stacks();
    auto swing = [&](std::size_t* cached_while_alive) {
      Event go;
      std::vector<JoinHandle<void>> fibers;
      for (std::size_t i = 0; i < kSwing; ++i) fibers.push_back(spawn([&] { (void)go.wait(); }));
      // (A fiber spawned on its own worker takes its stack at once.)
      if (cached_while_alive != nullptr) *cached_while_alive = stacks.cached();
      go.set();
      for (auto& f : fibers) f.join();
    };
    swing(nullptr);
    const std::size_t kept = stacks.cached();
    std::size_t cached_while_alive = 0;
    swing(&cached_while_alive);
    return std::pair(kept, cached_while_alive);
  });
  ASSERT_GE(kept, kSwing);
  // The second swing took its stacks from the first's: as many fewer were waiting.
  EXPECT_EQ(left_while_alive, kept - kSwing);
}
