// base64url decoding: lenient for HTTP2-Settings, strict (one text per value) for JWS.
#include "spindle/base/base64.h"

#include <gtest/gtest.h>

using spindle::Base64Mode;
using spindle::base64url_decode;

TEST(Base64url, DecodesBothModes) {
  EXPECT_EQ(base64url_decode("aGk"), "hi");
  EXPECT_EQ(base64url_decode("aGk", Base64Mode::kStrict), "hi");
  EXPECT_EQ(base64url_decode("-_8", Base64Mode::kStrict), std::string("\xfb\xff", 2));
  EXPECT_EQ(base64url_decode(""), "");
}

TEST(Base64url, LenientTakesTheOtherAlphabetAndPadding) {
  EXPECT_EQ(base64url_decode("+/8="), std::string("\xfb\xff", 2));
  EXPECT_EQ(base64url_decode("aGk="), "hi");
  EXPECT_FALSE(base64url_decode("a*b"));
}

TEST(Base64url, StrictRefusesEverySecondSpelling) {
  EXPECT_FALSE(base64url_decode("+/8", Base64Mode::kStrict));    // the other alphabet
  EXPECT_FALSE(base64url_decode("aGk=", Base64Mode::kStrict));   // padding
  EXPECT_FALSE(base64url_decode("aGl", Base64Mode::kStrict));    // "hi" with a stray low bit
  EXPECT_FALSE(base64url_decode("aGlzA", Base64Mode::kStrict));  // a lone sixth of a byte
}
