// Where the pool puts a call (src/pg/placement.h), on its own and deterministically: the
// statements of a worker stay on the first connection while it keeps up, however many others
// are idle; they spread once its oldest statement waited, or its pipeline would take, longer
// than the budget; and on generated pools the choice is always the one the rule names.
// (Issue 69, item 17.)
#include "pg/placement.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <vector>

using namespace std::chrono_literals;
using spindle::pg::kDeepestPipeline;
using spindle::pg::keeps_up;
using spindle::pg::Lane;
using spindle::pg::place;
using spindle::pg::Placement;

namespace {

constexpr std::chrono::nanoseconds kBudget = 1ms;

// A worker's calls arriving faster than they are answered, against a server answering every
// `pace` with a round trip of `round_trip` (a closed loop of `clients` callers): the lane each
// call went on.
std::vector<std::size_t> simulate(std::size_t lanes, std::size_t clients,
                                  std::chrono::nanoseconds pace,
                                  std::chrono::nanoseconds round_trip) {
  std::vector<Lane> pool(lanes);
  std::vector<std::size_t> went;
  for (std::size_t call = 0; call < clients * 20; ++call) {
    Placement p = place(pool, /*room=*/false, kBudget);
    EXPECT_TRUE(p.lane.has_value());
    Lane& lane = pool[*p.lane];
    ++lane.depth;
    lane.per_statement = pace;
    if (lane.depth == 1) lane.oldest = round_trip;
    went.push_back(*p.lane);
    // Once every caller waits, the server answers the oldest one of the deepest lane.
    std::size_t waiting = 0;
    for (const Lane& l : pool) waiting += l.depth;
    if (waiting == clients) {
      for (Lane& l : pool) {
        if (l.depth == 0) continue;
        --l.depth;
        l.oldest = l.depth == 0 ? 0ns : round_trip;
        break;
      }
    }
  }
  return went;
}

}  // namespace

TEST(PgPlacement, ABusyConnectionThatKeepsUpTakesTheCallOverIdleOnes) {
  std::vector<Lane> pool{{.depth = 5, .oldest = 80us, .per_statement = 10us}, {}, {}, {}};
  Placement p = place(pool, /*room=*/true, kBudget);
  ASSERT_TRUE(p.lane.has_value());
  EXPECT_EQ(*p.lane, 0u);  // not the idle connections
  EXPECT_FALSE(p.open_another);
}

TEST(PgPlacement, AClosedLoopOfCallersStaysOnOneConnectionWhileItKeepsUp) {
  // 64 and 128 callers, a server at 7 µs a statement, 50 µs round trips: one connection
  // answers every caller within the budget, so the other three are never woken.
  for (std::size_t clients : {64u, 128u}) {
    auto went = simulate(4, clients, 7us, 50us);
    for (std::size_t i = 0; i < went.size(); ++i) {
      ASSERT_EQ(went[i], 0u) << clients << " callers, call " << i;
    }
  }
}

TEST(PgPlacement, ADeepPipelineSpreadsToTheNextConnection) {
  // 200 statements at 10 µs: a new one would wait 2 ms.
  std::vector<Lane> pool{{.depth = 200, .oldest = 100us, .per_statement = 10us}, {}};
  Placement p = place(pool, /*room=*/true, kBudget);
  ASSERT_TRUE(p.lane.has_value());
  EXPECT_EQ(*p.lane, 1u);
  EXPECT_FALSE(p.open_another);  // an idle one keeps up: nothing to open
}

TEST(PgPlacement, ADeepPipelineOpensAnotherWhenNoneKeepsUp) {
  std::vector<Lane> pool{{.depth = 200, .oldest = 100us, .per_statement = 10us},
                         {.depth = 150, .oldest = 100us, .per_statement = 10us}};
  Placement p = place(pool, /*room=*/true, kBudget);
  ASSERT_TRUE(p.lane.has_value());
  EXPECT_EQ(*p.lane, 1u);  // the least deep meanwhile
  EXPECT_TRUE(p.open_another);
  EXPECT_FALSE(place(pool, /*room=*/false, kBudget).open_another);
}

TEST(PgPlacement, AClosedLoopTooDeepForOneConnectionSpreads) {
  // 256 callers at 20 µs a statement: 5 ms on one connection; calls go on the others too.
  auto went = simulate(4, 256, 20us, 50us);
  std::vector<std::size_t> per_lane(4);
  for (std::size_t lane : went) ++per_lane[lane];
  EXPECT_GT(per_lane[1], 0u);
  EXPECT_GT(per_lane[2], 0u);
}

TEST(PgPlacement, AStatementWaitingPastTheBudgetSendsNewCallsElsewhere) {
  // A slow statement at the head: those behind it would wait for it, whatever the pace says.
  std::vector<Lane> pool{{.depth = 1, .oldest = 3ms, .per_statement = 10us}, {}};
  EXPECT_EQ(place(pool, true, kBudget).lane, std::optional<std::size_t>(1));
  pool[0].oldest = 999us;
  EXPECT_EQ(place(pool, true, kBudget).lane, std::optional<std::size_t>(0));
}

TEST(PgPlacement, AnUnknownPaceIsTrustedUpToTheDeepestPipeline) {
  std::vector<Lane> pool{{.depth = kDeepestPipeline - 1}, {}};
  EXPECT_EQ(place(pool, true, kBudget).lane, std::optional<std::size_t>(0));
  pool[0].depth = kDeepestPipeline;
  EXPECT_EQ(place(pool, true, kBudget).lane, std::optional<std::size_t>(1));
}

TEST(PgPlacement, ConnectionsClosedToCallsAreSkippedAndNoneMeansWait) {
  std::vector<Lane> pool{{.open_to_calls = false}, {.open_to_calls = false}};
  Placement p = place(pool, /*room=*/true, kBudget);
  EXPECT_FALSE(p.lane.has_value());
  EXPECT_TRUE(p.open_another);
  EXPECT_FALSE(place({}, /*room=*/false, kBudget).lane.has_value());
}

TEST(PgPlacement, GeneratedPoolsGetTheFirstThatKeepsUpElseTheLeastDeep) {
  std::mt19937 random(17);
  for (int round = 0; round < 20000; ++round) {
    std::vector<Lane> pool(1 + random() % 5);
    for (Lane& l : pool) {
      l.open_to_calls = random() % 5 != 0;
      l.depth = random() % 3 == 0 ? 0 : random() % 300;
      l.oldest = l.depth == 0 ? 0ns : std::chrono::microseconds(random() % 2000);
      l.per_statement = std::chrono::microseconds(random() % 20);
    }
    bool room = random() % 2 == 0;
    Placement p = place(pool, room, kBudget);
    std::optional<std::size_t> first, least;
    for (std::size_t i = 0; i < pool.size(); ++i) {
      if (!pool[i].open_to_calls) continue;
      if (!first && keeps_up(pool[i], kBudget)) first = i;
      if (!least || pool[i].depth < pool[*least].depth) least = i;
    }
    // keeps_up itself, from its definition.
    for (const Lane& l : pool) {
      bool expected =
          l.depth == 0 || (l.depth < kDeepestPipeline && l.oldest < kBudget &&
                           l.per_statement * static_cast<std::int64_t>(l.depth + 1) <= kBudget);
      ASSERT_EQ(keeps_up(l, kBudget), expected) << "round " << round;
    }
    ASSERT_EQ(p.lane, first ? first : least) << "round " << round;
    ASSERT_EQ(p.open_another, !first && room) << "round " << round;
  }
}
