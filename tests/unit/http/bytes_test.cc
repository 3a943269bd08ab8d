#include "spindle/http/bytes.h"

#include <gtest/gtest.h>

#include <array>
#include <string>

namespace spindle::http {
namespace {

TEST(CopyBytes, CopiesEverySizeExactlyAndNothingPastIt) {
  // Every size on each side of the fixed-size moves (1, 2, 4, 8, 16, 32) and beyond, from and
  // to each alignment within a word: the bytes copied are the source's, in order, and the
  // bytes around the destination are untouched.
  std::array<char, 128> from{};
  for (std::size_t i = 0; i < from.size(); ++i) from[i] = static_cast<char>('A' + i % 50);
  for (std::size_t n = 0; n <= 80; ++n) {
    for (std::size_t offset = 0; offset < 8; ++offset) {
      std::string to(n + 32, '.');
      copy_bytes(to.data() + 16, from.data() + offset, n);
      EXPECT_EQ(to.substr(0, 16), std::string(16, '.')) << n << " from +" << offset;
      EXPECT_EQ(to.substr(16, n), std::string(from.data() + offset, n)) << n << " from +" << offset;
      EXPECT_EQ(to.substr(16 + n), std::string(16, '.')) << n << " from +" << offset;
    }
  }
}

}  // namespace
}  // namespace spindle::http
