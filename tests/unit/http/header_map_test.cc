#include "spindle/http/header_map.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "spindle/base/block_cache.h"

using spindle::http::for_each_list_item;
using spindle::http::HeaderMap;
using spindle::http::list_has_token;

TEST(HeaderMap, LooksUpNamesCaseInsensitively) {
  HeaderMap h;
  h.add_view("Content-Type", "text/plain");
  EXPECT_EQ(h.get("content-type"), "text/plain");
  EXPECT_EQ(h.get("CONTENT-TYPE"), "text/plain");
  EXPECT_FALSE(h.get("content-length").has_value());
}

TEST(HeaderMap, KeepsOrderAndRepeatedNames) {
  HeaderMap h;
  h.add_view("Set-Cookie", "a=1");
  h.add_view("X", "y");
  h.add_view("set-cookie", "b=2");
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].value, "a=1");
  EXPECT_EQ(h[2].value, "b=2");
  EXPECT_EQ(h.count("SET-COOKIE"), 2u);
  EXPECT_EQ(h.get("set-cookie"), "a=1");  // the first
}

TEST(HeaderMap, SetReplacesEveryFieldOfThatName) {
  HeaderMap h;
  h.add_view("A", "1");
  h.add_view("B", "2");
  h.add_view("a", "3");
  h.set("A", "4");
  EXPECT_EQ(h.count("a"), 1u);
  EXPECT_EQ(h.get("a"), "4");
  EXPECT_EQ(h[0].name, "B");
}

TEST(HeaderMap, CopiesAddedTextSoTheCallersBufferMayChange) {
  HeaderMap h;
  std::string name = "X-Temp", value = "original";
  h.add(name, value);
  name = "changed";
  value = "changed!";
  EXPECT_EQ(h.get("x-temp"), "original");
}

TEST(HeaderMap, HoldsManyLargeFieldsBeyondTheInlineCapacity) {
  HeaderMap h;
  for (int i = 0; i < 200; ++i) {
    h.add("X-" + std::to_string(i), std::string(100, static_cast<char>('a' + i % 26)));
  }
  ASSERT_EQ(h.size(), 200u);
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(h.get("x-" + std::to_string(i)), std::string(100, static_cast<char>('a' + i % 26)));
  }
  EXPECT_EQ(h.erase("x-7"), 1u);
  EXPECT_EQ(h.size(), 199u);
  EXPECT_EQ(h[199 - 1].name, "X-199");
  // A value longer than a text block gets a block of its own size; the next text goes on.
  const std::string long_value(10'000, 'L');
  h.add("X-Long", long_value);
  h.add("X-After", "short");
  EXPECT_EQ(h.get("x-long"), long_value);
  EXPECT_EQ(h.get("x-after"), "short");
  EXPECT_EQ(h.get("x-199"), std::string(100, static_cast<char>('a' + 199 % 26)));
}

TEST(HeaderMap, FindsTokensInCommaSeparatedValues) {
  HeaderMap h;
  h.add_view("Connection", "keep-alive, Upgrade");
  h.add_view("Connection", " close ");
  EXPECT_TRUE(h.has_token("connection", "upgrade"));
  EXPECT_TRUE(h.has_token("connection", "CLOSE"));
  EXPECT_FALSE(h.has_token("connection", "keep"));
}

TEST(HeaderMap, ClearEmptiesIt) {
  HeaderMap h;
  h.add("A", "1");
  h.clear();
  EXPECT_TRUE(h.empty());
  h.add("B", "2");
  EXPECT_EQ(h.get("b"), "2");
}

TEST(HeaderMap, MoveKeepsCopiedAndBorrowedText) {
  HeaderMap a;
  a.add("Copied", "value");               // in a's inline arena
  a.add_view("Borrowed", "static text");  // a literal
  for (int i = 0; i < 40; ++i) a.add("X-" + std::to_string(i), std::string(50, 'q'));  // heap
  HeaderMap b(std::move(a));
  EXPECT_TRUE(a.empty());
  a.add("Reused", "overwrites a's arena");  // must not show through b
  EXPECT_EQ(b.get("copied"), "value");
  EXPECT_EQ(b.get("borrowed"), "static text");
  EXPECT_EQ(b.get("x-39"), std::string(50, 'q'));
  HeaderMap c;
  c = std::move(b);
  EXPECT_EQ(c.get("copied"), "value");
  EXPECT_EQ(c.size(), 42u);
}

