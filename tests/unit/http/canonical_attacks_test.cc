// An attacker's review of the canonical authority (canonical.h, docs/security.md "The canonical
// request"): every spelling of a host and port two readers could read two ways is refused.
// A case that exposes a defect is DISABLED_ with the invariant it breaks.
#include <gtest/gtest.h>

#include "spindle/http/canonical.h"

using spindle::http::is_authority;
using spindle::http::names_same_field;

namespace {

TEST(CanonicalAttacks, AuthoritiesTwoReadersReadTwoWaysAreRefused) {
  for (const char* bad :
       {"a.example:80@b.example", "a.example\\@b.example", "a.example%2eb", "a.example:+80",
        "a.example:-1", "a.example: 80", "a.example :80", "[::1]x", "[::1]:", "[::1]]:80",
        "[fe80::1%25eth0]", "[v1.x]", "::1", "a.example\t",
        "b\xc3\xbc"
        "cher.de",
        "xn--bcher-kva.de:80:80", "a.example;b", "[::1]:65536", "a.example:123456"}) {
    EXPECT_FALSE(is_authority(bad)) << bad;
  }
}

// fixed (was a defect): docs/security.md says a port that is not 1-65535 is refused (400);
// is_authority took port 0 in any number of zeros.
TEST(CanonicalAttacks, APortOfZeroIsRefused) {
  for (const char* bad : {"a.example:0", "a.example:00000", "[::1]:0"}) {
    EXPECT_FALSE(is_authority(bad)) << bad;
  }
}

TEST(CanonicalAttacks, EverySpellingOfAKnownNameIsThatName) {
  EXPECT_TRUE(names_same_field("X_FORWARDED_FOR", "x-forwarded-for"));
  EXPECT_TRUE(names_same_field("x-Forwarded_for", "x-forwarded-for"));
  EXPECT_FALSE(names_same_field("x-forwarded-for ", "x-forwarded-for"));
  EXPECT_FALSE(names_same_field("x.forwarded.for", "x-forwarded-for"));
}

}  // namespace
