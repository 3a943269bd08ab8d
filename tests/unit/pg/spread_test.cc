// The pool's placement rule wired to real connections: a worker's calls stay on one connection
// while it keeps up, with others open and idle beside it; once the server's pace says a new
// statement would wait past Options::spread_after, calls go on another connection, opened for
// them. (Issue 69, item 17; the rule itself: placement_test.cc.)
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "pg_testing.h"
#include "spindle/fiber/runtime.h"

using namespace std::chrono_literals;
using namespace spindle;
using spindle::testing::pg_options;

namespace {

// The backend process that answered each of `calls` statements made by `callers` fibers at once.
std::set<int> backends_of(pg::Database& db, int callers, int calls) {
  std::set<int> pids;
  std::vector<JoinHandle<void>> fibers;
  for (int i = 0; i < callers; ++i) {
    fibers.push_back(spawn([&] {
      for (int j = 0; j < calls; ++j) {
        auto r = db.query("SELECT pg_backend_pid()", {}, Deadline::after(10s));
        ASSERT_TRUE(r.has_value()) << r.error().message;
        pids.insert(*r->get<int>(0, 0));
      }
    }));
  }
  for (auto& f : fibers) f.join();
  return pids;
}

}  // namespace

TEST(PgSpread, CallersShareOneConnectionWhileItKeepsUpThoughOthersAreIdle) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Options options = pg_options(*postgres, 4);
  options.spread_after = std::chrono::seconds(10);  // it keeps up, whatever the machine's load
  pg::Database db(runtime, options);
  runtime.block_on([&] {
    // 64 callers waiting at once open connections for themselves; then every statement goes
    // on the first, though the others are open and idle.
    auto pids = backends_of(db, 64, 20);
    ASSERT_GE(db.stats().open, 2u) << "no idle connection to resist";
    EXPECT_EQ(pids.size(), 1u);
    pids = backends_of(db, 64, 20);
    EXPECT_EQ(pids.size(), 1u);
  });
}

TEST(PgSpread, CallsSpreadOnceTheServersPaceSaysTheyWouldWaitTooLong) {
  REQUIRE_POSTGRES(postgres);
  Runtime runtime(RuntimeOptions{.workers = 1});
  pg::Options options = pg_options(*postgres, 4);
  options.spread_after = std::chrono::milliseconds(1);
  pg::Database db(runtime, options);
  runtime.block_on([&] {
    // 5 ms a statement on the first connection: a second statement behind one would wait
    // longer than 1 ms, so the pool opens another and the calls after that go on it.
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(db.query("SELECT pg_sleep(0.005)", {}, Deadline::after(5s)).has_value());
    }
    ASSERT_EQ(db.stats().open, 1u);
    std::set<int> pids;
    for (int round = 0; round < 20 && pids.size() < 2; ++round) {
      std::vector<pg::Query> started;
      for (int i = 0; i < 8; ++i) {
        started.push_back(db.start("SELECT pg_backend_pid() FROM pg_sleep(0.005)"));
      }
      for (auto& q : started) {
        auto r = q.result(Deadline::after(5s));
        ASSERT_TRUE(r.has_value()) << r.error().message;
        pids.insert(*r->get<int>(0, 0));
      }
    }
    EXPECT_GE(pids.size(), 2u);
    EXPECT_GE(db.stats().opened, 2u);
  });
}