TEST(HeaderMap, ErasingFieldsBeyondTheInlineOnesAndAddingAgainKeepsEveryField) {
  HeaderMap h;
  for (int i = 0; i < 30; ++i) h.add("A-" + std::to_string(i), "first " + std::to_string(i));
  // Keeps A-0 .. A-4: the room beyond the inline fields stays, and is written again.
  EXPECT_EQ(h.erase_if([](const auto& f) { return f.name.size() > 3 || f.name[2] >= '5'; }), 25u);
  for (int i = 0; i < 60; ++i) h.add("B-" + std::to_string(i), "second " + std::to_string(i));
  ASSERT_EQ(h.size(), 65u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(h.get("a-" + std::to_string(i)), "first " + std::to_string(i));
  }
  EXPECT_FALSE(h.contains("a-5"));
  for (int i = 0; i < 60; ++i) {
    EXPECT_EQ(h.get("b-" + std::to_string(i)), "second " + std::to_string(i));
  }
  std::size_t n = 0;
  for (const auto& f : h) {
    EXPECT_EQ(f.name, n < 5 ? "A-" + std::to_string(n) : "B-" + std::to_string(n - 5)) << n;
    ++n;
  }
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kBlockCacheOff = true;  // sanitizer builds hand every block to malloc
#else
constexpr bool kBlockCacheOff = false;
#endif

// A map is small; what it holds beyond its own room (fields past the eighth, copied text past
// 256 bytes) comes from the thread's block cache (base/), as the request's other objects do,
// not from malloc (a browser's request over HTTP/2 spills every time: malloc's slow paths cost
// it about 4%).
TEST(HeaderMap, TakesItsRoomBeyondItsOwnFromTheThreadsBlockCacheAndGivesItBack) {
  if (kBlockCacheOff) GTEST_SKIP() << "sanitizer build: the block cache is off";
  std::thread([] {  // a thread of its own: its cache starts empty
    auto fill = [](HeaderMap& h) {
      for (int i = 0; i < 30; ++i) h.add("X-" + std::to_string(i), std::string(100, 'v'));
    };
    ASSERT_EQ(spindle::detail::cached_block_bytes(), 0u);
    {
      HeaderMap first;
      fill(first);
    }
    const std::size_t given_back = spindle::detail::cached_block_bytes();
    EXPECT_GT(given_back, 0u) << "the map's room came from the heap, not the block cache";
    {
      HeaderMap second;
      fill(second);
      EXPECT_EQ(spindle::detail::cached_block_bytes(), 0u) << "the same room is taken again";
      EXPECT_EQ(second.get("x-29"), std::string(100, 'v'));
    }
    EXPECT_EQ(spindle::detail::cached_block_bytes(), given_back);
  })
      .join();
}

// may_hold lets a scan for fields of some kind (the hop-by-hop ones: NominatedFields) be
// skipped: it must never say "none" for a map holding one, however the field came in.
TEST(HeaderMap, MayHoldKnowsEveryFlagOfEveryFieldAdded) {
  namespace flag = spindle::http::field_flag;
  namespace token = spindle::http::token;
  HeaderMap h;
  EXPECT_FALSE(h.may_hold(flag::kHopByHop));
  h.add("Content-Type", "text/plain");
  h.add_view("X-Custom", "1");
  EXPECT_FALSE(h.may_hold(flag::kHopByHop));
  EXPECT_TRUE(h.may_hold(flag::kNotInTrailers));
  h.add_view("CONNECTION", "close");
  EXPECT_TRUE(h.may_hold(flag::kHopByHop));
  h.clear();
  EXPECT_FALSE(h.may_hold(flag::kHopByHop | flag::kNotInTrailers));
  // Beyond the inline fields, and by each way of adding.
  for (int i = 0; i < 30; ++i) h.add("X-" + std::to_string(i), "v");
  h.add_view(token::kTe, "trailers");
  EXPECT_TRUE(h.may_hold(flag::kHopByHop));
  HeaderMap moved(std::move(h));
  EXPECT_TRUE(moved.may_hold(flag::kHopByHop));
  EXPECT_FALSE(h.may_hold(flag::kHopByHop));
  HeaderMap one;
  one.add_with_static_name("Proxy-Connection", token::kProxyConnection, "keep-alive");
  EXPECT_TRUE(one.may_hold(flag::kHopByHop));
  HeaderMap other;
  other.add(spindle::http::Field{"upgrade", "h2c", &token::kUpgrade});
  EXPECT_TRUE(other.may_hold(flag::kHopByHop));
}

// iequals compares words of eight (or two halves of four) bytes at once: every pair of byte
// values, at every position of names of every length up to 17, must get the bytewise answer.
TEST(HeaderMap, IequalsJudgesEveryBytePairAtEveryPosition) {
  auto lower = [](unsigned char c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; };
  for (std::size_t length = 1; length <= 17; ++length) {
    for (std::size_t at = 0; at < length; ++at) {
      std::string a(length, 'k');
      std::string b(length, 'K');
      for (int x = 0; x < 256; ++x) {
        for (int y = 0; y < 256; ++y) {
          a[at] = static_cast<char>(x);
          b[at] = static_cast<char>(y);
          bool expected =
              lower(static_cast<unsigned char>(x)) == lower(static_cast<unsigned char>(y));
          ASSERT_EQ(spindle::http::iequals(a, b), expected)
              << "length " << length << " position " << at << " bytes " << x << ", " << y;
        }
      }
    }
  }
  EXPECT_FALSE(spindle::http::iequals("host", "hosts"));
  EXPECT_TRUE(spindle::http::iequals("", ""));
}

TEST(ListItems, WalksEveryItemTrimmedAndSkipsEmptyOnes) {
  std::vector<std::string_view> items;
  for_each_list_item(" a ,\tb/2,, ,c ", [&](std::string_view item) { items.push_back(item); });
  EXPECT_EQ(items, (std::vector<std::string_view>{"a", "b/2", "c"}));
  items.clear();
  for_each_list_item("x, stop, y", [&](std::string_view item) {
    items.push_back(item);
    return item != "stop";
  });
  EXPECT_EQ(items, (std::vector<std::string_view>{"x", "stop"}));
  EXPECT_TRUE(list_has_token("keep-alive, Upgrade", "upgrade"));
  EXPECT_FALSE(list_has_token("keep-alive, Upgrade2", "upgrade"));
}
