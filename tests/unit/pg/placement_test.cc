// Where the pool puts a call (src/pg/placement.h), on its own and deterministically: the
// statements of a worker stay on the first connection while it keeps up, however many others
// are idle; they spread once its server answered nothing, or its pipeline would take, longer
// than the budget; the pace is the server's, not the worker's delay in reading; and on
// generated pools the choice is always the one the rule names. (Issue 69, item 17.)
#include "pg/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <random>
#include <vector>

using namespace std::chrono_literals;
using spindle::pg::kDeepestPipeline;
using spindle::pg::keeps_up;
using spindle::pg::Lane;
using spindle::pg::next_pace;
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
    if (lane.depth == 1) lane.stalled = round_trip;
    went.push_back(*p.lane);
    // Once every caller waits, the server answers the oldest one of the deepest lane.
    std::size_t waiting = 0;
    for (const Lane& l : pool) waiting += l.depth;
    if (waiting == clients) {
      for (Lane& l : pool) {
        if (l.depth == 0) continue;
        --l.depth;
        l.stalled = l.depth == 0 ? 0ns : round_trip;
        break;
      }
    }
  }
  return went;
}

}  // namespace

TEST(PgPlacement, ABusyConnectionThatKeepsUpTakesTheCallOverIdleOnes) {
  std::vector<Lane> pool{{.depth = 5, .stalled = 80us, .per_statement = 10us}, {}, {}, {}};
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
  std::vector<Lane> pool{{.depth = 200, .stalled = 100us, .per_statement = 10us}, {}};
  Placement p = place(pool, /*room=*/true, kBudget);
  ASSERT_TRUE(p.lane.has_value());
  EXPECT_EQ(*p.lane, 1u);
  EXPECT_FALSE(p.open_another);  // an idle one keeps up: nothing to open
}

TEST(PgPlacement, ADeepPipelineOpensAnotherWhenNoneKeepsUp) {
  std::vector<Lane> pool{{.depth = 200, .stalled = 100us, .per_statement = 10us},
                         {.depth = 150, .stalled = 100us, .per_statement = 10us}};
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

TEST(PgPlacement, AServerSilentPastTheBudgetSendsNewCallsElsewhere) {
  // A slow statement at the head: those behind it would wait for it, whatever the pace says.
  std::vector<Lane> pool{{.depth = 1, .stalled = 3ms, .per_statement = 10us}, {}};
  EXPECT_EQ(place(pool, true, kBudget).lane, std::optional<std::size_t>(1));
  pool[0].stalled = 999us;
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
      l.stalled = l.depth == 0 ? 0ns : std::chrono::microseconds(random() % 2000);
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
          l.depth == 0 || (l.depth < kDeepestPipeline && l.stalled < kBudget &&
                           l.per_statement * static_cast<std::int64_t>(l.depth + 1) <= kBudget);
      ASSERT_EQ(keeps_up(l, kBudget), expected) << "round " << round;
    }
    ASSERT_EQ(p.lane, first ? first : least) << "round " << round;
    ASSERT_EQ(p.open_another, !first && room) << "round " << round;
  }
}

