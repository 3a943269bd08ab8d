#include "spindle/fiber/block_slab.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

using namespace spindle;

namespace {

constexpr std::size_t kBlock = 20 * 1024;  // a read buffer: max_head 16 KiB + 4 KiB

// How many of the block's pages are resident (mincore).
std::size_t resident_pages(const char* block, std::size_t size) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(block) / page * page;
  const std::size_t pages =
      (reinterpret_cast<std::uintptr_t>(block) + size - begin + page - 1) / page;
  std::vector<unsigned char> in(pages);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(begin), pages * page, in.data()), 0);
  return static_cast<std::size_t>(std::ranges::count_if(in, [](unsigned char c) { return c & 1; }));
}

}  // namespace

TEST(BlockSlab, HandsOutWholeBlocksThatNeverOverlapAcrossMappings) {
  BlockSlab slab(kBlock, 0, 1000);
  std::vector<char*> blocks;
  for (int i = 0; i < 100; ++i) {  // beyond one mapping's blocks
    char* b = slab.take();
    std::memset(b, i, kBlock);
    blocks.push_back(b);
  }
  std::ranges::sort(blocks);
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    EXPECT_GE(static_cast<std::size_t>(blocks[i] - blocks[i - 1]), kBlock);
  }
  std::set<char*> distinct(blocks.begin(), blocks.end());
  EXPECT_EQ(distinct.size(), blocks.size());
  for (char* b : blocks) {  // each kept what was written into it
    EXPECT_EQ(b[0], b[kBlock - 1]);
    slab.give(b);
  }
}

TEST(BlockSlab, ReusesTheLastBlockGivenFirst) {
  BlockSlab slab(kBlock, 0, 10);
  char* a = slab.take();
  char* b = slab.take();
  slab.give(a);
  slab.give(b);
  EXPECT_EQ(slab.resident(), 2u);
  EXPECT_EQ(slab.take(), b);
  EXPECT_EQ(slab.take(), a);
  EXPECT_EQ(slab.resident(), 0u);
  slab.give(a);
  slab.give(b);
}

// What a trim gives back, the kernel gets: the pages of the blocks nobody took since the last
// trim, down to the floor. The blocks stay in the slab and come back first, zeroed.
TEST(BlockSlab, TrimGivesThePagesOfUnusedBlocksBackAndKeepsTheFloor) {
  BlockSlab slab(kBlock, /*floor=*/2, /*max_resident=*/100);
  std::vector<char*> blocks;
  for (int i = 0; i < 10; ++i) {
    blocks.push_back(slab.take());
    std::memset(blocks.back(), 'x', kBlock);
  }
  for (char* b : blocks) slab.give(b);
  EXPECT_EQ(slab.trim(), 0u);  // the low-water mark was 0: all of them were in use
  EXPECT_TRUE(slab.over_floor());
  EXPECT_EQ(slab.trim(), 8 * kBlock);
  EXPECT_EQ(slab.resident(), 2u);
  EXPECT_FALSE(slab.over_floor());
  std::size_t resident = 0;
  for (char* b : blocks) resident += resident_pages(b, kBlock) > 0 ? 1 : 0;
  EXPECT_EQ(resident, 2u);  // the floor's two, warm
  // The floor first, then the released blocks (read as zeros), before any new mapping.
  std::set<char*> known(blocks.begin(), blocks.end());
  std::vector<char*> again;
  for (int i = 0; i < 10; ++i) {
    again.push_back(slab.take());
    EXPECT_TRUE(known.contains(again.back()));
    if (i >= 2) {
      EXPECT_EQ(again.back()[0], 0);
      EXPECT_EQ(again.back()[kBlock - 1], 0);
    }
  }
  for (char* b : again) slab.give(b);
}

TEST(BlockSlab, ABlockBeyondTheResidentLimitIsReleasedAtOnce) {
  BlockSlab slab(kBlock, 0, /*max_resident=*/1);
  char* a = slab.take();
  char* b = slab.take();
  std::memset(a, 'a', kBlock);
  std::memset(b, 'b', kBlock);
  slab.give(a);
  slab.give(b);
  EXPECT_EQ(slab.resident(), 1u);
  EXPECT_GT(resident_pages(a, kBlock), 0u);
  EXPECT_EQ(resident_pages(b, kBlock), 0u);
  EXPECT_EQ(slab.take(), a);
  EXPECT_EQ(slab.take(), b);
  slab.give(a);
  slab.give(b);
}

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer a block is poisoned past its end (the page between blocks) and while
// it waits in the slab: running off a read buffer, or using one given back, is reported.
TEST(BlockSlabDeathTest, UnderAsanRunningOffABlockOrUsingOneGivenBackIsReported) {
  BlockSlab slab(kBlock, 0, 10);
  char* a = slab.take();
  char* b = slab.take();  // the next one, in use too: what lies between them is still reported
  a[kBlock - 1] = 1;      // its own bytes are fine
  EXPECT_DEATH(
      {
        volatile char* p = a;
        p[kBlock] = 1;
      },
      "use-after-poison");
  slab.give(a);
  EXPECT_DEATH(
      {
        volatile char* p = a;
        p[0] = 1;
      },
      "use-after-poison");
  slab.give(b);
}
#endif
