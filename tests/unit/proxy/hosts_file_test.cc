// What discovery takes from the hosts file's text (it reads the file itself, never waiting on it:
// hosts_file_addresses only reads the text): per name asked, its addresses per family.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "spindle/proxy/discovery.h"

using namespace spindle::proxy;

namespace {

using Families = std::array<std::vector<std::string>, 2>;

TEST(HostsFile, EveryBlankSpellingCaseAndCommentGivesTheSameAddresses) {
  for (std::string blank : {" ", "\t", "  \t ", "\t\t"}) {
    for (std::string end : {"\n", "\r\n", "  # a comment\n", "#\n"}) {
      for (std::string name : {"api.test", "API.Test"}) {
        std::string text = "# header\n\n10.0.0.2" + blank + "other.test" + blank + name + end +
                           blank + "::1" + blank + name + end + "10.0.0.1" + blank + name + end;
        auto got = hosts_file_addresses(text, {"api.test", "gone.test"});
        SCOPED_TRACE(text);
        ASSERT_EQ(got.size(), 1u);
        EXPECT_EQ(got["api.test"], (Families{{{"10.0.0.1", "10.0.0.2"}, {"::1"}}}));
      }
    }
  }
}

TEST(HostsFile, CommentsBadAddressesAndLonelyAddressesListNothing) {
  auto got = hosts_file_addresses(
      "# 10.0.0.1 api.test\n10.0.0.1#api.test\n999.0.0.1 api.test\nnot-an-ip api.test\n"
      "10.0.0.3\n10.0.0.4 api.test.other\n0:0:0:0:0:0:0:1 v6.test\n",
      {"api.test", "v6.test"});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got["v6.test"], (Families{{{}, {"::1"}}}));  // the address as inet_ntop writes it
}

TEST(HostsFile, AnAddressListedTwiceIsKeptOnce) {
  auto got = hosts_file_addresses("10.0.0.1 a.test\n10.0.0.1 b.test a.test\n", {"a.test"});
  EXPECT_EQ(got["a.test"], (Families{{{"10.0.0.1"}, {}}}));
}

TEST(HostsFile, AnyBytesAreSafe) {
  std::string text;
  for (int i = 0; i < 4096; ++i) text.push_back(static_cast<char>((i * 7919) % 256));
  for (std::size_t cut = 0; cut <= text.size(); cut += 97) {
    (void)hosts_file_addresses(std::string_view(text).substr(0, cut), {"a.test"});
  }
}

}  // namespace