namespace {

// A worker and the backends of its connections, in simulated time, fed by the pool's own rule
// and estimator as Connection feeds them: `clients` callers in a closed loop, the worker taking
// `request` of its time per request (and stopping for `pause` every `pause_every` requests: a
// descheduled thread), each backend answering its statements in order at `server` apiece. The
// worker reads the answers that are in, then runs the requests they end, each placing its next
// call. Returns the calls each connection took.
struct Sim {
  std::size_t clients = 256;
  std::chrono::nanoseconds request = 14us, server = 7us, pause{0};
  std::size_t pause_every = 0, requests = 60000, lanes = 4;
  std::chrono::nanoseconds budget = 10ms;
};

std::vector<std::size_t> run(const Sim& sim) {
  struct Backend {
    std::deque<std::pair<std::chrono::nanoseconds, std::chrono::nanoseconds>> sent;  // at, answer
    std::chrono::nanoseconds free_at{0}, last_read{0}, pace{0};
  };
  std::vector<Backend> backends(sim.lanes);
  std::vector<std::size_t> took(sim.lanes);
  std::chrono::nanoseconds now{0};
  std::size_t ready = sim.clients, done = 0;
  auto send = [&](std::size_t lane) {
    Backend& b = backends[lane];
    b.free_at = std::max(b.free_at, now) + sim.server;
    b.sent.emplace_back(now, b.free_at);
    ++took[lane];
  };
  while (done < sim.requests) {
    for (; ready > 0; --ready, ++done) {  // the requests the answers ended, each a new call
      now += sim.request;
      if (sim.pause_every != 0 && done % sim.pause_every == 0) now += sim.pause;
      std::vector<Lane> lanes;
      for (const Backend& b : backends) {
        Lane l{.depth = b.sent.size(), .per_statement = b.pace};
        // Answers waiting in the socket: the worker is late, not the server (Pool::choose).
        if (!b.sent.empty() && b.sent.front().second > now) {
          l.stalled = now - std::max(b.sent.front().first, b.last_read);
        }
        lanes.push_back(l);
      }
      send(*place(lanes, false, sim.budget).lane);
    }
    std::chrono::nanoseconds next = std::chrono::nanoseconds::max();
    for (const Backend& b : backends) {
      if (!b.sent.empty()) next = std::min(next, b.sent.front().second);
    }
    now = std::max(now, next);
    for (Backend& b : backends) {  // a read on each connection (Connection::drive, pace)
      std::size_t answered = 0;
      std::chrono::nanoseconds first{0};
      while (!b.sent.empty() && b.sent.front().second <= now) {
        if (answered++ == 0) first = b.sent.front().first;
        b.sent.pop_front();
      }
      if (answered == 0) continue;
      bool behind = !b.sent.empty() && b.sent.front().first < b.last_read;
      b.pace = next_pace(b.pace, now - std::max(first, b.last_read), answered, behind);
      b.last_read = now;
      ready += answered;
    }
  }
  return took;
}

}  // namespace

TEST(PgPlacement, NextPaceFollowsABehindServerAndOnlyFallsOnceItCaughtUp) {
  EXPECT_EQ(next_pace(0ns, 80us, 4, false), 20us);   // unknown: the first sample whole
  EXPECT_EQ(next_pace(20us, 100us, 1, true), 30us);  // behind: an eighth of the way up
  std::mt19937 random(69);
  for (int round = 0; round < 20000; ++round) {
    std::chrono::nanoseconds pace{1 + random() % 100000}, elapsed{random() % 50000000};
    std::size_t answered = 1 + random() % 300;
    std::chrono::nanoseconds sample = elapsed / static_cast<std::int64_t>(answered);
    auto caught_up = next_pace(pace, elapsed, answered, false);
    auto behind = next_pace(pace, elapsed, answered, true);
    ASSERT_LE(caught_up, pace) << "round " << round;  // the worker's delay never raises it
    ASSERT_EQ(behind, pace + (sample - pace) / 8) << "round " << round;
    ASSERT_EQ(caught_up, pace + (std::min(sample, pace) - pace) / 8) << "round " << round;
  }
}

TEST(PgPlacement, AWorkerSlowerThanItsServerStaysOnOneConnectionEvenWhenDescheduled) {
  // 64 and 256 callers, the worker at 14 µs a request, the server at 7 µs a statement: the
  // worker is the bottleneck, another backend would answer no sooner. Stopped 12 or 100 ms now
  // and then (past the budget; a loaded machine), the answers wait for it in the socket, and
  // the read after the stop says nothing of the server's pace: still one.
  for (std::size_t clients : {64u, 256u}) {
    for (auto pause : {0ns, std::chrono::nanoseconds(12ms), std::chrono::nanoseconds(100ms)}) {
      auto took = run({.clients = clients, .pause = pause, .pause_every = 5000});
      EXPECT_GE(took[0], 60000u);
      EXPECT_EQ(took[1] + took[2] + took[3], 0u)
          << clients << " callers, pause " << pause.count() << " ns";
    }
  }
}

TEST(PgPlacement, AServerSlowerThanItsWorkerSpreadsUntilItKeepsUp) {
  // The server at 200 µs a statement, the worker at 5 µs a request, 256 callers: one backend
  // would answer a new call in 51 ms; calls spread over all four connections.
  auto took = run({.request = 5us, .server = 200us, .requests = 20000});
  for (std::size_t lane = 0; lane < took.size(); ++lane) EXPECT_GT(took[lane], 1000u) << lane;
  // 16 callers at that pace keep up on the first (17 x 200 µs is 3.4 ms).
  took = run({.clients = 16, .request = 5us, .server = 200us, .requests = 20000});
  EXPECT_GE(took[0], 20000u);
  EXPECT_EQ(took[1] + took[2] + took[3], 0u);
}
