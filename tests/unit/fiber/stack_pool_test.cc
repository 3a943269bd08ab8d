// StackPool's huge-page chunks: where the stacks lie, the canary that stands for a guard page
// between them, and the memory a trim gives back.

#include "spindle/fiber/stack_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "spindle/fiber/runtime.h"
#include "spindle/fiber/spawn.h"
#include "spindle/sync/event.h"

namespace spindle {
namespace {

constexpr std::size_t kStack = 64 * 1024;
constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::uintptr_t address(const Stack& s) { return reinterpret_cast<std::uintptr_t>(s.base); }

TEST(StackPool, HugePageStacksAreCarvedSideBySideFromAlignedChunks) {
  StackPool pool(kStack, 16, true);
  ASSERT_TRUE(pool.huge_pages());
  const std::size_t per_chunk = StackPool::kChunkSize / kStack;
  std::vector<Stack> stacks;
  for (std::size_t i = 0; i < per_chunk + 3; ++i) stacks.push_back(pool.allocate());
  // The first chunk's stacks, lowest first, one after the other from a 2 MiB boundary.
  EXPECT_EQ(address(stacks[0]) % kHugePage, 0u);
  for (std::size_t i = 1; i < per_chunk; ++i) {
    EXPECT_EQ(address(stacks[i]), address(stacks[0]) + i * kStack) << i;
  }
  // Then a second chunk.
  EXPECT_EQ(address(stacks[per_chunk]) % kHugePage, 0u);
  std::set<std::uintptr_t> distinct;
  for (const Stack& s : stacks) {
    EXPECT_EQ(s.size, kStack);
    distinct.insert(address(s));
    // Every byte but the canary's at the bottom is the fiber's.
    std::memset(static_cast<char*>(s.base) + 16, 0xab, s.size - 16);
  }
  EXPECT_EQ(distinct.size(), stacks.size());
  for (Stack& s : stacks) pool.deallocate(s);
  EXPECT_EQ(pool.cached(), 2 * per_chunk);
  // The most recently returned comes back first.
  Stack again = pool.allocate();
  EXPECT_EQ(again.base, stacks.back().base);
  pool.deallocate(again);
}

TEST(StackPool, AStackOfAnotherSizeIsMappedWithItsOwnGuard) {
  StackPool pool(kStack, 16, true);
  Stack big = pool.allocate(4 * kStack);
  EXPECT_EQ(big.size, 4 * kStack);
  Stack pooled = pool.allocate();
  // Not in the chunk: a mapping of its own.
  EXPECT_TRUE(address(big) + big.size <= address(pooled) ||
              address(big) >= address(pooled) + StackPool::kChunkSize);
  pool.deallocate(big);
  pool.deallocate(pooled);
  EXPECT_EQ(pool.cached(), StackPool::kChunkSize / kStack);  // the big one was unmapped
}

TEST(StackPool, ATrimGivesBackAChunkNoStackUses) {
  StackPool pool(kStack, 16, true);
  Stack a = pool.allocate();
  Stack b = pool.allocate();
  for (const Stack& s : {a, b}) std::memset(static_cast<char*>(s.base) + 16, 1, s.size - 16);
  pool.deallocate(b);
  // One stack still in use: the chunk stays.
  EXPECT_FALSE(pool.over_floor());
  EXPECT_EQ(pool.trim(), 0u);
  pool.deallocate(a);
  EXPECT_TRUE(pool.over_floor());
  EXPECT_EQ(pool.trim(), StackPool::kChunkSize);
  EXPECT_FALSE(pool.over_floor());
  EXPECT_EQ(pool.trim(), 0u);  // nothing resident any more
  // Its pages come back zeroed; a stack taken again is whole and has its canary.
  Stack c = pool.allocate();
  EXPECT_EQ(static_cast<unsigned char*>(c.base)[kStack - 1], 0);
  pool.deallocate(c);
}

TEST(StackPoolDeathTest, AStackThatRanPastItsEndAbortsWhenItComesBack) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        StackPool pool(kStack, 16, true);
        pool.allocate();  // the lowest: below it is the guard page
        Stack second = pool.allocate();
        // What a fiber running past its end writes: the bottom of its own stack, then the
        // top of the one below.
        std::memset(second.base, 0, 64);
        pool.deallocate(second);
      },
      "fiber stack overflow");
}

TEST(StackPool, WithoutHugePagesEachStackIsItsOwnMapping) {
  StackPool pool(kStack, 16, false);
  EXPECT_FALSE(pool.huge_pages());
  Stack a = pool.allocate();
  Stack b = pool.allocate();
  // A guard page between them at least.
  const auto distance = address(a) > address(b) ? address(a) - address(b) : address(b) - address(a);
  EXPECT_GE(distance, kStack + StackPool::guard_size());
  std::memset(a.base, 0, 64);  // no canary to break
  pool.deallocate(a);
  pool.deallocate(b);
}

TEST(Runtime, FibersRunOnHugePageStacks) {
  Runtime runtime(RuntimeOptions{.workers = 1, .huge_page_stacks = true});
  int sum = runtime.block_on([] {
    std::vector<JoinHandle<void>> fibers;
    int total = 0;
    Event go;
    // More fibers at once than a chunk has stacks.
    for (int i = 0; i < 300; ++i) {
      fibers.push_back(spawn([&, i] {
        volatile char frame[8192];
        frame[0] = static_cast<char>(i);
        (void)go.wait(Deadline::after(std::chrono::seconds(10)));
        total += frame[0] == static_cast<char>(i) ? 1 : 0;
      }));
    }
    go.set();
    for (auto& f : fibers) f.join();
    return total;
  });
  EXPECT_EQ(sum, 300);
  EXPECT_TRUE(runtime.worker(0).stacks().huge_pages());
}

}  // namespace
}  // namespace spindle
