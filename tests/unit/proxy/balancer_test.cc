#include "spindle/proxy/balancer.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

using namespace spindle::proxy;

namespace {

UpstreamConfig upstream(BalancerKind kind, std::vector<unsigned> weights) {
  UpstreamConfig u;
  u.balancer = kind;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    u.targets.push_back({"10.0.0." + std::to_string(i + 1), 80, weights[i]});
  }
  return u;
}

std::vector<TargetView> views(const UpstreamConfig& u) {
  std::vector<TargetView> v;
  for (const auto& t : u.targets) v.push_back({.weight = t.weight});
  return v;
}

std::string sequence(Balancer& b, const std::vector<TargetView>& targets, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += static_cast<char>('a' + b.pick(targets, 0).value());
  return out;
}

}  // namespace

TEST(Balancer, WeightedIsSmoothAndRoundRobinRotates) {
  auto weighted = upstream(BalancerKind::kWeighted, {5, 1, 1});
  auto b = Balancer::make(weighted);
  EXPECT_EQ(sequence(*b, views(weighted), 14), "aabacaaaabacaa");
  auto plain = upstream(BalancerKind::kRoundRobin, {1, 1, 1});
  auto rr = Balancer::make(plain);
  EXPECT_EQ(sequence(*rr, views(plain), 6), "abcabc");
}

TEST(Balancer, NoBalancerPicksAnUnhealthyOrExcludedTarget) {
  for (auto kind :
       {BalancerKind::kRoundRobin, BalancerKind::kWeighted, BalancerKind::kLeastConnections,
        BalancerKind::kRandomTwo, BalancerKind::kConsistentHash}) {
    auto u = upstream(kind, {1, 2, 1});
    auto b = Balancer::make(u);
    auto targets = views(u);
    targets[0].healthy = false;
    targets[1].excluded = true;
    for (int i = 0; i < 50; ++i) {
      EXPECT_EQ(b->pick(targets, hash_key(std::to_string(i))), 2u) << static_cast<int>(kind);
    }
    targets[2].healthy = false;
    EXPECT_FALSE(b->pick(targets, 1).has_value()) << static_cast<int>(kind);
  }
}

TEST(Balancer, LeastConnectionsTakesTheFewestInFlightPerWeightAndTiesGoRound) {
  auto u = upstream(BalancerKind::kLeastConnections, {1, 1, 2});
  auto b = Balancer::make(u);
  auto targets = views(u);
  targets[0].in_flight = 3;
  targets[1].in_flight = 1;
  targets[2].in_flight = 3;  // 1.5 per unit of weight
  EXPECT_EQ(b->pick(targets, 0), 1u);
  targets[1].in_flight = 2;  // 2 vs 1.5
  EXPECT_EQ(b->pick(targets, 0), 2u);
  for (auto& t : targets) t.in_flight = 0;
  std::map<std::size_t, int> seen;
  for (int i = 0; i < 6; ++i) ++seen[b->pick(targets, 0).value()];
  EXPECT_EQ(seen.size(), 3u);
}

TEST(Balancer, RandomTwoNeverPicksTheBusiestOfThree) {
  // Of two distinct targets drawn, the less busy wins: the busiest of three never can.
  auto u = upstream(BalancerKind::kRandomTwo, {1, 1, 1});
  auto b = Balancer::make(u);
  auto targets = views(u);
  targets[0].in_flight = 1;
  targets[1].in_flight = 9;
  targets[2].in_flight = 2;
  std::map<std::size_t, int> seen;
  for (int i = 0; i < 300; ++i) ++seen[b->pick(targets, 0).value()];
  EXPECT_EQ(seen.count(1), 0u);
  EXPECT_GT(seen[0], seen[2]);  // 0 wins both pairs it is in, 2 only one
}

TEST(Balancer, ConsistentHashKeepsKeysWhereTheyWereWhenATargetGoes) {
  auto four = upstream(BalancerKind::kConsistentHash, {1, 1, 1, 1});
  auto b = Balancer::make(four);
  auto targets = views(four);
  std::vector<std::size_t> before;
  std::map<std::size_t, int> spread;
  for (int k = 0; k < 4000; ++k) {
    before.push_back(b->pick(targets, hash_key("user-" + std::to_string(k))).value());
    ++spread[before.back()];
  }
  for (auto [target, count] : spread) EXPECT_GT(count, 600) << target;  // about 1000 each
  // The same key, the same target, every time.
  EXPECT_EQ(b->pick(targets, hash_key("user-7")), before[7]);
  // Target 2 goes: only its keys move.
  targets[2].healthy = false;
  int moved = 0;
  for (int k = 0; k < 4000; ++k) {
    std::size_t now = b->pick(targets, hash_key("user-" + std::to_string(k))).value();
    EXPECT_NE(now, 2u);
    if (before[k] != 2) {
      EXPECT_EQ(now, before[k]) << k;
    }
    moved += now != before[k];
  }
  EXPECT_EQ(moved, spread[2]);
}

TEST(Balancer, HashKeyIsAFixedFunctionOfTheBytes) {
  // Instances behind one L4 balancer, and an instance before and after an upgrade, must send a
  // key to the same target: the value is pinned (changing the hash reshuffles every session).
  EXPECT_EQ(hash_key("session-42"), 0x666a265472405471ULL);
  EXPECT_NE(hash_key("a"), hash_key("b"));
}

TEST(Balancer, ConsistentHashKeepsKeysWhenATargetLeavesTheConfiguration) {
  // A reload that removes a target: the others keep their keys (the ring is built from
  // addresses, not from positions in the list).
  auto four = upstream(BalancerKind::kConsistentHash, {1, 1, 1, 1});
  auto three = four;
  three.targets.erase(three.targets.begin() + 1);
  auto before = Balancer::make(four), after = Balancer::make(three);
  auto v4 = views(four), v3 = views(three);
  int kept = 0, others = 0;
  for (int k = 0; k < 2000; ++k) {
    std::uint64_t h = hash_key("user-" + std::to_string(k));
    const std::string& was = four.targets[before->pick(v4, h).value()].host;
    const std::string& now = three.targets[after->pick(v3, h).value()].host;
    if (was == four.targets[1].host) continue;
    ++others;
    kept += was == now;
  }
  EXPECT_EQ(kept, others);
}

TEST(Balancer, ConsistentHashMovesKeysOnlyToAJoiningTargetWhateverTheWeights) {
  // A target's points depend on its own weight only: however the weights add up (past 256
  // too), keys move only to the target that joins, never between those that stay.
  for (std::vector<unsigned> weights : std::vector<std::vector<unsigned>>{
           {1, 1, 1}, {100, 100, 100}, {300, 700, 1000}, {5, 200, 90}, {256, 257, 1}}) {
    for (unsigned joining : {1u, 100u, 1000u}) {
      auto three = upstream(BalancerKind::kConsistentHash, weights);
      auto four = three;
      four.targets.push_back({"10.0.0.9", 80, joining});
      auto before = Balancer::make(three), after = Balancer::make(four);
      auto v3 = views(three), v4 = views(four);
      int to_new = 0;
      for (int k = 0; k < 2000; ++k) {
        std::uint64_t h = hash_key("user-" + std::to_string(k));
        std::size_t was = before->pick(v3, h).value(), now = after->pick(v4, h).value();
        if (now == 3) {
          ++to_new;
        } else {
          EXPECT_EQ(now, was) << k << " joining " << joining;
        }
      }
      if (joining >= 100) EXPECT_GT(to_new, 0) << joining;  // (weight 1 may get none of 2000)
    }
  }
}
