#include "spindle/fiber/buffer_pool.h"

#include <gtest/gtest.h>

#include "spindle/fiber/this_fiber.h"
#include "spindle/fiber/worker.h"
#include "testing/testing.h"

using namespace spindle;

TEST(BufferPool, LendsEachBufferToOneHolderAndReusesItAfter) {
  BufferPool pool(2);
  auto a = pool.take();
  auto b = pool.take();
  ASSERT_NE(a.data(), nullptr);
  EXPECT_NE(a.data(), b.data());
  char* first = a.data();
  a = BufferPool::Buffer();  // gives it back
  EXPECT_EQ(pool.cached(), 1u);
  auto c = pool.take();
  EXPECT_EQ(c.data(), first);  // the most recently returned one
  EXPECT_EQ(pool.cached(), 0u);
}

TEST(BufferPool, KeepsAtMostItsLimitAndTrimsWhatWasNotReused) {
  BufferPool pool(/*max_cached=*/5, /*floor=*/1);
  {
    std::vector<BufferPool::Buffer> many;
    for (int i = 0; i < 10; ++i) many.push_back(pool.take());
  }
  EXPECT_EQ(pool.cached(), 5u);
  EXPECT_TRUE(pool.over_floor());
  // The first trim only starts the count: all 5 came back since the pool last looked.
  EXPECT_EQ(pool.trim(), 0u);
  // Two were taken and given back meanwhile: the 3 nobody needed go.
  { auto a = pool.take(), b = pool.take(); }
  EXPECT_EQ(pool.trim(), 3 * BufferPool::kBufferSize);
  EXPECT_EQ(pool.cached(), 2u);
  // Nothing taken since: down to the floor, never below it.
  EXPECT_EQ(pool.trim(), BufferPool::kBufferSize);
  EXPECT_EQ(pool.cached(), 1u);
  EXPECT_FALSE(pool.over_floor());
  EXPECT_EQ(pool.trim(), 0u);
  EXPECT_EQ(pool.cached(), 1u);
}

FIBER_TEST(BufferPool, TakeBufferUsesTheWorkersPoolAndParkedHoldersKeepTheirOwn) {
  BufferPool& pool = Worker::current()->buffers();
  std::size_t before = pool.cached();
  auto held = take_buffer();
  held.data()[0] = 'x';
  // Another fiber of the same worker takes one while this one is parked.
  auto other = spawn([] {
    auto mine = take_buffer();
    mine.data()[0] = 'y';
    return mine.data();
  });
  (void)this_fiber::sleep_for(std::chrono::milliseconds(1));
  EXPECT_NE(other.join(), held.data());
  EXPECT_EQ(held.data()[0], 'x');
  // `held` came from the cache if it had one; the other fiber's went back to it.
  std::size_t lent_from_cache = before > 0 ? 1 : 0;
  EXPECT_EQ(pool.cached(), before - lent_from_cache + 1);
}

TEST(BufferPool, TakeBufferWorksOnAPlainThread) {
  auto b = take_buffer();
  ASSERT_NE(b.data(), nullptr);
  b.data()[BufferPool::kBufferSize - 1] = 'z';
}
