#include "spindle/base/block_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

using namespace spindle;

namespace {

// Each test runs on a thread of its own: the cache is per thread, so it starts empty.
template <typename F>
void on_fresh_thread(F f) {
  std::thread t(f);
  t.join();
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCacheOff = true;  // sanitizer builds hand every block to malloc
#else
constexpr bool kCacheOff = false;
#endif

}  // namespace

TEST(BlockCache, ReusesAFreedBlockForAnySizeOfItsClass) {
  if (kCacheOff) GTEST_SKIP() << "sanitizer build: the cache is off";
  on_fresh_thread([] {
    // 1,500 and 2,000 bytes share the 2 KiB class; 700 is in another.
    void* a = take_block(1500);
    std::memset(a, 1, 2048);  // the whole class size is usable
    give_block(a, 1500);
    EXPECT_EQ(detail::cached_block_bytes(), 2048u);
    void* other = take_block(700);
    EXPECT_NE(other, a);
    void* b = take_block(2000);
    EXPECT_EQ(b, a);
    EXPECT_EQ(detail::cached_block_bytes(), 0u);
    give_block(b, 2000);
    give_block(other, 700);
    EXPECT_EQ(detail::cached_block_bytes(), 2048u + 704u);
  });
}

TEST(BlockCache, LeavesBlocksAbove32KiBToMalloc) {
  if (kCacheOff) GTEST_SKIP() << "sanitizer build: the cache is off";
  on_fresh_thread([] {
    void* big = take_block(32 * 1024 + 1);
    give_block(big, 32 * 1024 + 1);
    EXPECT_EQ(detail::cached_block_bytes(), 0u);
    void* top = take_block(32 * 1024);
    give_block(top, 32 * 1024);
    EXPECT_EQ(detail::cached_block_bytes(), 32u * 1024);
  });
}

TEST(BlockCache, HoldsAtMostItsBudget) {
  if (kCacheOff) GTEST_SKIP() << "sanitizer build: the cache is off";
  on_fresh_thread([] {
    // 48 MiB of 32 KiB blocks come back at once: 32 MiB are kept, the rest freed.
    std::vector<void*> blocks;
    for (int i = 0; i < 48 * 32; ++i) blocks.push_back(take_block(32 * 1024));
    for (void* b : blocks) give_block(b, 32 * 1024);
    EXPECT_EQ(detail::cached_block_bytes(), 32u * 1024 * 1024);
  });
}

TEST(BlockCache, TrimFreesWhatWasNotReusedDownToAFloor) {
  if (kCacheOff) GTEST_SKIP() << "sanitizer build: the cache is off";
  on_fresh_thread([] {
    std::vector<void*> blocks;
    for (int i = 0; i < 20; ++i) blocks.push_back(take_block(4096));
    for (void* b : blocks) give_block(b, 4096);
    EXPECT_TRUE(detail::blocks_over_floor());
    // The first trim only starts the count (all 20 came back since the cache last looked).
    EXPECT_EQ(detail::trim_blocks(), 0u);
    // Two taken and given back meanwhile: of the 18 nobody needed, all above the floor of 8
    // for blocks over 1 KiB go.
    give_block(take_block(4096), 4096);
    void* x = take_block(4096);
    void* y = take_block(4096);
    give_block(x, 4096);
    give_block(y, 4096);
    EXPECT_EQ(detail::trim_blocks(), 12u * 4096);
    EXPECT_EQ(detail::cached_block_bytes(), 8u * 4096);
    EXPECT_FALSE(detail::blocks_over_floor());
    EXPECT_EQ(detail::trim_blocks(), 0u);
  });
}

// The worker asks before every poll whether to trim: the answer is kept as blocks come and go,
// per class (8 blocks over 1 KiB are the floor, 64 below).
TEST(BlockCache, KnowsWhichClassesAreOverTheirFloorAsBlocksComeAndGo) {
  if (kCacheOff) GTEST_SKIP() << "sanitizer build: the cache is off";
  on_fresh_thread([] {
    auto fill = [](std::size_t size, int count) {
      std::vector<void*> blocks;
      for (int i = 0; i < count; ++i) blocks.push_back(take_block(size));
      for (void* b : blocks) give_block(b, size);
    };
    fill(4096, 8);
    EXPECT_FALSE(detail::blocks_over_floor());
    fill(4096, 9);
    EXPECT_TRUE(detail::blocks_over_floor());
    void* large = take_block(4096);  // 8 left: at the floor
    EXPECT_FALSE(detail::blocks_over_floor());
    fill(64, 65);
    EXPECT_TRUE(detail::blocks_over_floor());
    give_block(large, 4096);  // both classes over
    void* small = take_block(64);
    EXPECT_TRUE(detail::blocks_over_floor());  // the large class still is
    large = take_block(4096);
    EXPECT_FALSE(detail::blocks_over_floor());
    give_block(small, 64);
    EXPECT_TRUE(detail::blocks_over_floor());
    give_block(large, 4096);
  });
}

TEST(BlockCache, AllocatorServesSharedObjectsAndStrings) {
  on_fresh_thread([] {
    struct Big {
      char bytes[3000];
      int value = 7;
    };
    auto p = std::allocate_shared<Big>(BlockAllocator<Big>());
    EXPECT_EQ(p->value, 7);
    void* where = p.get();
    p.reset();
    auto q = std::allocate_shared<Big>(BlockAllocator<Big>());
    if (!kCacheOff) EXPECT_EQ(static_cast<void*>(q.get()), where);  // the same block again
    BlockString s(20000, 'x');
    s += "end";
    EXPECT_EQ(s.size(), 20003u);
    EXPECT_EQ(s.substr(19998), "xxend");
  });
}
