// Request-target normalisation: RFC 3986's dot-segment removal and escapes, and the classic
// traversal and route-bypass spellings an attacker tries.
#include "spindle/http/target.h"

#include <gtest/gtest.h>

#include <string>

using namespace spindle::http;

namespace {

// The normalised target, or "400: reason".
std::string normal(std::string target, PathRules rules = {}) {
  auto size = normalize_target(target.data(), target.size(), rules);
  if (!size) return "400: " + std::string(size.error().reason);
  target.resize(*size);
  return target;
}

PathRules keep_slashes() { return PathRules{.escaped_slashes = PathRules::EscapedSlashes::kKeep}; }

}  // namespace

TEST(Target, LeavesANormalTargetAsItIs) {
  for (const char* t : {"/", "/a", "/a/b/", "/a.b/c..d/.e", "/.well-known/x", "/a?x=/../y",
                        "/a?q=%zz", "*", "example.com:443", "http://h", "/~u/a-b_c"}) {
    EXPECT_EQ(normal(t), t) << t;
  }
}

TEST(Target, RemovesDotSegmentsAsRfc3986Does) {
  // RFC 3986 §5.4's examples, as paths from the root.
  EXPECT_EQ(normal("/a/b/c/./../../g"), "/a/g");
  EXPECT_EQ(normal("/mid/content=5/../6"), "/mid/6");
  EXPECT_EQ(normal("/a/b/."), "/a/b/");
  EXPECT_EQ(normal("/a/b/.."), "/a/");
  EXPECT_EQ(normal("/a/b/../.."), "/");
  EXPECT_EQ(normal("/.."), "/");
  EXPECT_EQ(normal("/../../.."), "/");
  EXPECT_EQ(normal("/./"), "/");
  EXPECT_EQ(normal("/a/./b"), "/a/b");
  EXPECT_EQ(normal("/a/../b?x=../y"), "/b?x=../y");
}

TEST(Target, ClassicBypassesLandOnTheRealPath) {
  // What was seen: a route for /api/ open, /admin/ behind auth.
  for (const char* t :
       {"/api/../admin/x", "/api/%2e%2e/admin/x", "/api/%2E%2E/admin/x", "/api/.%2e/admin/x",
        "/api/%2e./admin/x", "/api/./../admin/x", "/api//../admin/x", "//admin/x", "/./admin/x",
        "/%61dmin/x", "/api/../../admin/x", "///admin//x"}) {
    EXPECT_EQ(normal(t), "/admin/x") << t;
  }
}

TEST(Target, RefusesEncodedSlashesBackslashesAndNulByDefault) {
  EXPECT_EQ(normal("/api/..%2fadmin/x"), "400: encoded slash in path");
  EXPECT_EQ(normal("/api/..%2Fadmin/x"), "400: encoded slash in path");
  EXPECT_EQ(normal("/api/..%5cadmin/x"), "400: encoded slash in path");
  EXPECT_EQ(normal("/api/..\\admin/x"), "400: backslash in path");
  EXPECT_EQ(normal("/a%00.html"), "400: encoded NUL in path");
  EXPECT_EQ(normal("/a%00.html", keep_slashes()), "400: encoded NUL in path");
}

TEST(Target, KeepsEncodedSlashesAsDataWhenAskedTo) {
  // Kept: "..%2F" is one segment, not ".." and a separator.
  EXPECT_EQ(normal("/api/..%2fadmin/x", keep_slashes()), "/api/..%2Fadmin/x");
  EXPECT_EQ(normal("/a%5cb/../c", keep_slashes()), "/c");
  EXPECT_EQ(normal("/a\\b", keep_slashes()), "/a\\b");
}

TEST(Target, DecodesUnreservedEscapesAndUppercasesTheOthers) {
  EXPECT_EQ(normal("/%41%62%7e%2d%5f%2e"), "/Ab~-_.");
  EXPECT_EQ(normal("/a%20b%3fc%c3%a9"), "/a%20b%3Fc%C3%A9");
  EXPECT_EQ(normal("/a%3F?x=%41"), "/a%3F?x=%41");  // the query is left as sent
}

TEST(Target, RefusesBrokenEscapesAndFragments) {
  for (const char* t : {"/a%", "/a%4", "/a%g1", "/a%1g", "/%%41"}) {
    EXPECT_EQ(normal(t), "400: bad percent-encoding in path") << t;
  }
  EXPECT_EQ(normal("/a#frag"), "400: fragment in request target");
  EXPECT_EQ(normal("/a?x#frag"), "400: fragment in request target");
}

TEST(Target, MergesSlashesUnlessToldNot) {
  EXPECT_EQ(normal("//a///b//"), "/a/b/");
  PathRules keep_runs{.merge_slashes = false};
  EXPECT_EQ(normal("//a///b//", keep_runs), "//a///b//");
  EXPECT_EQ(normal("/a//..", keep_runs), "/a/");
  EXPECT_EQ(normal("/a//../b", keep_runs), "/a/b");
}

TEST(Target, NormalisesThePathOfAnAbsoluteFormTarget) {
  EXPECT_EQ(normal("http://h.example/api/../admin?x"), "http://h.example/admin?x");
  EXPECT_EQ(normal("http://h.example?x=/../"), "http://h.example?x=/../");
}

TEST(Target, EveryOutputIsAFixedPoint) {
  // Normalising twice changes nothing: what the router saw is what goes upstream, and an
  // upstream that normalises again sees the same path.
  for (const char* t : {"/a/b/c/./../../g", "/api/%2e%2e/admin/x", "//a//b/..", "/%2e%2e%2f",
                        "/a/%2e/%2E%2e/b/", "/x/..%2e/y", "/...", "/..../a/.."}) {
    std::string once = normal(t, keep_slashes());
    ASSERT_FALSE(once.starts_with("400")) << t;
    EXPECT_EQ(normal(once, keep_slashes()), once) << t;
    EXPECT_TRUE(path_is_normal(once, keep_slashes()) || normal(once, keep_slashes()) == once);
  }
}

// An origin-form target is scanned once (fragment, query, whether the path is normal); the
// absolute form takes the general road. Both must make the same of the same path: every short
// string over the characters that matter, behind "/" and behind "http://h/", at any offset.
TEST(Target, TheOriginFormsOneScanAgreesWithTheGeneralRoad) {
  const std::string alphabet = "/.%2eEfa?#\\";
  std::size_t tried = 0;
  for (const PathRules& rules : {PathRules{}, keep_slashes(), PathRules{.merge_slashes = false}}) {
    std::string path(7, ' ');
    // Every string of length 7 over the alphabet would be 19 million: take every 97th.
    for (std::size_t n = 0; n < 19487171; n += 97) {
      std::size_t k = n;
      for (char& c : path) {
        c = alphabet[k % alphabet.size()];
        k /= alphabet.size();
      }
      // Behind 0 to 23 bytes of filler: what matters falls at every place of the origin
      // form's sixteen-byte pieces, and across two of them.
      const std::string filler(n % 24, 'a');
      const std::string origin = normal("/" + filler + path, rules);
      const std::string absolute = normal("http://h/" + filler + path, rules);
      if (absolute.starts_with("400")) {
        ASSERT_EQ(origin, absolute) << path;
      } else {
        ASSERT_EQ("http://h" + origin, absolute) << path;
      }
      ++tried;
    }
  }
  EXPECT_GT(tried, 500000u);
}
