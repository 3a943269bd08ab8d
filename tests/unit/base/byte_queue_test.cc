// ByteQueue: bytes in order, and memory that follows what waits, not what has passed through.
#include "spindle/base/byte_queue.h"

#include <gtest/gtest.h>

#include <string>

using spindle::ByteQueue;

TEST(ByteQueue, BytesLeaveInTheOrderTheyCame) {
  ByteQueue q;
  EXPECT_TRUE(q.empty());
  q.append("hello ");
  q.append("world");
  EXPECT_EQ(q.view(), "hello world");
  q.consume(6);
  EXPECT_EQ(q.view(), "world");
  q.append("!");
  EXPECT_EQ(q.view(), "world!");
  EXPECT_EQ(q.size(), 6u);
  q.consume(6);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.held(), 0u);  // taken whole: nothing kept
  q.assign(std::string("moved in"));
  EXPECT_EQ(q.view(), "moved in");
  q.clear();
  EXPECT_TRUE(q.empty());
}

// A reader that never quite catches up: about 64 KiB always waits, a gigabyte passes through.
// What the queue holds stays within twice what waits plus a piece (keeping what was taken
// until the reader caught up held the whole gigabyte), and the bytes keep their order.
TEST(ByteQueue, AReaderThatNeverCatchesUpHoldsWhatWaitsNotWhatPassed) {
  constexpr std::size_t kPiece = 16384;
  auto byte_at = [](std::size_t position) {
    return static_cast<char>('a' + position / kPiece % 26);
  };
  ByteQueue q;
  std::size_t added = 0, taken = 0, most = 0;
  auto add = [&] {
    q.append(std::string(kPiece, byte_at(added)));
    added += kPiece;
  };
  for (int i = 0; i < 4; ++i) add();
  for (int i = 0; added < (std::size_t{1} << 30); ++i) {
    add();
    std::size_t n = i % 2 == 0 ? kPiece - 1 : kPiece + 1;  // never all that waits
    q.consume(n);
    taken += n;
    ASSERT_EQ(q.size(), added - taken);
    ASSERT_EQ(q.view().front(), byte_at(taken));
    most = std::max(most, q.held());
  }
  EXPECT_LE(most, 2 * (5 * kPiece) + kPiece);
}
