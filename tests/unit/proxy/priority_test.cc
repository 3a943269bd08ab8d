// SRV priorities at the pick (RFC 2782): the targets of the lowest priority with one that can
// take the request get it, the others are backups; panic as Envoy's normalised total health.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "spindle/proxy/balancer.h"

using namespace spindle::proxy;

namespace {

// What narrow_to_priority must leave available, worked out another way: per priority, the
// healthy share; their sum (at most 1) against the threshold; then the lowest priority with an
// available target.
std::vector<bool> expected(std::vector<TargetView> targets, unsigned threshold, bool& panic) {
  std::map<unsigned, std::pair<int, int>> levels;  // priority -> (healthy, all)
  for (const auto& t : targets) {
    levels[t.priority].first += t.healthy;
    levels[t.priority].second += 1;
  }
  // Compared in integers: sum of healthy_p / all_p < threshold / 100.
  long double share = 0;
  for (const auto& [_, c] : levels) share += static_cast<long double>(c.first) / c.second;
  panic = !targets.empty() && std::min<long double>(share, 1) * 100 < threshold - 1e-9L;
  if (panic) {
    for (auto& t : targets) t.healthy = true;
  }
  std::optional<unsigned> lowest;
  for (const auto& t : targets) {
    if (t.available()) lowest = std::min(lowest.value_or(t.priority), t.priority);
  }
  std::vector<bool> out;
  for (const auto& t : targets) out.push_back(t.available() && t.priority == *lowest);
  return out;
}

}  // namespace

TEST(Priority, EveryMixOfHealthTriesAndPrioritiesKeepsTheLowestPriorityThatCanTakeIt) {
  const unsigned priorities[] = {0, 10, 20};
  int cases = 0;
  for (int n = 1; n <= 4; ++n) {
    int combos = 1;
    for (int i = 0; i < n; ++i) combos *= 3 * 2 * 2;  // priority x healthy x tried
    for (int code = 0; code < combos; ++code) {
      std::vector<TargetView> targets(n);
      int c = code;
      for (auto& t : targets) {
        t.priority = priorities[c % 3];
        t.healthy = (c / 3) % 2 == 0;
        t.excluded = (c / 6) % 2 == 1;
        c /= 12;
      }
      for (unsigned threshold : {0u, 30u, 50u, 100u}) {
        bool panic = false;
        auto want = expected(targets, threshold, panic);
        auto got = targets;
        EXPECT_EQ(narrow_to_priority(got, threshold), panic) << "case " << code << "/" << n;
        for (int i = 0; i < n; ++i) {
          ASSERT_EQ(got[i].available(), want[i])
              << "case " << code << " target " << i << " threshold " << threshold;
        }
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 80'000);
}

TEST(Priority, BackupsTakeTheLoadOnlyWhenEveryPrimaryIsDownAndShareItByWeight) {
  UpstreamConfig config;
  config.balancer = BalancerKind::kWeighted;
  auto balancer = Balancer::make(config);
  // a: priority 10; b and c: priority 20, weights 3 and 1.
  auto views = [](bool a_up) {
    return std::vector<TargetView>{{.weight = 1, .priority = 10, .healthy = a_up},
                                   {.weight = 3, .priority = 20},
                                   {.weight = 1, .priority = 20}};
  };
  std::string got;
  for (int i = 0; i < 8; ++i) {
    auto v = views(true);
    (void)narrow_to_priority(v, 0);
    got += static_cast<char>('a' + *balancer->pick(v, 0));
  }
  EXPECT_EQ(got, "aaaaaaaa");
  got.clear();
  for (int i = 0; i < 8; ++i) {
    auto v = views(false);
    EXPECT_FALSE(narrow_to_priority(v, 50));  // priority 20 is all healthy: 100% in all
    got += static_cast<char>('a' + *balancer->pick(v, 0));
  }
  EXPECT_EQ(std::ranges::count(got, 'b'), 6);
  EXPECT_EQ(std::ranges::count(got, 'c'), 2);
  // The primary tried (a retry): the backups take the retry, although the primary is healthy.
  auto v = views(true);
  v[0].excluded = true;
  (void)narrow_to_priority(v, 50);
  EXPECT_NE(*balancer->pick(v, 0), 0u);
}

TEST(Priority, OnePriorityPanicsExactlyAsBefore) {
  // healthy * 100 < threshold * n, in integers: 29 of 100 healthy is below 30% and not 29%.
  std::vector<TargetView> targets(100);
  for (int i = 29; i < 100; ++i) targets[i].healthy = false;
  auto copy = targets;
  EXPECT_TRUE(narrow_to_priority(copy, 30));
  copy = targets;
  EXPECT_FALSE(narrow_to_priority(copy, 29));
  std::vector<TargetView> none;
  EXPECT_FALSE(narrow_to_priority(none, 100));
}
