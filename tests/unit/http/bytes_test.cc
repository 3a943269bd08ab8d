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

TEST(EqualBytes, FindsEveryDifferenceAtEverySizeAndPlace) {
  // Every size on each side of the word compares (4, 8, 16) and beyond: equal bytes are equal,
  // whatever lies past them; one byte changed anywhere, or one byte more, is not.
  std::string a(64, ' '), b(64, ' ');
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = b[i] = static_cast<char>('a' + i % 23);
  for (std::size_t n = 0; n <= 40; ++n) {
    std::string x = a.substr(0, n), y = b.substr(0, n);
    EXPECT_TRUE(equal_bytes(x, y)) << n;
    EXPECT_TRUE(equal_bytes(std::string_view(a).substr(0, n), std::string_view(b).substr(0, n)));
    EXPECT_FALSE(
        equal_bytes(std::string_view(a).substr(0, n), std::string_view(b).substr(0, n + 1)))
        << n;
    for (std::size_t at = 0; at < n; ++at) {
      std::string changed = y;
      changed[at] = static_cast<char>(changed[at] ^ 0x20);
      EXPECT_FALSE(equal_bytes(x, changed)) << n << " at " << at;
    }
  }
}

}  // namespace
}  // namespace spindle::http
