#include "spindle/base/siphash.h"

#include <gtest/gtest.h>

#include <string>

using spindle::siphash;
using spindle::SipKey;

namespace {

// The key of the reference vectors: bytes 00 01 .. 0f.
SipKey reference_key() { return SipKey{0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull}; }

std::string bytes_up_to(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += static_cast<char>(i);
  return s;
}

}  // namespace

TEST(SipHash, MatchesTheReferenceVectors) {
  // From the SipHash paper's appendix and the reference implementation's vectors.h.
  EXPECT_EQ(siphash(reference_key(), ""), 0x726fdb47dd0e0e31ull);
  EXPECT_EQ(siphash(reference_key(), bytes_up_to(1)), 0x74f839c593dc67fdull);
  EXPECT_EQ(siphash(reference_key(), bytes_up_to(8)), 0x93f5f5799a932462ull);
  EXPECT_EQ(siphash(reference_key(), bytes_up_to(15)), 0xa129ca6149be45e5ull);
}

TEST(SipHash, DependsOnTheKey) {
  SipKey a = SipKey::random(), b = SipKey::random();
  EXPECT_NE(siphash(a, "client 1"), siphash(b, "client 1"));
  EXPECT_EQ(siphash(a, "client 1"), siphash(a, "client 1"));
}
